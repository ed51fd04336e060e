"""Estimator on the CPU (meta/fake tensors): contract, allocator model, bad input, CLI."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from slurm_coloc.errors import EstimateError
from slurm_coloc.estimate import ModelSpec, estimate_peak
from slurm_coloc.estimate.allocator import CachingAllocatorModel, round_size, segment_size
from slurm_coloc.estimate.combine import history_bound


def test_package_import_does_not_import_torch() -> None:
    code = "import sys, slurm_coloc.estimate; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_allocator_rounding_and_segments() -> None:
    assert round_size(1) == 512 and round_size(513) == 1024
    assert segment_size(1 << 20) == 2 << 20 and segment_size((1 << 20) + 512) == 20 << 20
    assert segment_size(11 << 20) == 12 << 20
    m = CachingAllocatorModel()
    h = m.malloc(100)
    m.free(h)
    m.malloc(200)  # reuses the cached small segment
    assert m.reserved_b == 2 << 20 and m.n_segments == 1


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 64 << 20), st.booleans()), min_size=1, max_size=60))
def test_allocator_invariants(ops: list) -> None:
    m = CachingAllocatorModel()
    live = []
    for size, free_one in ops:
        live.append(m.malloc(size))
        assert m.allocated_b <= m.reserved_b
        if free_one and live:
            m.free(live.pop(0))
    for h in live:
        m.free(h)
    assert m.allocated_b == 0 and m.peak_allocated_b <= m.peak_reserved_b


def test_resnet18_estimate_is_plausible() -> None:
    spec = ModelSpec("torchvision.models:resnet18", (3, 32, 32), 64, optimizer="adam")
    est = estimate_peak(spec, "H100")
    d = est.detail
    assert est.gpu_model == "H100" and est.method == "analytic"
    # params 11.7 M fp32 = 44.6 MiB; adam doubles that in state; plus grads
    assert 44 < d["params_mib"] < 46
    assert d["peak_allocated_mib"] > 3 * d["params_mib"]
    assert est.mem_mib >= d["analytic_mib"] >= 612


def test_estimate_grows_with_batch_and_amp_saves() -> None:
    small = estimate_peak(ModelSpec("torchvision.models:resnet18", (3, 64, 64), 16, optimizer="sgd"))
    big = estimate_peak(ModelSpec("torchvision.models:resnet18", (3, 64, 64), 256, optimizer="sgd"))
    amp = estimate_peak(ModelSpec("torchvision.models:resnet18", (3, 64, 64), 256, optimizer="sgd",
                                  precision="amp-fp16"))
    assert small.mem_mib < big.mem_mib
    assert amp.detail["peak_allocated_mib"] < big.detail["peak_allocated_mib"]


def test_history_first() -> None:
    spec = ModelSpec("slurm_coloc.estimate.zoo:mlp", (784,), 32)
    est = estimate_peak(spec, "H100", history_mib=[1000, 1200])
    assert est.method == "history" and est.mem_mib == history_bound([1200]) == 1324


@pytest.mark.parametrize("spec,needle", [
    (ModelSpec("nosuch_mod_xyz:f", (3,), 2), "not found"),
    (ModelSpec("torchvision.models:nosuch", (3,), 2), "no attribute"),
    (ModelSpec("torchvision.models:resnet18", (7,), 2), "forward on input"),
    (ModelSpec("torchvision.models:resnet18", (3, 32, 32), 0), "batch size"),
    (ModelSpec("torchvision.models:resnet18", (3, 32, 32), 10**9), "batch size"),
    (ModelSpec("slurm_coloc.estimate.zoo:mlp", (784,), 2, kwargs={"nope": 1}), "building it raised"),
])
def test_bad_input_one_line_errors(spec: ModelSpec, needle: str) -> None:
    with pytest.raises(EstimateError) as err:
        estimate_peak(spec)
    assert needle in err.value.one_line() and "\n" not in err.value.one_line()
    assert spec.model in err.value.one_line()


def test_unknown_gpu() -> None:
    with pytest.raises(EstimateError, match="unknown GPU"):
        estimate_peak(ModelSpec("slurm_coloc.estimate.zoo:mlp", (784,), 2), "K80")


def test_user_file_model(tmp_path) -> None:
    (tmp_path / "net.py").write_text(
        "import torch\ndef build(width=8):\n    return torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.Linear(width, 3))\n")
    est = estimate_peak(ModelSpec("net.py:build", (4,), 8, kwargs={"width": 16}, base_dir=str(tmp_path)))
    assert est.mem_mib > 612


def test_cli_json_and_errors() -> None:
    cmd = [sys.executable, "-m", "slurm_coloc.cli.estimate"]
    ok = subprocess.run(cmd + ["--model", "slurm_coloc.estimate.zoo:transformer_lm", "--model-kwargs",
                               '{"vocab_size": 1000, "d_model": 64, "n_layers": 1, "n_heads": 2}',
                               "--input-shape", "32", "--input-dtype", "int64", "--batch-size", "4",
                               "--optimizer", "adamw", "--amp", "--json"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    obj = json.loads(ok.stdout)
    assert obj["estimate_mib"] > 612 and obj["method"] == "analytic"
    bad = subprocess.run(cmd + ["--model", "nosuch:f", "--input-shape", "3", "--batch-size", "1"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


def _cal_rows() -> list:
    """Small rows in ``train.load_hopper``'s format: 3 families, one with extra cuDNN (jit) memory."""
    rows = []
    for fam, n, ratio in (("a", 40, 1.05), ("b", 40, 1.15), ("c", 40, 1.1)):
        for i in range(n):
            r = 100.0 + 50.0 * i
            jit = fam == "c" and i % 10 == 0
            nonalloc = 760.0 + (390.0 if jit else 0.0)
            rows.append({"family": fam, "sim_reserved_mib": r, "actual_mib": nonalloc + r * ratio,
                         "nonalloc_mib": nonalloc, "precision": "amp-fp16" if jit else "fp32",
                         "depthwise_max_hw": 12544 if jit else 0})
    return rows


def test_per_precision_form_gives_amp_jobs_their_own_multiplier() -> None:
    from slurm_coloc.estimate import margins
    from slurm_coloc.estimate.combine import calibrated_bound

    rows = []
    for i in range(60):  # fp32 traces need x1.05, AMP traces x1.30
        r = 200.0 + 40.0 * i
        for prec, ratio in (("fp32", 1.05), ("bf16", 1.30)):
            rows.append({"family": "a", "sim_reserved_mib": r, "actual_mib": 760.0 + r * ratio,
                         "nonalloc_mib": 760.0, "precision": prec, "depthwise_max_hw": 0})
    libs = margins.libs_of(rows, 612.0)
    per = margins.fit_form("per-precision-jit", rows, libs, 612.0, 0.01)
    one = margins.fit_form("per-component-jit", rows, libs, 612.0, 0.01)
    assert per["analytic_mult"] < 1.1 and per["amp_mult"] >= 1.3 and one["analytic_mult"] >= 1.3
    assert margins.evaluate(per, rows, 612.0)["under"] <= 0.01
    assert margins.evaluate(per, rows, 612.0)["median_over"] < margins.evaluate(one, rows, 612.0)["median_over"]
    fp32 = calibrated_bound(per, 612 + libs + 1000, 612, libs, precision="fp32")
    amp = calibrated_bound(per, 612 + libs + 1000, 612, libs, precision="amp-fp16")
    assert amp - fp32 == pytest.approx(1000 * (per["amp_mult"] - per["analytic_mult"]))


def test_calibrate_picks_form_meeting_underestimate_target() -> None:
    from slurm_coloc.estimate import margins

    rows = _cal_rows()
    libs = margins.libs_of(rows, 612.0)
    cal, table = margins.choose_form(rows, libs, 612.0, 0.01)
    assert {t["cal"]["form"] for t in table} == set(margins.FORMS)
    assert margins.evaluate(cal, rows, 612.0)["under"] <= 0.01
    assert all(t["under"] <= 0.01 for t in table)
    # the jit rows no longer force the pad (per-precision-jit may win: the jit rows are AMP)
    assert cal["form"] in ("per-component-jit", "per-precision-jit") and cal["jit_mib"] >= 390
    assert cal == margins.choose_form(rows, libs, 612.0, 0.01)[0]  # deterministic
    cv = margins.leave_one_family_out(rows, cal["form"], 612.0, 0.01)
    assert cv["pooled"]["rows"] == len(rows) and set(cv["per_family"]) == {"a", "b", "c"}


def test_calibrated_bound_reads_old_and_new_formats() -> None:
    from slurm_coloc.estimate.combine import calibrated_bound

    old = {"analytic_mult": 1.135, "analytic_add_mib": 230.0, "learned_mult": 1.77, "libs_mib": 146.0}
    assert calibrated_bound(old, 1758.0, 612.0, 146.0) == pytest.approx(1758.0 * 1.135 + 230.0)
    new = {"form": "per-component-jit", "analytic_mult": 1.26, "analytic_add_mib": 32.0, "jit_mib": 400.0,
           "jit_min_hw": 6400, "libs_mib": 146.0}
    plain = 612.0 + 146.0 + 32.0 + 1000.0 * 1.26
    assert calibrated_bound(new, 1758.0, 612.0, 146.0) == pytest.approx(plain)
    assert calibrated_bound(new, 1758.0, 612.0, 146.0, precision="amp-fp16", depthwise_max_hw=12544) \
        == pytest.approx(plain + 400.0)
    assert calibrated_bound(new, 1758.0, 612.0, 146.0, precision="bf16", depthwise_max_hw=12544) == pytest.approx(plain)
    pc = dict(new, form="per-component")
    assert calibrated_bound(pc, 1758.0, 612.0, 146.0, precision="amp-fp16", depthwise_max_hw=12544) \
        == pytest.approx(plain)
    assert calibrated_bound(dict(pc, form="per-component-sqrt", sqrt_k=4.0), 1758.0, 612.0, 146.0) \
        == pytest.approx(plain + 4.0 * 1000.0 ** 0.5)
    with pytest.raises(EstimateError):
        calibrated_bound(dict(pc, form="nonsense"), 1758.0, 612.0, 146.0)
