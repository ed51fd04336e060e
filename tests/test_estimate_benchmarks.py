"""Research code of the estimator (benchmarks/estimator/, outside the package): bound forms and margins.

The modules are imported as the ``benchmarks.estimator`` package, as
``python -m benchmarks.estimator.train`` does.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.estimator import margins
from benchmarks.estimator.zoo import model_ref
from slurm_coloc.estimate.combine import calibrated_bound, load_calibration

REPO = Path(__file__).resolve().parents[1]


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
    assert margins.evaluate(per, rows, 612.0)["median_over"] \
        < margins.evaluate(one, rows, 612.0)["median_over"]
    fp32 = calibrated_bound(per, 612 + libs + 1000, 612, libs, precision="fp32")
    amp = calibrated_bound(per, 612 + libs + 1000, 612, libs, precision="amp-fp16")
    assert amp - fp32 == pytest.approx(1000 * (per["amp_mult"] - per["analytic_mult"]))


def test_calibrate_picks_form_meeting_underestimate_target() -> None:
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


def test_every_candidate_form() -> None:
    bound = margins.bound_of_form
    old = {"analytic_mult": 1.135, "analytic_add_mib": 230.0, "libs_mib": 146.0}
    assert bound(old, 1758.0, 612.0, 146.0) == pytest.approx(1758.0 * 1.135 + 230.0)
    new = {"form": "per-component-jit", "analytic_mult": 1.26, "analytic_add_mib": 32.0, "jit_mib": 400.0,
           "jit_min_hw": 6400, "libs_mib": 146.0}
    plain = 612.0 + 146.0 + 32.0 + 1000.0 * 1.26
    assert bound(new, 1758.0, 612.0, 146.0) == pytest.approx(plain)
    assert bound(new, 1758.0, 612.0, 146.0, "amp-fp16", 12544) == pytest.approx(plain + 400)
    assert bound(new, 1758.0, 612.0, 146.0, "bf16", 12544) == pytest.approx(plain)
    pc = dict(new, form="per-component")
    assert bound(pc, 1758.0, 612.0, 146.0, "amp-fp16", 12544) == pytest.approx(plain)
    assert bound(dict(pc, form="per-component-sqrt", sqrt_k=4.0), 1758.0, 612.0, 146.0) \
        == pytest.approx(plain + 4.0 * 1000.0 ** 0.5)
    with pytest.raises(ValueError):
        bound(dict(pc, form="nonsense"), 1758.0, 612.0, 146.0)


def test_shipped_form_is_the_packages_code_path() -> None:
    cal = load_calibration()
    for prec, hw in (("fp32", 0), ("bf16", 12544), ("amp-fp16", 12544), ("amp-fp16", 100)):
        assert margins.bound_of_form(cal, 3000.0, 612.0, 146.0, prec, hw) \
            == calibrated_bound(cal, 3000.0, 612.0, 146.0, prec, hw)


def test_data_names_map_to_the_zoo_file() -> None:
    ref = model_ref("slurm_coloc.estimate.zoo:cnn")
    assert ref == str(REPO / "benchmarks" / "estimator" / "zoo.py") + ":cnn"
    paper = model_ref("slurm_coloc.estimate.zoo_paper:xception")
    assert paper.endswith("benchmarks/estimator/zoo_paper.py:xception")
    assert model_ref("torchvision.models:resnet50") == "torchvision.models:resnet50"


def test_train_runs_from_the_repo_root() -> None:
    out = subprocess.run([sys.executable, "-m", "benchmarks.estimator.train", "--help"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "python -m benchmarks.estimator.train" in out.stdout
