"""Hostile tenants on a real GPU under real Slurm (device harness: benchmarks/device/cluster_gpu.sh).

An honest neighbour (``--gres=shard:8``, holds 6 GiB and trains a matmul loop) shares the GPU under multi-user
MPS with two 2 GiB jobs of another user: one raises its own ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` to ``0=70G``
and allocates 1 GiB steps up to 20 GiB; the other unsets ``CUDA_MPS_PIPE_DIRECTORY`` (a context outside MPS)
and allocates 20 GiB at once. Expected: the MPS ceiling (the largest grant: 8 GiB) caps the first, the
watchdog of the Prolog-started sampler SIGKILLs and scancels both (events in the node database, a line in
their output), and the neighbour finishes without an OOM. Prints time to stop, memory reached and the
neighbour's throughput dip. The compute mode is left as it is (DEFAULT on the test machine).

Run on the device, root, with ``.carry`` carried (benchmarks/device/build_bundle.sh):
``/opt/torch/.venv/bin/python3 -m pytest -s -o addopts= -m gpu tests/gpu/test_hostile_tenant.py``
The Slurm parts alone, on a CPU host: ``COLOC_BENCH_FAKE_GPUS=1 COLOC_HOSTILE_CPU=1
COLOC_BENCH_ROOT=/tmp/cbench COLOC_BENCH_PYTHON=$PWD/.venv/bin/python .venv/bin/python -m pytest -s -o
addopts= -m gpu tests/gpu/test_hostile_tenant.py``
(jobs print their environment instead of using CUDA; the watchdog has nothing to see: only the setup is
checked).
"""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]
DEV = REPO / "benchmarks" / "device"
ROOT = Path(os.environ.get("COLOC_BENCH_ROOT", "/opt/coloc"))
CPU = os.environ.get("COLOC_HOSTILE_CPU") == "1"
PY = os.environ.get("COLOC_BENCH_PYTHON", "/opt/torch/.venv/bin/python3")
BOUND_S = 1.0  # the stop bound at the default rate: watchdog_interval_s 0.5 + fast 0.1 + the kill


@pytest.fixture(scope="module")
def gpu_cluster():
    if os.geteuid() != 0 or (shutil.which("nvidia-smi") is None and not CPU):
        pytest.skip("needs root on a machine with an NVIDIA GPU (or COLOC_HOSTILE_CPU=1 with fake GPUs)")
    bundle = Path(os.environ.get("COLOC_BENCH_BUNDLE", REPO / ".carry" / "slurm-bundle.tar.gz"))
    if not bundle.exists():
        pytest.skip(f"no {bundle} (run benchmarks/device/build_bundle.sh and carry .carry)")
    up = subprocess.run([str(DEV / "cluster_gpu.sh"), "start"], capture_output=True, text=True, timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr
    yield
    subprocess.run([str(DEV / "cluster_gpu.sh"), "stop"], capture_output=True, text=True, timeout=120)


def _env(user: str) -> Dict[str, str]:
    env = {"PATH": f"{ROOT}/venv/bin:{ROOT}/bin:/usr/local/nvidia/bin:/usr/bin:/bin", "HOME": "/tmp",
           "USER": user,
           "SLURM_CONF": f"{ROOT}/etc/slurm.conf", "COLOC_CONFIG": f"{ROOT}/etc/coloc.yaml",
           "PYTHONUNBUFFERED": "1"}
    if os.environ.get("LD_LIBRARY_PATH"):
        env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
    if CPU:
        env["COLOC_HOSTILE_CPU"] = "1"
    return env


def _submit(user: str, shards: int, body: str, name: str) -> int:
    script = ROOT / "jobs" / f"hostile-{name}.sh"
    script.write_text(f"#!/bin/bash\n{body}\n")
    script.chmod(0o755)
    argv = ["runuser", "-u", user, "--", "env", *[f"{k}={v}" for k, v in _env(user).items()],
            f"{ROOT}/bin/sbatch", "--parsable", f"--gres=shard:{shards}", "-J", name,
            "-o", f"{ROOT}/jobs/hostile-%j.out", str(script)]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=str(ROOT / "jobs"))
    assert res.returncode == 0, res.stderr
    return int(res.stdout.strip().split(";")[0])


def _state(job: int) -> str:
    res = subprocess.run([f"{ROOT}/bin/scontrol", "show", "job", "-o", str(job)], capture_output=True,
                         text=True,
                         env=_env("root"), timeout=30)
    for tok in res.stdout.split():
        if tok.startswith("JobState="):
            return tok.split("=", 1)[1]
    return "GONE"


def _wait(job: int, states: List[str], timeout_s: float) -> str:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        st = _state(job)
        if st in states:
            return st
        time.sleep(0.5)
    return _state(job)


def _lines(job: int) -> List[Dict[str, Any]]:
    out = []
    for ln in (ROOT / "jobs" / f"hostile-{job}.out").read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(ln))
        except ValueError:
            out.append({"ev": "text", "text": ln})
    return out


def _node_db() -> sqlite3.Connection:
    return sqlite3.connect(f"file:{ROOT}/coloc/state/nodes/n1.db?mode=ro", uri=True)


def test_offenders_stopped_neighbour_keeps_training(gpu_cluster) -> None:
    client = f"{ROOT}/src/benchmarks/device/hostile_client.py"
    neighbour = _submit("colocuser", 8, f"exec {PY} {client} neighbour --hold-gib 6 --train-s 40",
                        "neighbour")
    assert _wait(neighbour, ["RUNNING"], 60) == "RUNNING"
    time.sleep(8)  # the neighbour is training
    t_attack = time.time()
    raised = _submit("colocuser2", 2, f"export CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=70G\n"
                                      f"{PY} {client} raise --alloc-gib 20 --hold-s 60; sleep 60", "raise")
    time.sleep(6)
    escaped = _submit("colocuser2", 2, "unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY "
                                       f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT\n"
                                       f"{PY} {client} escape --alloc-gib 20 --hold-s 60; sleep 60", "escape")
    if CPU:  # Slurm parts only: the jobs got what the attack needs, nothing else to see
        for job in (raised, escaped):
            assert _wait(job, ["RUNNING"], 60) == "RUNNING"
        time.sleep(3)
        env_r = next(e for e in _lines(raised) if e.get("ev") == "start")["env"]
        env_e = next(e for e in _lines(escaped) if e.get("ev") == "start")["env"]
        # no MPS on CPU
        assert env_r["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=70G" and "COLOC_SHARE" in env_r
        assert "CUDA_MPS_PIPE_DIRECTORY" not in env_e and "COLOC_SHARE" in env_e
        for job in (neighbour, raised, escaped):
            subprocess.run([f"{ROOT}/bin/scancel", str(job)], env=_env("root"), timeout=30)
        return
    states = {job: _wait(job, ["CANCELLED", "FAILED", "COMPLETED"], 120) for job in (raised, escaped)}
    assert _wait(neighbour, ["COMPLETED", "FAILED", "CANCELLED"], 120) == "COMPLETED"
    nb = _lines(neighbour)
    done = [e for e in nb if e.get("ev") == "done"]
    assert done and done[0]["ok"], done  # no OOM, no error

    db = _node_db()
    rows = {r[0]: r for r in db.execute("SELECT job_id, reason, grant_mib, used_mib, ts, outcome_json "
                                        "FROM watchdog_events")}
    report = {}
    for job in (raised, escaped):
        assert job in rows, (job, states, rows)
        _, reason, grant, used, ts, outcome_s = rows[job]
        outcome = json.loads(outcome_s)
        ev = _lines(job)
        allocs = [e for e in ev if e.get("ev") == "alloc" and e.get("ok")]
        over = [e for e in allocs if e.get("total_gib", e.get("gib", 0)) * 1024 > grant + 512]
        # killed before allocating (an outside-MPS context is seen as soon as it exists): from the moment the
        # process began creating its CUDA context, not from its start (which includes importing torch)
        t_first = next((e["t"] for e in ev if e.get("ev") == "cuda_init"),
                       next((e["t"] for e in ev if e.get("ev") in ("ctx", "start")), t_attack))
        t_over = over[0]["t"] if over else t_first
        peak = db.execute("SELECT MAX(used_mem_mib) FROM proc_samples WHERE job_id = ?", [job]).fetchone()[0]
        report[job] = {"reason": reason, "grant_mib": grant, "used_mib_at_detection": used,
                       "peak_nvml_mib": peak,
                       "allocated_gib": max((e.get("total_gib", e["gib"]) for e in allocs),
                                                                   default=0),
                       "stop_s": round(outcome["kill_ts"] - t_over, 3), "state": states[job],
                       "scancel": outcome.get("scancel"), "stderr": outcome.get("stderr")}
        assert outcome["killed"] and outcome.get("scancel") == "ok", outcome
        assert report[job]["stop_s"] <= BOUND_S, report
        assert any(e.get("ev") == "text" and "stopped by the GPU watchdog" in e["text"] for e in ev)
    rates = [(e["t"], e["it"]) for e in nb if e.get("ev") == "rate"]
    per_s = [((t1 + t0) / 2, (n1 - n0) / (t1 - t0)) for (t0, n0), (t1, n1) in zip(rates, rates[1:])]
    t_last_kill = max(json.loads(rows[j][5])["kill_ts"] for j in (raised, escaped))
    before = [r for t, r in per_s if t < t_attack]
    during = [r for t, r in per_s if t_attack <= t <= t_last_kill + 5]
    dip = {"before_it_s": round(statistics.median(before), 1), "min_during_it_s": round(min(during), 1),
           "dip_pct": round(100 * (1 - min(during) / statistics.median(before)), 1)}
    print("HOSTILE_TENANT", json.dumps({"offenders": report, "neighbour": dip}, indent=1))
