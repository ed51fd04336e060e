"""Estimator on the CPU (meta/fake tensors): contract, allocator model, bad input, CLI."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_coloc.errors import EstimateError
from slurm_coloc.estimate import ModelSpec, combine, estimate_peak
from slurm_coloc.estimate.combine import calibrated_bound, load_calibration
from slurm_coloc.estimate.decision import Candidate, EstimateEvidence, decide, history_bound
from slurm_coloc.estimate.spec import Estimate
from slurm_coloc.estimate.tracker import CachingAllocatorModel, round_size, segment_size

# Parameterised test models (research code outside the package), named by file path.
ZOO = str(Path(__file__).resolve().parents[1] / "benchmarks" / "estimator" / "zoo.py")


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


@pytest.mark.slow
def test_resnet18_estimate_is_plausible() -> None:
    spec = ModelSpec("torchvision.models:resnet18", (3, 32, 32), 64, optimizer="adam")
    est = estimate_peak(spec, "H100")
    d = est.detail
    assert est.gpu_model == "H100" and est.method == "analytic"
    # params 11.7 M fp32 = 44.6 MiB; adam doubles that in state; plus grads
    assert 44 < d["params_mib"] < 46
    assert d["peak_allocated_mib"] > 3 * d["params_mib"]
    assert est.mem_mib >= d["analytic_mib"] >= 612


@pytest.mark.slow
def test_estimate_grows_with_batch_and_amp_saves() -> None:
    small = estimate_peak(ModelSpec("torchvision.models:resnet18", (3, 64, 64), 16, optimizer="sgd"))
    big = estimate_peak(ModelSpec("torchvision.models:resnet18", (3, 64, 64), 256, optimizer="sgd"))
    amp = estimate_peak(ModelSpec("torchvision.models:resnet18", (3, 64, 64), 256, optimizer="sgd",
                                  precision="amp-fp16"))
    assert small.mem_mib < big.mem_mib
    assert amp.detail["peak_allocated_mib"] < big.detail["peak_allocated_mib"]


def test_history_first() -> None:
    spec = ModelSpec(ZOO + ":mlp", (784,), 32)
    est = estimate_peak(spec, "H100", history_mib=[1000, 1200])
    assert est.method == "history" and est.mem_mib == history_bound([1200]) == 1324


def test_decide_history_replaces_a_figure_never_below_its_typed_trace_floor() -> None:
    # the floor is the Candidate's typed field: the estimate's detail has none
    probe = Candidate("probe on H100", Estimate(2000, "probe", gpu_model="H100"), "H100",
                      trace_floor_mib=1600)
    low = decide(EstimateEvidence(probe=probe, history_mib=(100,)))
    assert (low.mem_mib, low.method, low.gpu_model, low.history_below_floor_mib) == (1600, "history", "H100",
                                                                                     169)
    assert low.why == "history lowered the probe figure (2000 MiB) to 1600 MiB (its trace floor)"
    mid = decide(EstimateEvidence(probe=probe, history_mib=(1700, 0)))  # 1700 * 1.05 + 64: above the floor
    assert (mid.mem_mib, mid.history_below_floor_mib, mid.history_peak_mib) == (1849, None, 1700)
    high = decide(EstimateEvidence(probe=probe, history_mib=(3000,)))
    assert high.mem_mib == 3214 and high.why.startswith("history raised the probe figure")
    assert decide(EstimateEvidence(probe=probe)).mem_mib == 2000
    unfloored = Candidate("analytic of m:f on H100", Estimate(2000, "analytic", gpu_model="H100"), "H100")
    only_raised = decide(EstimateEvidence(directives=unfloored, history_mib=(100,)))
    assert (only_raised.mem_mib, only_raised.method) == (2000, "history")  # no floor: history only raises
    assert decide(EstimateEvidence(override_mib=500, probe=probe, history_mib=(3000,))).mem_mib == 500


@pytest.mark.parametrize("spec,needle", [
    (ModelSpec("nosuch_mod_xyz:f", (3,), 2), "not found"),
    (ModelSpec("torchvision.models:nosuch", (3,), 2), "no attribute"),
    (ModelSpec("torchvision.models:resnet18", (7,), 2), "forward on input"),
    (ModelSpec("torchvision.models:resnet18", (3, 32, 32), 0), "batch size"),
    (ModelSpec("torchvision.models:resnet18", (3, 32, 32), 10**9), "batch size"),
    (ModelSpec(ZOO + ":mlp", (784,), 2, kwargs={"nope": 1}), "building it raised"),
])
def test_bad_input_one_line_errors(spec: ModelSpec, needle: str) -> None:
    with pytest.raises(EstimateError) as err:
        estimate_peak(spec)
    assert needle in err.value.one_line() and "\n" not in err.value.one_line()
    assert spec.model in err.value.one_line()


def test_unknown_gpu() -> None:
    with pytest.raises(EstimateError, match="unknown GPU"):
        estimate_peak(ModelSpec(ZOO + ":mlp", (784,), 2), "K80")


def test_user_file_model(tmp_path) -> None:
    (tmp_path / "net.py").write_text(
        "import torch\ndef build(width=8):\n"
        "    return torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.Linear(width, 3))\n")
    est = estimate_peak(ModelSpec("net.py:build", (4,), 8, kwargs={"width": 16}, base_dir=str(tmp_path)))
    assert est.mem_mib > 612


@pytest.mark.slow
def test_cli_json_and_errors() -> None:
    cmd = [sys.executable, "-m", "slurm_coloc.cli.estimate"]
    ok = subprocess.run(cmd + ["--model", ZOO + ":transformer_lm", "--model-kwargs",
                               '{"vocab_size": 1000, "d_model": 64, "n_layers": 1, "n_heads": 2}',
                               "--input-shape", "32", "--input-dtype", "int64", "--batch-size", "4",
                               "--optimizer", "adamw", "--amp", "--json"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    obj = json.loads(ok.stdout)
    assert obj["estimate_mib"] > 612 and obj["method"] == "analytic"
    bad = subprocess.run(cmd + ["--model", "nosuch:f", "--input-shape", "3", "--batch-size", "1"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


SHIPPED_LIKE = {"form": "per-precision-jit", "analytic_mult": 1.1, "amp_mult": 1.2, "analytic_add_mib": 16.0,
                "jit_mib": 400.0, "jit_min_hw": 6400, "libs_mib": 146.0}


def test_calibrated_bound_per_precision_jit() -> None:
    fixed = 612.0 + 146.0 + 16.0
    assert calibrated_bound(SHIPPED_LIKE, 1758.0, 612.0, 146.0) == pytest.approx(fixed + 1000.0 * 1.1)
    assert calibrated_bound(SHIPPED_LIKE, 1758.0, 612.0, 146.0, "bf16", 12544) \
        == pytest.approx(fixed + 1000.0 * 1.2)  # AMP multiplier, no jit memory (bf16)
    assert calibrated_bound(SHIPPED_LIKE, 1758.0, 612.0, 146.0, "amp-fp16", 12544) \
        == pytest.approx(fixed + 1000.0 * 1.2 + 400.0)
    assert calibrated_bound(SHIPPED_LIKE, 1758.0, 612.0, 146.0, "amp-fp16", 6400) \
        == pytest.approx(fixed + 1000.0 * 1.2)  # at the threshold: no jit memory
    assert calibrated_bound(SHIPPED_LIKE, 500.0, 612.0, 146.0) == pytest.approx(fixed)  # R clipped at 0


@pytest.mark.parametrize("content,needle", [
    (None, "unusable"),
    ("{not json", "unusable"),
    (json.dumps(dict(SHIPPED_LIKE, form="per-component-jit")), "bound form 'per-component-jit'"),
    (json.dumps({k: v for k, v in SHIPPED_LIKE.items() if k != "amp_mult"}), "missing amp_mult"),
])
def test_unusable_calibration_is_one_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str,
                                           needle: str) -> None:
    if content is not None:
        (tmp_path / "calibration.json").write_text(content)
    monkeypatch.setattr(combine, "WEIGHTS_DIR", str(tmp_path))
    with pytest.raises(EstimateError, match=needle) as err:
        load_calibration()
    assert "\n" not in err.value.one_line()


def test_shipped_calibration_and_detail_without_learned_figures() -> None:
    assert load_calibration()["form"] == combine.BOUND_FORM
    est = combine.traced_estimate(ModelSpec(ZOO + ":mlp", (784,), 8), "H100")
    assert est.detail["bound_form"] == "per-precision-jit"
    assert not [k for k in est.detail if k.startswith("learned")]
    assert est.mem_mib >= est.detail["analytic_bound_mib"] > est.detail["analytic_mib"]
