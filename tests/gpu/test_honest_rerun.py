"""Honest jobs that outgrow their grant get their OOM rerun, which completes, on a real GPU under real Slurm
("the lost rerun"; device harness: benchmarks/device/cluster_gpu.sh).

Four 2-shard jobs (2 GiB fence under MPS) of ``colocuser`` need about 4 GiB each, in four patterns
(benchmarks/device/honest_oom.py): ONE 4 GiB allocation at the first step, gradual growth, a peak mid-run, a
peak at the evaluation pass. Each must die of PyTorch's own CUDA OOM, be recognised by the EpilogSlurmctld
from what root can read (the Prolog-started sampler's records, the ``Tried to allocate`` line of its stderr,
its grant) and be rerun once on a whole GPU, where it completes. Before the fix the first pattern was refused
("the sampler watched its GPU and saw no memory of this job: not rerun"). Prints one line per job: the gate's
reason, the sampler's peak, the failed allocation, time from the OOM to the rerun's end.

The test raises ``oom_rerun_per_user_max`` of the harness cluster to 10 for its run (four reruns of one user;
the default budget is 3 per hour) and puts the file back after.

Run on the device, root, with ``.carry`` carried (benchmarks/device/build_bundle.sh run here first):
``/opt/torch/.venv/bin/python3 -m pytest -s -o addopts= -m gpu tests/gpu/test_honest_rerun.py``
(about 3 minutes on one H100: the four first runs share the GPU, the four reruns take it whole one after
another). The Slurm parts alone, on a CPU host (fake GPUs; the jobs print PyTorch's message instead of using
CUDA, so no sampler evidence: only the plumbing is checked): ``COLOC_BENCH_FAKE_GPUS=1 COLOC_HONEST_CPU=1
COLOC_BENCH_ROOT=/tmp/cbench COLOC_BENCH_PYTHON=$PWD/.venv/bin/python .venv/bin/python -m pytest -s -o
addopts= -m gpu tests/gpu/test_honest_rerun.py``
"""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]
DEV = REPO / "benchmarks" / "device"
ROOT = Path(os.environ.get("COLOC_BENCH_ROOT", "/opt/coloc"))
PY = os.environ.get("COLOC_BENCH_PYTHON", "/opt/torch/.venv/bin/python3")
CPU = os.environ.get("COLOC_HONEST_CPU") == "1"
PATTERNS = ("one-alloc", "gradual", "mid-peak", "eval-peak")
USER = "colocuser"
FINAL = ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"]


@pytest.fixture(scope="module")
def gpu_cluster():
    if os.geteuid() != 0 or (shutil.which("nvidia-smi") is None and not CPU):
        pytest.skip("needs root on a machine with an NVIDIA GPU (or COLOC_HONEST_CPU=1 with fake GPUs)")
    bundle = Path(os.environ.get("COLOC_BENCH_BUNDLE", REPO / ".carry" / "slurm-bundle.tar.gz"))
    if not bundle.exists():
        pytest.skip(f"no {bundle} (run benchmarks/device/build_bundle.sh and carry .carry)")
    up = subprocess.run([str(DEV / "cluster_gpu.sh"), "start"], capture_output=True, text=True, timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr
    yaml = ROOT / "etc" / "coloc.yaml"
    saved = yaml.read_text()
    yaml.write_text(saved + "oom_rerun_per_user_max: 10\n")  # hooks read the file at each run
    try:
        yield
    finally:
        yaml.write_text(saved)
        subprocess.run([str(DEV / "cluster_gpu.sh"), "stop"], capture_output=True, text=True, timeout=120)


def _env(user: str) -> Dict[str, str]:
    env = {"PATH": f"{ROOT}/venv/bin:{ROOT}/bin:/usr/local/nvidia/bin:/usr/bin:/bin", "HOME": "/tmp",
           "USER": user,
           "SLURM_CONF": f"{ROOT}/etc/slurm.conf", "COLOC_CONFIG": f"{ROOT}/etc/coloc.yaml",
           "PYTHONUNBUFFERED": "1"}
    if os.environ.get("LD_LIBRARY_PATH"):
        env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
    return env


def _submit(pattern: str) -> int:
    script = ROOT / "jobs" / f"honest-{pattern}.sh"
    check = " --cpu-check" if CPU else ""  # in the script's text: the rerun (--export=NONE) runs the same
    script.write_text(f"#!/bin/bash\nexec {PY} {ROOT}/src/benchmarks/device/honest_oom.py {pattern} "
                      "--need-gib 4"
                      f"{check}\n")
    script.chmod(0o755)
    argv = ["runuser", "-u", USER, "--", "env", *[f"{k}={v}" for k, v in _env(USER).items()],
            f"{ROOT}/bin/sbatch", "--parsable", "--gres=shard:2", "-J", f"honest-{pattern}", "-t", "10",
            "-o", f"{ROOT}/jobs/honest-{pattern}-%j.out", str(script)]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=str(ROOT / "jobs"))
    assert res.returncode == 0, res.stderr
    return int(res.stdout.strip().split(";")[0])


def _show(job: int) -> Dict[str, str]:
    res = subprocess.run([f"{ROOT}/bin/scontrol", "show", "job", "-o", str(job)], capture_output=True,
                         text=True,
                         env=_env("root"), timeout=30)
    return dict(tok.split("=", 1) for tok in res.stdout.split() if "=" in tok)


def _wait(job: int, states: List[str], timeout_s: float) -> str:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        st = _show(job).get("JobState", "GONE")
        if st in states:
            return st
        time.sleep(1)
    return _show(job).get("JobState", "GONE")


def _oom_row(job: int, timeout_s: float = 60) -> Optional[Dict[str, Any]]:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        db = sqlite3.connect(f"file:{ROOT}/coloc/state/ctld.db?mode=ro", uri=True, timeout=10)
        db.row_factory = sqlite3.Row
        try:
            row = db.execute("SELECT * FROM oom_events WHERE job_id = ?", [job]).fetchone()
        except sqlite3.OperationalError:
            row = None
        finally:
            db.close()
        if row is not None and row["retry_status"] != "submitting":
            return dict(row)
        time.sleep(1)
    return None


def _seconds(t0: str, t1: str) -> float:
    """Seconds between two of scontrol's times (``2026-11-26T07:01:02``)."""
    fmt = "%Y-%m-%dT%H:%M:%S"
    return (datetime.strptime(t1, fmt) - datetime.strptime(t0, fmt)).total_seconds()


def _events(path: Path) -> List[Dict[str, Any]]:
    out = []
    for ln in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(ln))
        except ValueError:
            out.append({"ev": "text", "text": ln})
    return out


def test_each_honest_pattern_gets_its_rerun_which_completes(gpu_cluster) -> None:
    jobs = {p: _submit(p) for p in PATTERNS}
    report: Dict[str, Dict[str, Any]] = {}
    for pattern, job in jobs.items():
        assert _wait(job, FINAL, 300) == "FAILED", (pattern, _show(job))
        row = _oom_row(job)
        assert row is not None, f"{pattern}: no oom_events row for job {job}"
        evidence = json.loads(row["evidence_json"]) if row.get("evidence_json") else {}
        report[pattern] = {"job": job, "retry_status": row["retry_status"], "reason": row["retry_reason"],
                           "sampler_peak_mib": evidence.get("sampler_peak_mib"),
                           "message": (evidence.get("messages") or [["", ""]])[0][1][:140]}
        assert "Tried to allocate" in report[pattern]["message"], report[pattern]
        assert row["retry_status"] == "submitted", report
        rerun = int(row["retry_job_id"])
        state = _wait(rerun, FINAL, 600)
        shown = _show(rerun)
        report[pattern].update({"rerun": rerun, "rerun_state": state, "rerun_gres": shown.get("TresPerNode"),
                                "oom_to_rerun_end_s": _seconds(_show(job)["EndTime"], shown["EndTime"])})
        assert state == "COMPLETED", report[pattern]
        # the rerun appends to the first run's file
        ev = _events(ROOT / "jobs" / f"honest-{pattern}-{job}.out")
        assert any(e.get("ev") == "text" and "torch.OutOfMemoryError" in e["text"] for e in ev), pattern
        done = [e for e in ev if e.get("ev") == "done"]
        assert done and done[-1]["ok"] and done[-1]["max_reserved_gib"] >= 2.0, (pattern, done)
    print("HONEST_RERUN", json.dumps(report, indent=1))
