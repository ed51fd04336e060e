"""``coloc-replay run --mode throughput`` end to end on a real Slurm cluster with typed shards (the fixtures
of ``test_placement_cluster.py``: 2 slurmd x 2 fake GPUs), with a ``coloc-placer run`` daemon under
``placement_policy: throughput``: the tiny trace's two tasks are submitted held, the placer steers them onto
typed GPUs (spread: one per GPU), both complete, and the result carries the worst slowdowns and SM activity
per GPU.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_coloc.placement.heartbeat import placer_alive, placer_policy
from tests.cluster import test_placement_cluster as base
from tests.cluster.test_placement_cluster import _cfg
from tests.slurm_cluster import REPO, Cluster

pytestmark = pytest.mark.slurm
DATA = REPO / "tests" / "data" / "carma"
typed_cluster = base.typed_cluster
cl = base.cl


def test_replay_throughput_mode_steered_by_a_throughput_placer(cl: Cluster) -> None:
    bin_dir = Path(sys.executable).parent
    placer = subprocess.Popen([str(bin_dir / "coloc-placer"), "run"], env={
        **cl.env, "COLOC_PLACEMENT_POLICY": "throughput", "COLOC_PLACEMENT_INTERVAL_S": "0.5"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        for _ in range(100):
            if placer_alive(_cfg(cl)):
                break
            time.sleep(0.2)
        assert placer_policy(_cfg(cl)) == "throughput"
        env = {"COLOC_BENCH_PY": sys.executable, "COLOC_BENCH_DIR": str(REPO / "benchmarks" / "device"),
               "OMP_NUM_THREADS": "1"}
        out = cl.run([str(bin_dir / "coloc-replay"), "run",
                      "--trace", str(DATA / "traces" / "tiny-2.csv"),
                      "--catalog", str(DATA / "workload_catalog_from_rad.csv"),
                      "--runtimes", str(DATA / "exclusive_run_summary.csv"),
                      "--time-scale", "0.1", "--work-scale", "1e-6", "--mode", "throughput",
                      "--job-script", str(REPO / "benchmarks" / "device" / "job_generic.sh"),
                      "--out-dir", str(cl.jobs_dir), "--deadline-s", "240", "--json"], env=env, timeout=600)
        assert out.returncode == 0, out.stderr
        m = json.loads(out.stdout)["throughput"]
        assert (m["tasks"], m["completed"], m["lost"], m["oom_retries"]) == (2, 2, 0, 0), m
        assert m["problems"] == [] and m["max_slowdown"] is not None and m["max_run_slowdown"] is not None
        assert "smact_pct_per_gpu" in m
        jobs = [int(j) for j in m["jobs"].values()]
        records = {j["job_id"]: j for j in cl.squeue()}
        assert all("\"place\":true" in (records[j]["comment"] or "").replace(" ", "") for j in jobs)
    finally:
        os.killpg(placer.pid, signal.SIGTERM)
        _, err = placer.communicate(timeout=30)
    steered = [ln for ln in err.splitlines() if "-> n" in ln]
    assert len(steered) == 2, err[-3000:]
    assert len({ln.split("-> ")[1].split(" ")[0] for ln in steered}) == 2  # spread: one GPU each
