"""The placement benchmark's bookkeeping on CPU (sizing, metrics, target checks) and the predictor fit
(``benchmarks/placement_fit.py``) on a synthetic benchmark file. The Slurm path itself was run end to end with
``COLOC_BENCH_FAKE_GPUS=1`` (benchmarks/device/README.md); the GPU run is the lead's device call."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks" / "device"))
sys.path.insert(0, str(REPO / "benchmarks"))

import placement_fit  # noqa: E402
import placement_passes as pp  # noqa: E402
from placement_bench import PILE14, STREAM, fake_profile  # noqa: E402

from slurm_coloc.placement import intensity  # noqa: E402


def test_size_jobs_fits_the_budget_and_asks_peak_plus_context() -> None:
    prof = fake_profile([*PILE14, *(w for w, _ in STREAM)])
    prof["pile:resnet50"]["step_s"] = 0.2
    plans = pp.size_jobs(["pile", "stream"], prof, 480.0, 6.0, None, pp.POLICIES)
    assert len(plans["pile"]) == 14 and len(plans["stream"]) == len(STREAM)
    target = 480.0 / (sum(pp.SPEEDUP_GUESS.values()) * 22) - 6.0
    r50 = plans["pile"][0]
    assert r50.workload == "pile:resnet50" and r50.steps == round(max(3.0, target) / 0.2)
    assert r50.mem_mib == prof["pile:resnet50"]["peak_reserved_mib"] + pp.CONTEXT_MIB
    assert all(j.offset_s == 0 for j in plans["pile"])
    assert [j.offset_s for j in plans["stream"]] == sorted(j.offset_s for j in plans["stream"])
    assert plans["stream"][-1].offset_s > 0
    fixed = pp.size_jobs(["pile"], prof, 10.0, 6.0, 30.0, ["exclusive"])  # --target-s wins over the budget
    assert fixed["pile"][0].alone_guess_s == pytest.approx(30.0, rel=0.01)
    tiny = pp.size_jobs(["pile"], prof, 1.0, 6.0, None, ["exclusive"])  # never below 3 s alone
    assert tiny["pile"][0].alone_guess_s == pytest.approx(3.0, rel=0.05)


def _pass(policy: str, spans: list) -> dict:
    """A pass of 3 jobs submitted at 0: spans = [(start, end, state, rerun_end)]."""
    jobs, runs = [], []
    t0 = 1000.0  # Unix seconds (0 reads as unset)
    spans = [(t0 + s, t0 + e, st, t0 + r if r else None) for s, e, st, r in spans]
    for i, (start, end, state, rerun_end) in enumerate(spans):
        jobs.append({"index": i, "workload": "w", "job_id": 10 + i, "submit_ts": t0, "start_ts": start,
                     "end_ts": rerun_end or end, "state": "COMPLETED" if rerun_end else state,
                     "oom_reruns": int(bool(rerun_end))})
        runs.append({"job_id": 10 + i, "task": i, "submit_ts": t0, "start_ts": start, "end_ts": end,
                     "state": state, "retry_of": None})
        if rerun_end:
            runs.append({"job_id": 90 + i, "task": i, "submit_ts": end, "start_ts": end, "end_ts": rerun_end,
                         "state": "COMPLETED", "retry_of": 10 + i})
    return {"policy": policy, "jobs": jobs, "runs": runs, "smact_pct": None, "energy_j": None, "problems": []}


def test_metrics_slowdown_against_the_exclusive_run_times_and_targets() -> None:
    passes = {"exclusive": _pass("exclusive", [(0, 10, "COMPLETED", None), (10, 30, "COMPLETED", None),
                                               (30, 40, "COMPLETED", None)]),
              "blind": _pass("blind", [(0, 25, "COMPLETED", None), (0, 35, "COMPLETED", None),
                                       (0, 20, "OUT_OF_MEMORY", 30)]),
              "aware": _pass("aware", [(0, 12, "COMPLETED", None), (0, 24, "COMPLETED", None),
                                       (12, 24, "COMPLETED", None)])}
    pp.finish_metrics(passes)
    ex, bl, aw = (passes[p]["metrics"] for p in ("exclusive", "blind", "aware"))
    assert ex["makespan_s"] == 40 and ex["mean_jct_s"] == pytest.approx((10 + 30 + 40) / 3)
    assert [j["alone_s"] for j in passes["aware"]["jobs"]] == [10, 20, 10]
    assert aw["max_slowdown"] == pytest.approx(2.4) and bl["max_slowdown"] == pytest.approx(3.0)
    assert bl["ooms"] == 1 and bl["lost"] == 0 and aw["ooms"] == 0
    t = pp.targets(passes)
    assert t["aware_mean_jct_le_0.8x_exclusive"] is True  # 20 <= 0.8 x 26.7
    assert t["aware_mean_jct_le_blind"] is True and t["aware_makespan_le_0.75x_exclusive"] is True
    assert t["aware_no_job_over_3x_alone"] is True and t["aware_0_oom"] is True
    assert "aware" in pp.table({"scenarios": {"pile": passes}, "targets": {"pile": t}})


def _bench_file(tmp_path: Path, fake: bool = False) -> Path:
    """Exclusive jobs whose SMACT follows a known curve (0.05..0.9, x_half 50 GFLOP), SMOCC = 0.3 SMACT,
    DRAMA = 0.5 SMACT."""
    prof, jobs = {}, []
    for i, g in enumerate([2, 10, 30, 60, 120, 300, 900]):
        s = 0.05 + 0.85 * g / (g + 50)
        prof[f"m{i}"] = {"gflop_per_step": g}
        jobs.append({"workload": f"m{i}", "alone_activity": {"smact": s, "smocc": 0.3 * s, "drama": 0.5 * s}})
    jobs.append({"workload": "nomeasure", "alone_activity": None})
    path = tmp_path / "placement_bench.json"
    path.write_text(json.dumps({"fake": fake, "profile": prof, "scenarios": {"pile": {"exclusive": {"jobs": jobs}}}}))
    return path


def test_fit_recovers_the_curve_and_writes_a_loadable_calibration(tmp_path: Path) -> None:
    out = tmp_path / "cal.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "placement_fit.py"), str(_bench_file(tmp_path)),
                           "--out", str(out), "--by-model", "--feature", "flops"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    cal = intensity.load_calibration(str(out))
    assert cal.smact_min == pytest.approx(0.05, abs=0.02) and cal.smact_max == pytest.approx(0.9, abs=0.03)
    assert cal.x_half_gflop == pytest.approx(50, rel=0.15)
    assert cal.smocc_per_smact == pytest.approx(0.3, abs=1e-3) and cal.drama_per_smact == pytest.approx(0.5, abs=1e-3)
    assert set(cal.by_model) == {f"m{i}" for i in range(7)}
    assert "mean absolute error" in proc.stdout and "m3" in proc.stdout
    pred = intensity.predict(intensity.Features(60.0, None, None, "fp32", None), cal)
    assert pred.smact == pytest.approx(0.05 + 0.85 * 60 / 110, abs=0.02)


def test_fit_on_the_spec_proxy_uses_batch_times_input_elements(tmp_path: Path) -> None:
    bench = json.loads(_bench_file(tmp_path).read_text())
    for i, row in enumerate(bench["profile"].values()):
        row.update(batch=8 * (i + 1), input_shape=[3, 32, 32])
    rows = placement_fit.samples(bench, "proxy")
    assert [r["gflop"] for r in rows][:2] == pytest.approx([8 * 3072 * 3e-6, 16 * 3072 * 3e-6])
    assert placement_fit.fit(rows)["smact_max"] <= 1.0


def test_fit_refuses_too_little_data_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"profile": {}, "scenarios": {}}))
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "placement_fit.py"), str(path), "--out",
                           str(tmp_path / "c.json")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stderr.startswith("placement_fit: error:")
    assert not (tmp_path / "c.json").exists()
    assert len(proc.stderr.strip().splitlines()) == 1


def test_fit_curve_is_flat_for_flat_data() -> None:
    lo, hi, _, sse = placement_fit.fit_curve([1, 10, 100], [0.3, 0.3, 0.3])
    assert lo == pytest.approx(0.3) and hi == pytest.approx(0.3) and sse == pytest.approx(0)


def test_pass_estimate_is_serial_time_by_policy_factor_and_after_the_last_arrival() -> None:
    prof = fake_profile(PILE14)
    jobs = pp.size_jobs(["pile"], prof, 0, 5.0, 10.0, ["exclusive"])["pile"]
    serial = sum(j.alone_guess_s + 5.0 for j in jobs)
    assert pp.pass_estimate_s(jobs, "exclusive", 5.0) == pytest.approx(serial)
    assert pp.pass_estimate_s(jobs, "blind", 5.0) == pytest.approx(serial * pp.SPEEDUP_GUESS["blind"])
    late = [pp.Job(0, "w", 500.0, 10, 1.0, 1000)]
    assert pp.pass_estimate_s(late, "blind", 5.0) == pytest.approx(505.0)


def test_fit_target_drops_to_fewer_scenarios_when_all_would_be_too_short() -> None:
    both = pp.fit_target_s(["pile", "stream"], 425.0, 6.0, pp.POLICIES)
    pile = pp.fit_target_s(["pile"], 425.0, 6.0, pp.POLICIES)
    assert both == pytest.approx(425.0 / (2.4 * 22) - 6.0) and both < 3.0 < pile
