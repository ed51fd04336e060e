"""The SPANK path under faults: the plugin (spank/coloc_spank.so, loaded through plugstack.conf, TaskProlog
off) copies the Prolog's env file into the task. When a fault kept the Prolog from writing it (database
locked, hook over budget, run directory gone, config unusable), the job still runs, unshared, and no node is
drained."""
from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
from typing import Iterator

import pytest

from tests.cluster.reliability.conftest import HOOK_BOUND_S, FaultCluster
from tests.slurm_cluster import REPO, start_cluster, stop_cluster

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def spank_fc() -> Iterator[FaultCluster]:
    if os.geteuid() != 0:
        pytest.skip("the local Slurm cluster needs root")
    subprocess.run(["make", "-s", "-C", str(REPO / "spank")], check=True)
    c = start_cluster()
    fc = FaultCluster(c)
    try:
        c.script("stop")
        plugstack = c.dir / "etc" / "plugstack.conf"
        plugstack.write_text(f"required {REPO / 'spank' / 'coloc_spank.so'} run_dir={fc.run_dir}\n")
        c.extra_env["COLOC_PLUGSTACK"] = str(plugstack)
        c.script("start")
        (c.dir / "etc" / "hooks" / "task_prolog.sh").write_text("#!/bin/sh\nexit 0\n")  # the SPANK path only
        fc.set_config()
        yield fc
    finally:
        stop_cluster(c)


def _env_of(fc: FaultCluster, script_stem: str, job: int) -> dict:
    text = (fc.c.jobs_dir / f"{script_stem}-{job}.out").read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def test_spank_delivers_env_without_faults(spank_fc: FaultCluster) -> None:
    script = spank_fc.script("spank-ok.sh", "env | grep -E '^(COLOC|CUDA_MPS)_' || true\n")
    rec = spank_fc.run_job(script)
    assert rec["job_state"] == "COMPLETED"
    assert _env_of(spank_fc, script.stem, rec["job_id"]).get("COLOC_SHARE") == "timeslice"  # the plugin works


@pytest.mark.parametrize("fault", ["db-locked", "hook-over-budget", "run-dir-gone", "config-bad-value"])
def test_spank_path_fault_job_runs_unshared(spank_fc: FaultCluster, fault: str) -> None:
    fc = spank_fc
    script = fc.script(f"spank-{fault}.sh", "env | grep -E '^(COLOC|CUDA_MPS)_' || true\necho ran\n")
    conns = []
    if fault == "db-locked":
        fc.run_job(fc.script("spank-warm.sh"))
        for p in (fc.ctld_db, fc.node_db("n1")):
            conns.append(sqlite3.connect(str(p), isolation_level=None))
            conns[-1].execute("BEGIN EXCLUSIVE")
    elif fault == "hook-over-budget":
        hang = fc.c.dir / "faultbin" / "mps-hang"
        hang.parent.mkdir(parents=True, exist_ok=True)
        hang.write_text("#!/bin/sh\nexec sleep 300\n")
        hang.chmod(0o755)
        fc.set_config(mps_control_bin=str(hang), mps_start_timeout_s=30)
    elif fault == "run-dir-gone":
        shutil.rmtree(fc.run_dir, ignore_errors=True)
        # a path under a regular file (ENOTDIR): the Prolog cannot create it, the plugin finds nothing
        fc.set_config(run_dir=str(fc.c.coloc_config.parent / "slurm.conf" / "run"))
    elif fault == "config-bad-value":
        fc.set_config(fc.c.coloc_config.read_text() + "gpu_mem_gib: many\n")
    try:
        job = fc.sbatch(script)
        rec = fc.c.wait_job(job, timeout=120)
        fc.wait_hooks(job, hooks=("epilog",))
    finally:
        for conn in conns:
            conn.execute("ROLLBACK")
            conn.close()
        fc.set_config()
    assert rec["job_state"] == "COMPLETED" and not fc.drained()
    env = _env_of(fc, script.stem, job)
    assert "COLOC_SHARE" not in env and not any(k.startswith("CUDA_MPS") for k in env), env
    assert all(ms <= HOOK_BOUND_S * 1000 for _, ms in fc.hook_durations_ms(job))
