"""The placement benchmark's predictor fit (``benchmarks/placement_fit.py``) on synthetic benchmark files.
The plan, the metrics and the combination of pass files: ``test_placement_passes.py``."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import placement_fit
from slurm_coloc.placement import intensity

REPO = Path(__file__).resolve().parent.parent


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
    path.write_text(json.dumps({"fake": fake, "profile": prof,
                                "scenarios": {"pile": {"exclusive": {"jobs": jobs}}}}))
    return path


def test_fit_recovers_the_curve_and_writes_a_loadable_calibration(tmp_path: Path) -> None:
    out = tmp_path / "cal.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.placement_fit",
                           str(_bench_file(tmp_path)),
                           "--out", str(out), "--by-model", "--feature", "flops"],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    cal = intensity.load_calibration(str(out))
    assert cal.smact_min == pytest.approx(0.05, abs=0.02) and cal.smact_max == pytest.approx(0.9, abs=0.03)
    assert cal.x_half_gflop == pytest.approx(50, rel=0.15)
    assert (cal.smocc_per_smact == pytest.approx(0.3, abs=1e-3)
            and cal.drama_per_smact == pytest.approx(0.5, abs=1e-3))
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
    proc = subprocess.run([sys.executable, "-m", "benchmarks.placement_fit", str(path), "--out",
                           str(tmp_path / "c.json")], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 1 and proc.stderr.startswith("placement_fit: error:")
    assert not (tmp_path / "c.json").exists()
    assert len(proc.stderr.strip().splitlines()) == 1


def test_fit_curve_is_flat_for_flat_data() -> None:
    lo, hi, _, sse = placement_fit.fit_curve([1, 10, 100], [0.3, 0.3, 0.3])
    assert lo == pytest.approx(0.3) and hi == pytest.approx(0.3) and sse == pytest.approx(0)


def test_fit_reads_exclusive_pass_files_with_a_profile_and_skips_other_passes(tmp_path: Path) -> None:
    bench = json.loads(_bench_file(tmp_path).read_text())
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps({"rows": bench["profile"]}))
    jobs = bench["scenarios"]["pile"]["exclusive"]["jobs"]
    files = []
    for k, chunk in enumerate((jobs[:4], jobs[4:]), 1):
        files.append(tmp_path / f"pile-exclusive-part{k}.json")
        files[-1].write_text(json.dumps({"scenario": "pile", "policy": "exclusive", "part": f"{k}/2",
                                         "jobs": [{**j, "state": "COMPLETED"} for j in chunk]}))
    blind = tmp_path / "pile-blind.json"  # collocated activity: never a measurement alone
    blind.write_text(json.dumps({"scenario": "pile", "policy": "blind", "jobs": [
        {"workload": "m0", "state": "COMPLETED",
         "alone_activity": {"smact": 0.99, "smocc": 0.9, "drama": 0.9}}]}))
    cancelled = tmp_path / "stream-exclusive.json"
    cancelled.write_text(json.dumps({"scenario": "stream", "policy": "exclusive", "jobs": [
        {"workload": "m1", "state": "CANCELLED",
         "alone_activity": {"smact": 0.0, "smocc": 0.0, "drama": 0.0}}]}))
    out = tmp_path / "cal.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.placement_fit", *map(str, files),
                           str(blind), str(cancelled), "--profile", str(prof), "--out", str(out), "--feature",
                           "flops"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    # the 7 measured exclusive jobs, not the blind or the cancelled one
    assert len(re.findall(r"^m\d ", proc.stdout, re.M)) == 7
    cal = intensity.load_calibration(str(out))
    assert cal.x_half_gflop == pytest.approx(50, rel=0.15) and cal.smact_max == pytest.approx(0.9, abs=0.03)
