"""benchmarks/placement_signature_fit.py: leave-one-pass-out scoring of the sharing model with one factor and
with a factor per job signature, on synthetic rows and on the recorded 2x H100 passes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import placement_signature_fit as sigfit


def test_consistent_per_signature_ratios_are_learnt_and_one_factor_cannot():
    # workload a always 1.5x slower than predicted, b 0.8x: per-signature factors predict every left-out
    # pass exactly; one factor (the mean ratio, 1.15) cannot
    rows = [(k, w, 2.0, 2.0 * r) for k in range(4) for w, r in (("a", 1.5), ("b", 0.8))]
    e = sigfit.leave_one_pass_out(rows)
    assert e["per_signature"] == pytest.approx(0.0, abs=1e-12)
    assert e["model"] == pytest.approx((0.5 / 1.5 + 0.2 / 0.8) / 2)
    assert e["one_factor"] == pytest.approx((abs(2.3 - 3.0) / 3.0 + abs(2.3 - 1.6) / 1.6) / 2)
    assert e["passes"] == 4 and e["rows"] == 8
    # a workload seen in no other pass falls back to the one factor
    lone = rows + [(9, "c", 2.0, 2.0)]
    assert sigfit.leave_one_pass_out(lone)["per_signature"] > 0
    with pytest.raises(ValueError):
        sigfit.leave_one_pass_out([(0, "a", 2.0, 3.0)])


def test_identical_pass_files_count_once_and_exclusive_and_foreign_passes_not_at_all(tmp_path: Path):
    job = {"workload": "a", "gpu": "n1:0", "bench": {"t_ready": 1.0, "t0": 1.0, "t1": 3.0}}
    co = {"policy": "blind", "jobs": [job]}
    (tmp_path / "h100x2-x").mkdir()
    (tmp_path / "h100x2-x" / "one.json").write_text(json.dumps(co))
    (tmp_path / "h100x2-x" / "copy.json").write_text(json.dumps(co))
    (tmp_path / "h100x2-x" / "excl.json").write_text(json.dumps({"policy": "exclusive", "jobs": [job]}))
    (tmp_path / "h100x2-x" / "other.json").write_text(json.dumps({"policy": "blind", "jobs": [
        dict(job, workload="z")]}))
    (tmp_path / "h100x2-x" / "bad.json").write_text("{")
    (tmp_path / "h100-single").mkdir()
    (tmp_path / "h100-single" / "p.json").write_text(json.dumps(dict(co, policy="gate")))
    assert sigfit.corun_passes({"a": {}}, tmp_path) == [co]


def test_on_the_recorded_piles_a_factor_per_signature_beats_the_model_and_one_factor():
    for name, exclusive in sigfit.PILES:
        prof = sigfit.fitmod.profiles([json.loads(exclusive.read_text())])
        rows = sigfit.rows_of(sigfit.corun_passes(prof), prof, 1.03)
        e = sigfit.leave_one_pass_out(rows)
        assert e["passes"] >= 10, name
        assert e["per_signature"] < e["one_factor"] and e["per_signature"] < e["model"], (name, e)
