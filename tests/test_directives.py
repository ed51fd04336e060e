"""#COLOC / #SBATCH parsing (pure) including property-based checks."""
from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_coloc.errors import DirectiveError
from slurm_coloc.submit.directives import header_lines, parse_coloc_pairs, parse_input_shape, parse_script


def write(tmp_path, text: str, name: str = "job.sh"):
    p = tmp_path / name
    p.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return str(p)


def test_full_spec(tmp_path):
    path = write(tmp_path,
                 "#!/bin/bash\n#SBATCH -t 10\n#COLOC model=torchvision.models:resnet18 kwarg.num_classes=10\n"
                           "#COLOC input=3x32x32 batch=128 optimizer=sgd-momentum precision=amp-fp16\npython "
                           "x.py\n")
    ps = parse_script(path)
    assert ps.spec is not None
    assert ps.spec.model == "torchvision.models:resnet18"
    assert ps.spec.kwargs == {"num_classes": 10}
    assert ps.spec.input_shape == (3, 32, 32)
    assert (ps.spec.batch_size, ps.spec.optimizer, ps.spec.precision) == (128, "sgd-momentum", "amp-fp16")
    assert ps.sbatch_lines == ((2, ("-t", "10")),)
    assert len(ps.sha256) == 64


def test_directives_after_first_command_are_ignored(tmp_path):
    ps = parse_script(write(tmp_path,
                            "#!/bin/bash\n#COLOC mem=2G\necho hi\n#COLOC model=a:b input=1 batch=1\n"))
    assert ps.spec is None and ps.coloc == {"mem": "2G"}
    assert ps.late_coloc_lines == (4,)  # coloc-sbatch warns about them (test_sbatch_probe.py)


def test_python_style_kwargs(tmp_path):
    """``kwarg.bias=False`` is the boolean, not the string 'False' (JSON ``false`` already was)."""
    ps = parse_script(write(tmp_path,
                            "#!/bin/bash\n#COLOC model=torch.nn:Linear kwarg.bias=False kwarg.x=None "
                                      "kwarg.y=True kwarg.k=(3,3) kwarg.n=resnet kwarg.j=false\n"
                                      "#COLOC input=4 batch=2\ntrue\n"))
    assert ps.spec.kwargs == {"bias": False, "x": None, "y": True, "k": [3, 3], "n": "resnet", "j": False}


@pytest.mark.parametrize("text, dims",
                         [("1,28,28", (1, 28, 28)), ("3x224x224", (3, 224, 224)), ("512", (512,))])
def test_input_shape_commas_like_the_cli(tmp_path, text, dims):
    ps = parse_script(write(tmp_path, f"#!/bin/bash\n#COLOC model=m:f input={text} batch=2\ntrue\n"))
    assert ps.spec.input_shape == dims


def test_python_directive_is_a_known_key(tmp_path):
    ps = parse_script(write(tmp_path, "#!/bin/bash\n#COLOC python=/opt/venv/bin/python\npython train.py\n"))
    assert ps.coloc == {"python": "/opt/venv/bin/python"} and ps.spec is None


def test_crlf_and_bom(tmp_path):
    text = "\ufeff#!/bin/bash\r\n#COLOC model=m:f input=4 batch=2\r\n#COLOC mem=3G share=shard\r\ntrue\r\n"
    ps = parse_script(write(tmp_path, text))
    assert ps.spec.model == "m:f" and ps.mem_override_mib == 3072


@pytest.mark.parametrize("line, fragment", [
    ("#COLOC model", "expects key=value"),
    ("#COLOC colour=blue", "unknown #COLOC key 'colour'"),
    ("#COLOCmodel=a:b", "malformed directive"),
    ("#COLOC model=nocolon input=1 batch=1", "module:callable"),
    ("#COLOC model=a:b input=1", "needs batch="),
    ("#COLOC model=a:b input=3xx2 batch=1", "expected sizes"),
    ("#COLOC model=a:b input=3 batch=0", "batch='0'"),
    ("#COLOC model=a:b input=3 batch=1 optimizer=lbfgs", "optimizer='lbfgs'"),
    ("#COLOC mem=lots", "invalid memory size"),
    ("#COLOC share=maybe", "share='maybe'"),
    ("#COLOC input=3 batch=2", "no model="),
    ("#COLOC model='a:b", "cannot split"),
    ("#COLOC kwarg.1x=3", "not a Python identifier"),
])
def test_malformed_lines(tmp_path, line, fragment):
    with pytest.raises(DirectiveError) as err:
        parse_script(write(tmp_path, f"#!/bin/sh\n{line}\ntrue\n"))
    assert fragment in err.value.one_line()
    assert "\n" not in err.value.one_line()


def test_bad_files(tmp_path):
    with pytest.raises(DirectiveError, match="does not exist"):
        parse_script(str(tmp_path / "missing.sh"))
    with pytest.raises(DirectiveError, match="not a regular file"):
        parse_script(str(tmp_path))
    with pytest.raises(DirectiveError, match="NUL bytes"):
        parse_script(write(tmp_path, b"#!/bin/sh\n\0\n"))
    with pytest.raises(DirectiveError, match="not UTF-8"):
        parse_script(write(tmp_path, b"#!/bin/sh\n#\xff\xfe\n"))
    big = write(tmp_path, "#" * (4 * 1024 * 1024 + 10))
    with pytest.raises(DirectiveError, match="larger than"):
        parse_script(big)


def test_unreadable_script(tmp_path):
    import os
    p = write(tmp_path, "#!/bin/sh\ntrue\n")
    os.chmod(p, 0)
    if os.geteuid() == 0:  # root reads anyway; check as the test user through a fresh process
        pytest.skip("root can read mode-0 files; covered by the integration test as colocuser")
    with pytest.raises(DirectiveError, match="cannot read"):
        parse_script(p)


keys = st.sampled_from(["model", "input", "batch", "optimizer", "precision", "mem", "share", "kwarg.x"])
values = st.text(alphabet=string.ascii_letters + string.digits + ":._-x", min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(keys, values), min_size=1, max_size=6))
def test_pairs_roundtrip(pairs):
    """Whatever valid key=value tokens are written, the parser returns the last value per key."""
    line = "#COLOC " + " ".join(f"{k}={v}" for k, v in pairs)
    plain, kwargs = parse_coloc_pairs([(1, line)])
    expected = {}
    for k, v in pairs:
        expected[k] = v
    for k, v in expected.items():
        if k == "kwarg.x":
            json = __import__("json")  # compared as JSON text: NaN is a float that equals nothing
            assert str(kwargs["x"]) == v or json.dumps(kwargs["x"]) == json.dumps(json.loads(v))
        else:
            assert plain[k] == v


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_header_never_crashes(text):
    """Any text: either parsed or a DirectiveError, never another exception."""
    lines = [(i, ln.strip()) for i, ln in enumerate(text.splitlines(), 1)]
    try:
        parse_coloc_pairs([(i, "#COLOC " + ln) for i, ln in lines])
    except DirectiveError as exc:
        assert "\n" not in exc.one_line()


@given(st.lists(st.integers(1, 4096), min_size=1, max_size=4))
def test_input_shape_roundtrip(dims):
    assert parse_input_shape("x".join(map(str, dims))) == tuple(dims)


def test_header_stops_at_command():
    assert [no for no, _ in header_lines("#!/bin/sh\n\n# c\nrun\n#SBATCH -t 1\n")] == [1, 2, 3]
