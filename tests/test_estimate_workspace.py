"""cuDNN workspace replay: convolution call keys, the measured table's lookup, the trace."""
from __future__ import annotations

import csv
import gzip
import io
import os

import pytest

from slurm_coloc.errors import EstimateError
from slurm_coloc.estimate import workspace
from slurm_coloc.estimate.convcall import ConvCall, parse_key
from slurm_coloc.estimate.spec import ModelSpec
from slurm_coloc.estimate.workspace import WorkspaceModel

MIB = 1 << 20


def _call(n: int = 32, cin: int = 64, cout: int = 64, hw: int = 56, k: int = 3, backward: bool = False,
          dtype: str = "float32", groups: int = 1) -> ConvCall:
    return ConvCall(backward, dtype, (n, cin, hw, hw), (cout, cin // groups, k, k), (1, 1), (k // 2, k // 2),
                    (1, 1), False, (0, 0), groups, (True, True, False) if backward else ())


def test_key_round_trips_and_names_the_layer():
    for c in (_call(), _call(backward=True, dtype="bfloat16"), _call(groups=64, cout=64, k=5)):
        assert parse_key(c.key) == c
    c = _call(n=8)
    assert c.key == "f|float32|8,64,56,56|64,64,3,3|1,1|1,1|1,1|0|0,0|1|-"
    assert c.geometry_key == _call(n=256).geometry_key
    assert c.with_batch(256) == _call(n=256)
    assert _call(backward=True).key.endswith("|110")


@pytest.mark.parametrize("bad", ["", "x|float32|1|1|1|1|1|0|0|1|-",
                                 "f|float64|1,1,1,1|1,1,1,1|1,1|0,0|1,1|0|0,0|1|-",
                                 "b|float32|1,1,1,1|1,1,1,1|1,1|0,0|1,1|0|0,0|1|11",
                                 "f|float32|a|1|1|1|1|0|0|1|-"])
def test_malformed_key_is_one_clear_error(bad):
    with pytest.raises(EstimateError, match="convolution key"):
        parse_key(bad)


def test_lookup_exact_interpolated_extrapolated_and_neighbour():
    m = WorkspaceModel.from_rows([(_call(n=16).key, 100 * MIB), (_call(n=64).key, 400 * MIB),
                                  (_call(n=32, cin=128, cout=128).key, 50 * MIB)])
    assert m.bytes_for(_call(n=16)) == 100 * MIB
    assert m.bytes_for(_call(n=32)) == 200 * MIB  # linear between 16 and 64
    assert m.bytes_for(_call(n=128)) == 800 * MIB  # proportional above the largest measured batch
    assert m.bytes_for(_call(n=4)) == 100 * MIB  # the smallest measured batch's figure below it
    # A layer in no table: nearest neighbours of the same kind, scaled by tensor size, largest taken.
    near = m.bytes_for(_call(n=32, cin=96, cout=96))
    assert 50 * MIB / 4 <= near <= 800 * MIB * 4 and near > 0
    # Another kind (backward, bf16) has no neighbours: nothing is invented.
    assert m.bytes_for(_call(backward=True, dtype="bfloat16")) == 0


def test_neighbour_scaling_is_bounded():
    m = WorkspaceModel.from_rows([(_call(n=1, hw=8).key, 10 * MIB)])
    assert m.bytes_for(_call(n=256, hw=224)) <= 40 * MIB  # at most MAX_SCALE x the neighbour


def test_table_file_excludes_only_calls_measured_for_the_left_out_sources(tmp_path, monkeypatch):
    path = tmp_path / "t.csv.gz"
    buf = io.StringIO()
    csv.writer(buf).writerows([("key", "ws_b", "srcs"), (_call(n=16).key, 100 * MIB, "hopper:vgg"),
                               (_call(n=64).key, 400 * MIB, "hopper:vgg;random"),
                               (_call(n=8).key, "", "hopper:vgg")])
    path.write_bytes(gzip.compress(buf.getvalue().encode()))
    rows = workspace.read_table(str(path))
    assert [r[1] for r in rows] == [100 * MIB, 400 * MIB]  # unmeasured rows are skipped
    monkeypatch.setattr(workspace, "TABLE_FILE", str(path))
    monkeypatch.setattr(workspace, "_CACHE", {})
    full, left_out = workspace.load(), workspace.load({"hopper:vgg"})
    assert full.bytes_for(_call(n=16)) == 100 * MIB
    assert _call(n=16).key not in left_out.exact and _call(n=64).key in left_out.exact
    (tmp_path / "bad.csv.gz").write_bytes(b"not gzip")
    with pytest.raises(EstimateError, match="workspace table"):
        workspace.read_table(str(tmp_path / "bad.csv.gz"))


@pytest.mark.slow
def test_shipped_table_parses_and_covers_both_directions():
    assert os.path.isfile(workspace.TABLE_FILE)  # the package ships it (pyproject.toml package-data)
    rows = workspace.read_table()
    assert len(rows) > 1000
    calls = [parse_key(k) for k, _, _ in rows]
    assert any(c.backward for c in calls) and any(not c.backward for c in calls)
    assert all(ws >= 0 for _, ws, _ in rows)


@pytest.mark.slow
def test_trace_records_convolutions_and_replays_their_workspace():
    from slurm_coloc.estimate.trace import trace_spec

    spec = ModelSpec(model="torchvision.models:resnet18", kwargs={"num_classes": 10}, input_shape=(3, 32, 32),
                     batch_size=8, optimizer="sgd")
    plain = trace_spec(spec)
    # 20 convolutions, forward and backward, two traced steps.
    assert len(plain.conv_calls) == 80
    assert sum(c.backward for c in plain.conv_calls) == 40
    stem_bwd = [c for c in plain.conv_calls if c.backward and c.input[1] == 3]
    assert stem_bwd and all(c.mask[:2] == (False, True) for c in stem_bwd)  # no grad for the input images
    zero = trace_spec(spec, workspace=lambda c: 0)
    assert (zero.peak_reserved_b, zero.peak_allocated_b) == (plain.peak_reserved_b, plain.peak_allocated_b)
    big = trace_spec(spec, workspace=lambda c: 512 * MIB if c.backward else 0)
    assert big.conv_workspace_max_b == 512 * MIB
    assert big.peak_allocated_b >= plain.peak_allocated_b + 400 * MIB
    assert big.peak_reserved_b >= plain.peak_reserved_b + 400 * MIB


def test_gpu_without_measured_table_gets_the_larger_multiplier():
    from slurm_coloc.estimate.combine import load_calibration, traced_estimate
    from slurm_coloc.estimate.spec import gpu_model

    cal = load_calibration()
    assert cal["form"] == "per-precision-jit"  # the shipped form (benchmarks/estimator/train.py)
    spec = ModelSpec(model="torchvision.models:resnet18", kwargs={"num_classes": 10}, input_shape=(3, 32, 32),
                     batch_size=64, optimizer="sgd")
    h100, a100 = traced_estimate(spec, "H100"), traced_estimate(spec, "A100")
    assert h100.detail["workspace_table"] == "measured"
    assert a100.detail["workspace_table"].startswith("proxy")
    reserved = h100.detail["analytic_mib"] - 612 - float(cal["libs_mib"])
    context_gap = gpu_model("A100").context_mib - gpu_model("H100").context_mib
    expected_gap = context_gap + reserved * (float(cal["amp_mult"]) - float(cal["analytic_mult"]))
    assert a100.mem_mib - h100.mem_mib == pytest.approx(expected_gap, abs=2)


@pytest.mark.parametrize("content", [b"not a zip", None])
def test_unusable_shipped_table_is_one_clear_error(tmp_path, monkeypatch, content):
    import numpy as np

    path = tmp_path / "conv_workspace_h100.npz"
    if content is None:  # a valid npz without the lookup arrays
        np.savez(path, keys=np.array([b"x"]), ws_b=np.array([1]))
    else:
        path.write_bytes(content)
    before = path.read_bytes()
    monkeypatch.setattr(workspace, "TABLE_FILE", str(path))
    monkeypatch.setattr(workspace, "_CACHE", {})
    with pytest.raises(EstimateError, match="convolution workspace table .*unusable"):
        workspace.load()
    with pytest.raises(EstimateError, match="unusable"):
        workspace.read_table()
    assert path.read_bytes() == before and workspace._CACHE == {}  # nothing written, nothing cached
