"""Bad input, property-based (hypothesis): the ``#COLOC`` parser, job scripts, the config loader, sbatch
option pass-through and coloc-report's filters and time windows. Never a traceback: either correct behaviour
or one ColocError line (the CLIs print it and exit non-zero). Nothing here can submit a job (no sbatch is run;
the cluster-side checks that nothing is submitted by mistake are in test_bad_scripts_cluster.py).
"""
from __future__ import annotations

import json
import math
import os
import shutil
import string
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from slurm_coloc import config as config_mod
from slurm_coloc.cli import report as report_cli
from slurm_coloc.errors import ColocError
from slurm_coloc.report.query import parse_when
from slurm_coloc.submit.directives import parse_coloc_pairs, parse_script
from slurm_coloc.submit.plan import build_plan
from slurm_coloc.submit.request import split_command_line

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                        HealthCheck.too_slow])
V1 = Path(__file__).resolve().parents[1] / "data" / "schema_v1"
NASTY = st.sampled_from(["", " ", "a b", "'", '"', "=", "a=b", "--x", "-", "\\", "$HOME", "`id`", "ü", "日本",
                         "\u202e", "\t", "x;rm -rf /", "%j", "#", "\x7f", "0", "-1", "1e999", "nan"])
TEXT = st.one_of(NASTY, st.text(max_size=40), st.text(alphabet=string.printable, max_size=40))
KEYS = ["model", "input", "input-dtype", "batch", "optimizer", "precision", "mem", "share", "kwarg.x",
        "kwarg.1",
        "bogus", ""]


def _one_line(exc: ColocError) -> None:
    line = exc.one_line()
    assert line and "\n" not in line and "Traceback" not in line


@FAST
@given(st.lists(st.tuples(st.sampled_from(KEYS), TEXT), max_size=6),
       st.sampled_from(["#COLOC ", "#COLOC", "#COLOC\t"]))
def test_coloc_pairs_parse_or_one_line_error(pairs, prefix) -> None:
    line = prefix + " ".join(f"{k}={v}" for k, v in pairs)
    try:
        plain, kwargs = parse_coloc_pairs([(1, line.strip())])
    except ColocError as exc:
        _one_line(exc)
        return
    assert set(plain) <= {"model", "input", "input-dtype", "batch", "optimizer", "precision", "mem", "share"}
    assert all(v for v in plain.values())


SCRIPT_BYTES = st.one_of(
    st.binary(max_size=300),
    st.builds(lambda body, crlf, bom: (b"\xef\xbb\xbf" if bom else b"") + body.encode().replace(
        b"\n", b"\r\n" if crlf else b"\n"),
        st.lists(st.one_of(st.just("#!/bin/bash"),
                           st.builds(lambda k, v: f"#COLOC {k}={v}", st.sampled_from(KEYS), TEXT),
                           st.builds(lambda v: f"#SBATCH {v}", TEXT), TEXT, st.just("python train.py")),
                 max_size=8).map("\n".join), st.booleans(), st.booleans()),
)


@FAST
@given(SCRIPT_BYTES)
def test_job_scripts_parse_or_one_line_error(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "job.sh"
    path.write_bytes(data)
    try:
        parsed = parse_script(str(path))
    except ColocError as exc:
        _one_line(exc)
        return
    assert "\r" not in "".join(line for _, line in parsed.sbatch_lines for line in line)  # CRLF handled
    assert not parsed.text.startswith("\ufeff")


def test_script_edge_cases(tmp_path: Path) -> None:
    crlf = tmp_path / "crlf.sh"
    crlf.write_bytes(b"#!/bin/sh\r\n#COLOC mem=6G\r\n#SBATCH -t 5\r\necho hi\r\n")
    p = parse_script(str(crlf))
    assert p.mem_override_mib == 6144 and p.sbatch_lines == ((3, ("-t", "5")),)
    bom = tmp_path / "bom.sh"
    bom.write_bytes(b"\xef\xbb\xbf#!/bin/sh\n#COLOC mem=2G\n")
    assert parse_script(str(bom)).mem_override_mib == 2048
    for name, data, words in [("nul.sh", b"#!/bin/sh\n\0echo\n", "NUL"),
                              ("big.sh", b"#!/bin/sh\n" + b"# pad\n" * (10 * 1024 * 1024 // 6), "larger"),
                              ("latin1.sh", b"#!/bin/sh\n# caf\xe9\n", "UTF-8")]:
        (tmp_path / name).write_bytes(data)
        try:
            parse_script(str(tmp_path / name))
            raise AssertionError(f"{name} accepted")
        except ColocError as exc:
            _one_line(exc)
            assert words in exc.one_line()


CONFIG_VALUES = st.one_of(TEXT, st.integers(), st.floats(allow_nan=True), st.booleans(), st.none(),
                          st.lists(st.integers(), max_size=2),
                          st.dictionaries(st.text(max_size=3), st.integers(),
                                                                               max_size=2))
CONFIG_KEYS = st.one_of(st.sampled_from([f.name for f in config_mod.fields(config_mod.Config)]),
                        st.text(max_size=8))


@FAST
@given(st.one_of(st.text(max_size=200), st.dictionaries(CONFIG_KEYS, CONFIG_VALUES, max_size=6).map(
    lambda d: yaml.safe_dump(d, allow_unicode=True))),
    st.dictionaries(st.sampled_from(["COLOC_GPU_MEM_GIB", "COLOC_HOOK_TIMEOUT_S", "COLOC_MPS_MODE",
                                     "COLOC_SAMPLER_INTERVAL_S", "COLOC_MPS_KEEP_WARM"]), TEXT, max_size=3))
def test_config_loads_or_one_line_error(tmp_path: Path, text: str, env: dict) -> None:
    path = tmp_path / "coloc.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass") if "\ud800" not in text else None
    assume(path.exists())
    env = {k: v for k, v in env.items() if "\0" not in v}
    try:
        cfg = config_mod.load(str(path), environ=env)
    except ColocError as exc:
        _one_line(exc)
    else:
        assert cfg.hook_timeout_s > 0 and math.isfinite(cfg.hook_timeout_s) and 1 <= cfg.gpu_mem_gib <= 4096
    fallback = config_mod.load_fallback(str(path), environ=env)  # hooks' best effort never raises
    assert isinstance(fallback, config_mod.Config)


OPTS = st.lists(st.one_of(
    st.builds(lambda n, v: (f"--{n}={v}",),
              st.sampled_from(["job-name", "comment", "output", "time", "constraint",
                                                              "export", "mail-user"]), TEXT),
    st.builds(lambda n, v: (f"--{n}", v),
              st.sampled_from(["job-name", "comment", "output", "chdir", "account"]),
              TEXT.filter(lambda v: not v.startswith("-") or v == "-")),
    st.builds(lambda v: ("-J", v), TEXT.filter(lambda v: not v.startswith("-"))),
    st.just(("--requeue",)), st.just(("--parsable",))), max_size=5)


@FAST
@given(OPTS, st.lists(TEXT, max_size=4))
def test_sbatch_options_and_script_args_pass_through_verbatim(tmp_path: Path, opts, args) -> None:
    script = tmp_path / "t.sh"
    script.write_text("#!/bin/sh\n#COLOC mem=3G\necho hi\n")
    argv = [w for o in opts for w in o] + [str(script), *args]
    cfg = config_mod.Config(state_dir=str(tmp_path / "s"))
    try:
        cmd = split_command_line(argv)
        parsed = parse_script(cmd.script)
        plan = build_plan(cmd, parsed, cfg, spank=False)
    except ColocError as exc:
        _one_line(exc)
        return
    out = plan.argv(str(script))
    words = [w for o in opts if not o[0].startswith("--comment") for w in o]
    pos = 0
    for w in words:  # every user word appears, in order, unchanged
        pos = out.index(w, pos) + 1
    comments = [o[0][len("--comment="):] if len(o) == 1 else o[1] for o in opts
                if o[0].startswith("--comment")]
    final = [w for w in out if w.startswith("--comment=")]
    assert len(final) == 1 and final[0].startswith("--comment=" + (comments[-1] + " " if comments
                                                                   and comments[-1]
                                                                     else "")), (comments, final)
    assert out[-len(args) - 1:] == [str(script), *args] if args else out[-1] == str(script)
    assert plan.shards == 3 + 1 or plan.shards == 3  # 3 GiB override -> shards (headroom rule)


REPORT_ARGS = st.lists(st.one_of(
    st.builds(lambda v: ["--since", v], TEXT), st.builds(lambda v: ["--until", v], TEXT),
    st.builds(lambda v: ["--user", v], TEXT), st.builds(lambda v: ["--node", v], TEXT),
    st.builds(lambda v: ["--job", v], st.one_of(TEXT, st.integers().map(str))),
    st.builds(lambda v: ["--sort", v], TEXT), st.just(["--desc"]), st.just(["--json"]), st.just(["--csv"])),
    max_size=4).map(lambda parts: [w for p in parts for w in p])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["jobs", "users", "gpus", "nodes", "cluster"]), REPORT_ARGS)
def test_report_filters_never_traceback(report_state: Path, view: str, args) -> None:
    res = CliRunner().invoke(report_cli.cli, [view, "--config", str(report_state / "c.yaml"),
                                                              *args])
    assert res.exit_code in (0, 2), (args, res.exit_code, res.stderr, repr(res.exception))
    assert res.exception is None or isinstance(res.exception, SystemExit), (args, repr(res.exception))
    assert "Traceback" not in (res.stdout + res.stderr)
    if res.exit_code == 2:
        assert res.stderr.strip().count("\n") <= 3, res.stderr  # click usage (3 lines) or our one line
    if res.exit_code == 0 and "--json" in args and "--csv" not in args:
        json.loads(res.stdout)


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(REPORT_ARGS)
def test_report_plot_filters_never_traceback(report_state: Path, args) -> None:
    """``plot`` builds time buckets from the window: found ``--since @nan`` -> sqlite3 traceback (fixed)."""
    args = [a for a in args if a not in ("--json", "--csv", "--sort", "--desc")]
    res = CliRunner().invoke(report_cli.cli, ["plot", "--config", str(report_state / "c.yaml"), "--out",
                                              str(report_state / "plots"), *args])
    assert res.exit_code in (0, 2) and (res.exception is None or isinstance(res.exception, SystemExit)), \
        (args, res.stderr, repr(res.exception))


def test_report_plot_nan_window_is_one_line_error(report_state: Path) -> None:
    res = CliRunner().invoke(report_cli.cli, ["plot", "--config", str(report_state / "c.yaml"), "--out",
                                              str(report_state / "plots"), "--since", "@nan"])
    assert res.exit_code == 2 and "invalid time '@nan'" in res.stderr and "Traceback" not in res.output


@settings(max_examples=300, deadline=None)
@given(st.one_of(TEXT, st.builds(lambda n, u: f"{n}{u}", st.one_of(st.integers(), st.floats()).map(str),
                                 st.sampled_from(["s", "m", "h", "d", "w", "", "x"])),
                 st.builds(lambda n: f"@{n}", st.one_of(st.integers(), st.floats()).map(str))))
def test_time_windows_parse_or_one_line_error(text: str) -> None:
    try:
        value = parse_when(text, now=1.8e9)
    except ColocError as exc:
        _one_line(exc)
        return
    assert value is None or math.isfinite(value)


def _report_state(tmp: Path) -> Path:
    state = tmp / "state"
    (state / "nodes").mkdir(parents=True, exist_ok=True)
    shutil.copy(V1 / "ctld.db", state / "ctld.db")
    shutil.copy(V1 / "n1.db", state / "nodes" / "n1.db")
    (tmp / "c.yaml").write_text(f"state_dir: {state}\nlog_dir: {tmp / 'log'}\nrun_dir: {tmp / 'run'}\n")
    return tmp


import pytest  # noqa: E402


@pytest.fixture(scope="module")
def report_state(tmp_path_factory) -> Path:
    return _report_state(tmp_path_factory.mktemp("report"))


def test_report_state_fixture_is_reported(report_state: Path) -> None:
    res = CliRunner().invoke(report_cli.cli, ["jobs", "--config", str(report_state / "c.yaml"),
                                                              "--json", "--since", "2026-01-01"])
    assert res.exit_code == 0, res.stderr
    assert {j["job_id"] for j in json.loads(res.stdout)["jobs"]} >= {101, 102, 103}
    assert os.geteuid() == 0  # root sees every user's jobs here; test_security checks a user does not
