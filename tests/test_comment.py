"""The typed job comment (``comment.JobComment``): every known key checked, unknown keys ignored, a bad
comment is no annotation with one log line; the placer's features and predictions stay finite (N3
and N10), and placer history is per user (N10; real SQLite databases).
"""
from __future__ import annotations

import ast
import dataclasses
import json
import logging
import math
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_coloc import config as config_mod
from slurm_coloc.comment import (
    NO_COMMENT,
    SUBMISSION_KEYS,
    CommentSpec,
    JobComment,
    build_comment,
    job_signature,
    parse_comment,
)
from slurm_coloc.comment.values import BOUNDS, MAX_INPUT_ELEMENTS
from slurm_coloc.placement import intensity
from slurm_coloc.placement.daemon import read_history
from slurm_coloc.placement.policies import Activity
from slurm_coloc.store.db import open_ctld_db, open_node_db

jc = JobComment.from_fields  # a coloc JSON object as the placer reads it

SPEC = {"model": "resnet50", "kwargs": {"num_classes": 10}, "input_shape": [3, 224, 224], "batch_size": 32,
        "precision": "fp32", "optimizer": "adam", "input_dtype": "float32"}
SUBMITTED = {"v": 1, "mode": "shard", "shards": 4, "gpus": None, "mem_mib": 3500, "method": "analytic",
             "gpu_model": "NVIDIA H100 80GB HBM3", "sha256": "0f" * 32, "spec": SPEC,
             "argv": ["--epochs", "2"],
             "flops_per_step": 123_000_000_000}
BIG_INT = "9" * 401  # N3: 'int too large to convert to float' in every placer round


def test_what_coloc_sbatch_writes_reads_back_whole() -> None:
    c = JobComment.read(build_comment(SUBMITTED, "my run"), 1)
    assert c.annotated and c.shards == 4 and c.spec is not None and c.spec.input_shape == (3, 224, 224)
    assert c.to_json() == {k: v for k, v in SUBMITTED.items() if v is not None}
    assert c.signature() == job_signature(SUBMITTED) and c.signature() is not None
    placed = JobComment.read(build_comment({**SUBMITTED, "place": True}), 2)
    assert placed.placed_shards == 4 and c.placed_shards is None


@pytest.mark.parametrize("text", [
    'coloc:{"place":true,"shards":2,"spec":{"batch_size":1,"input_shape":[' + BIG_INT + ']}}',
    'coloc:{"place":true,"shards":2,"flops_per_step":NaN}',
    'coloc:{"place":true,"shards":2,"flops_per_step":1e999}',
    'coloc:{"place":true,"shards":2,"flops_per_step":-1}',
    'coloc:{"place":true,"shards":' + BIG_INT + '}',
    'coloc:{"place":true,"shards":65537}',
    'coloc:{"place":true,"shards":0}',
    'coloc:{"place":"yes","shards":2}',
    'coloc:{"place":true,"shards":true}',
    'coloc:{"place":true,"shards":2,"spec":{"batch_size":1048577,"input_shape":[3]}}',
    'coloc:{"place":true,"shards":2,"spec":{"batch_size":1,"input_shape":[1,2,3,4,5,6,7,8,9]}}',
    'coloc:{"place":true,"shards":2,"spec":{"batch_size":1,"input_shape":[16777216,16777216,16777216]}}',
    'coloc:{"place":true,"shards":2,"spec":{"batch_size":1,"input_shape":[]}}',
    'coloc:{"place":true,"shards":2,"spec":{"model":"' + "m" * 257 + '"}}',
    'coloc:{"place":true,"shards":2,"spec":{"kwargs":{"a":NaN}}}',
    'coloc:{"place":true,"shards":2,"spec":{"kwargs":' + '{"a":' * 20 + '1' + '}' * 20 + '}}',
    'coloc:{"place":true,"shards":2,"spec":[1]}',
    'coloc:{"place":true,"shards":2,"argv":["a\\u0000b"]}',
    'coloc:{"place":true,"shards":2,"mode":"root"}',
    'coloc:{"place":true,"shards":2,"sha256":"../../etc"}',
    'coloc:{"place":true,"shards":2,"retry_of":-3}',
    'coloc:{"place":true,"shards":2,"mem_mib":100000000000000000000}',
    'coloc:{"place":true,"shards":2', 'coloc:{' + '[' * 100000,
    'coloc:{"shards":2,"x":"' + "y" * 20000 + '"}',
])
def test_a_comment_that_breaks_the_protocol_is_no_annotation_with_one_log_line(text: str, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="slurm_coloc.comment")
    job = hash(text) % 1_000_000 + 1000
    assert JobComment.read(text, job) is NO_COMMENT
    assert JobComment.read(text, job) is NO_COMMENT  # read again (the placer's next round): no second line
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith(f"job {job}: coloc comment ignored (") and \
        lines[0].endswith("treated as an unannotated job"), lines
    assert intensity.demand(JobComment.read(text, job), {}, intensity.load_calibration())[1] == "predicted"


def test_unknown_keys_are_ignored_whatever_they_hold() -> None:
    text = ('coloc:{"place":true,"shards":2,"future":[' + BIG_INT + ',NaN,Infinity,1e999,{"x":[[[]]]}],'
            '"spec":{"batch_size":4,"input_shape":[8],"new_field":-1e999}}')
    c = JobComment.read(text, 3)
    assert c.placed_shards == 2 and c.spec is not None and c.spec.batch_size == 4
    assert "future" not in c.to_json() and "new_field" not in json.dumps(c.to_json())


def test_no_coloc_json_is_no_annotation_without_a_log_line(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="slurm_coloc.comment")
    for text in (None, "", "just my words", "oom-retry-of-5", "coloc:", "coloc:[1,2]"):
        assert JobComment.read(text, 4) is NO_COMMENT
    assert not caplog.records


def test_the_largest_valid_comment_predicts_finite_activity() -> None:
    """N10: a huge spec gave a predicted SM activity of NaN; at the bounds every figure stays finite."""
    cal = intensity.load_calibration()
    dims = [1 << 20, 1 << 20]  # 2^40 elements: MAX_INPUT_ELEMENTS
    assert math.prod(dims) == MAX_INPUT_ELEMENTS
    for data in ({"spec": {"batch_size": BOUNDS["batch_size"][1], "input_shape": dims}},
                 {"flops_per_step": BOUNDS["flops_per_step"][1]}, {"flops_per_step": 0},
                 {"bytes_per_step": 1e18, "spec": {"batch_size": 1, "input_shape": [1]}}):
        a = intensity.predict(intensity.features(jc(data)), cal)
        assert all(math.isfinite(v) and 0 <= v <= 1 for v in (a.smact, a.smocc, a.drama)), (data, a)


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                     lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids,
                                                                               max_size=4),
                     max_leaves=20)
_keys = st.sampled_from(["v", "mode", "shards", "gpus", "mem_mib", "method", "gpu_model", "sha256", "spec",
                         "argv",
                         "flops_per_step", "bytes_per_step", "place", "retry_of", "other"])
_spec = st.dictionaries(st.sampled_from(["model", "kwargs", "input_shape", "batch_size", "precision",
                                         "optimizer",
                                         "input_dtype", "kwargs_chars"]),
                        _json | st.lists(st.integers(min_value=-5, max_value=1 << 30), max_size=9),
                        max_size=8)


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(st.dictionaries(_keys, _json | st.integers() | _spec, max_size=10))
def test_any_json_gives_a_bounded_annotation_or_none(data: dict) -> None:
    text = "coloc:" + json.dumps(data)  # floats nan/inf are written as NaN/Infinity, as a user could
    c = JobComment.read(text, 7)
    a = intensity.predict(intensity.features(c), intensity.load_calibration())
    assert all(math.isfinite(v) for v in (a.smact, a.smocc, a.drama))
    if not c.annotated:
        return
    for key in ("v", "shards", "gpus", "mem_mib", "flops_per_step", "bytes_per_step", "retry_of"):
        value = getattr(c, key)
        assert value is None or (type(value) is int and BOUNDS[key][0] <= value <= BOUNDS[key][1])
    if c.spec is not None and c.spec.input_shape is not None:
        assert 1 <= len(c.spec.input_shape) <= 8 and math.prod(c.spec.input_shape) <= MAX_INPUT_ELEMENTS
    assert JobComment.read("coloc:" + json.dumps(c.to_json()),
                           8) == c  # what root records reads back the same


def test_placer_history_is_per_user(tmp_path: Path) -> None:
    """N10: colocuser2 (uid 2002) runs jobs with colocuser's signature and records a saturating history for
    it; colocuser's job (uid 2001) is still predicted from its own features, and colocuser2's own job from its
    history."""
    (tmp_path / "coloc.yaml").write_text(f"state_dir: {tmp_path / 'state'}\n")
    cfg = config_mod.load(str(tmp_path / "coloc.yaml"), environ={})
    cfg.node_db_dir.mkdir(parents=True)
    now = time.time()
    ctld = open_ctld_db(cfg.ctld_db_path)
    coloc = json.dumps({"spec": SPEC})
    ctld["jobs"].insert_all([{"job_id": 10, "uid": 2002, "end_ts": now - 10, "coloc_json": coloc,
                              "state": "COMPLETED"},
                             {"job_id": 11, "uid": None, "end_ts": now - 10, "coloc_json": coloc,
                              "state": "COMPLETED"}])
    node = open_node_db(cfg.node_db_path("n1"))
    node["gpu_samples"].insert_all([{"ts": now - 100 + k, "gpu_index": g, "smact_pct": 99.0,
                                     "smocc_pct": 90.0,
                                     "dram_bw_pct": 90.0, "mem_used_mib": 10.0, "n": 1, "res_s": 1.0}
                                    for k in range(80) for g in (0, 1)])
    node["job_runs"].insert_all([{"job_id": j, "node": "n1", "gpus": str(g), "start_ts": now - 100,
                                  "end_ts": now - 20} for j, g in ((10, 0), (11, 1))])
    node["job_summaries"].insert_all([{"job_id": j, "node": "n1", "smact_mean": 99.0, "smocc_mean": 90.0}
                                      for j in (10, 11)])
    history = read_history(cfg)
    sig = job_signature({"spec": SPEC})
    assert set(history) == {(2002, sig)}  # the job without a recorded uid steers nobody
    cal = intensity.load_calibration()
    own = intensity.predict(intensity.features(jc({"spec": SPEC})), cal)
    assert intensity.demand(jc({"spec": SPEC}), history, cal, uid=2001) == (own, "predicted")
    theirs, source = intensity.demand(jc({"spec": SPEC}), history, cal, uid=2002)
    assert source == "history" and theirs.smact == pytest.approx(0.99) and theirs != own
    assert Activity(0.99, 0.9, 0.9) == theirs


@pytest.mark.parametrize("flops, kept", [(10 ** 300, None), (-5, None), (True, None), (10 ** 12, 10 ** 12)])
def test_the_probes_flop_count_enters_the_comment_only_within_its_range(flops, kept) -> None:
    """Fourth campaign: a program under the probe wrote its own result file with ``flops_per_step`` 10^300;
    the count went into the job comment, which then broke every reader (before the typed comment: the placer's
    round, and ``--explain``'s GFLOP line raised OverflowError). Out of range it is dropped at the source."""
    from slurm_coloc.probe.probe import estimate_from_result

    est = estimate_from_result({"status": "ok", "peak_allocated_b": 10 ** 9, "peak_reserved_b": 10 ** 9,
                                "flops_per_step": flops})
    assert est.flops_per_step == kept and est.mem_mib > 0


# -- the one writer: what JobComment writes, JobComment.read gives back ---------------------------

PACKAGE = Path(__file__).resolve().parents[1] / "slurm_coloc"
_TAG_TEXT = ("--comment=", "coloc:{", "oom-retry-of-")
_TAG_NAMES = {"COMMENT_TAG", "RETRY_TAG", "COMMENT_OPTION"}
_TEXT_WRITERS = {"build_comment", "fit_comment"}


def _spec() -> CommentSpec:
    return CommentSpec(model="resnet50", kwargs={"num_classes": 10}, input_shape=(3, 224, 224),
                       input_dtype="float32", batch_size=32, optimizer="adam", precision="fp32")


def _read_back(c: JobComment) -> JobComment:
    text = c.comment_arg()
    assert text == "--comment=" + c.to_comment()
    back = JobComment.read(c.to_comment(), 9)
    assert back == c and back.user_text == c.user_text and back.annotated, (c, back)
    return back


def test_the_oom_rerun_writes_its_tag_and_json_and_reads_back() -> None:
    c = JobComment.oom_rerun(41, 80, 81920)
    assert c.to_comment() == ('oom-retry-of-41 coloc:{"mem_mib":81920,"method":"oom-retry",'
                              '"mode":"whole-gpu","retry_of":41,"shards":80,"v":1}')
    back = _read_back(c)
    assert back.retry_of == 41 and back.user_text == "oom-retry-of-41" and back.to_comment() == c.to_comment()


def test_coloc_sbatchs_comment_writes_unknown_keys_as_null_and_reads_back() -> None:
    c = JobComment.submission(mode="shard", shards=4, mem_mib=3500, method="analytic", sha256="0f" * 32,
                              spec=_spec(), flops_per_step=10 ** 12, argv=["--epochs", "2"],
                              user_text="my run")
    text = c.to_comment()
    assert text.startswith("my run coloc:{") and '"gpus":null' in text and '"gpu_model":null' in text
    assert json.loads(text[len("my run coloc:"):]) == {**dict.fromkeys(SUBMISSION_KEYS), **c.to_json()}
    assert parse_comment(text) == c.comment_json() and c.to_json()["spec"]["input_shape"] == [3, 224, 224]
    back = _read_back(c)
    assert back.gpus is None and back.spec == _spec() and back.argv == ("--epochs", "2") and back.v == 1
    bare = JobComment.submission(mode="whole-gpu", shards=80)
    assert bare.argv is None and bare.user_text is None and _read_back(bare).to_comment() == (
        'coloc:{"mode":"whole-gpu","shards":80,"v":1}')  # read back: nothing unknown is written as null
    assert bare.to_comment() == ('coloc:{"gpu_model":null,"gpus":null,"mem_mib":null,"method":null,'
                                 '"mode":"whole-gpu","sha256":null,"shards":80,"spec":null,"v":1}')


def test_a_placer_submission_keeps_the_users_text_and_adds_place() -> None:
    read = JobComment.read('mine coloc:{"mode":"shard","shards":4,"v":1}', 3)
    placed = read.with_place()
    assert placed.comment_arg() == '--comment=mine coloc:{"mode":"shard","place":true,"shards":4,"v":1}'
    assert _read_back(placed).placed_shards == 4 and read.placed_shards is None


def test_fitting_drops_keys_in_order_and_keeps_the_users_text_whole() -> None:
    from slurm_coloc.submit.plan import comment_steps

    c = JobComment.submission(mode="shard", shards=4, mem_mib=3000, method="combined", gpu_model="H100",
                              sha256="a" * 64, spec=dataclasses.replace(_spec(), kwargs={"tag": "x" * 900}),
                              argv=["a"] * 10, user_text="run 7")
    arg, dropped = c.fitted_arg(comment_steps(["a"] * 10))
    assert arg is not None and arg.startswith("--comment=run 7 coloc:{")
    assert len(arg) - len("--comment=") <= 1024
    assert dropped == ["the script arguments (Slurm's command line keeps them)",
                       "the model's kwargs (they stay in the script's #COLOC lines)"]
    back = JobComment.read(arg[len("--comment="):], 10)
    assert back.argv is None and back.spec is not None and back.spec.kwargs == {}
    assert back.spec.kwargs_chars == len(json.dumps({"tag": "x" * 900})) and back.mem_mib == 3000
    alone, dropped = dataclasses.replace(c, user_text="u" * 1000).fitted_arg(comment_steps([]))
    assert alone == "--comment=" + "u" * 1000 and dropped[-1] == "the whole coloc JSON"
    assert dataclasses.replace(c, user_text=None).fitted_arg([], limit=10) == (None, ["the whole coloc JSON"])


def _builds_comment_text(node: ast.AST) -> bool:
    """Whether ``node`` assembles a string (an f-string or a ``+``) with a job comment's tag in it, or calls
    a comment text writer."""
    if isinstance(node, ast.Call):
        f = node.func
        return (f.id if isinstance(f, ast.Name) else getattr(f, "attr", "")) in _TEXT_WRITERS
    if isinstance(node, ast.JoinedStr):
        parts: list = list(node.values)
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        parts = [node.left, node.right]
    else:
        return False
    for part in parts:
        for sub in ast.walk(part):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str) \
                    and any(t in sub.value for t in _TAG_TEXT):
                return True
            if (isinstance(sub, ast.Name) and sub.id in _TAG_NAMES) \
                    or (isinstance(sub, ast.Attribute) and sub.attr in _TAG_NAMES):
                return True
    return False


def _comment_builders(source: str, name: str) -> list:
    return [f"{name}:{n.lineno}" for n in ast.walk(ast.parse(source, name)) if _builds_comment_text(n)]


def test_no_module_outside_comment_builds_comment_text() -> None:
    """``JobComment`` is the one writer of a job comment: no other module puts ``--comment=``, ``coloc:{``
    or ``oom-retry-of-`` (or the tags' names) into a string it assembles, or calls ``build_comment`` /
    ``fit_comment``."""
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) if "comment" not in path.relative_to(PACKAGE).parts
             for hit in _comment_builders(path.read_text(), path.relative_to(PACKAGE).as_posix())]
    assert found == [], "write the job comment through comment.JobComment: " + ", ".join(found)


@pytest.mark.parametrize("source", [
    'args.append(f"--comment={RETRY_TAG}{job_id} {COMMENT_TAG}" + json.dumps(info))',
    'args[c] = "--comment=" + build_comment({**coloc.to_json(), "place": True}, user)',
    'args.append("--comment=" + text)',
    'text = COMMENT_TAG + json.dumps(data)',
    'text = f"oom-retry-of-{job_id} coloc:{data}"',
])
def test_the_check_finds_each_way_comment_text_was_built(source: str) -> None:
    assert _comment_builders(source, "old.py")
