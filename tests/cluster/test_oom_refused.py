"""OOM recovery when sbatch refuses the rerun: the failure is recorded, told to the user in their
stderr file and shown by coloc-report; never silent. Injection: after the job starts, its partition stops
admitting the user's group (``AllowGroups=root``), so ``sbatch --uid`` of the rerun is refused by Slurm
itself.
"""
from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from slurm_coloc.store import oom as store_oom
from slurm_coloc.store.db import open_ctld_db
from tests.slurm_cluster import REPO, Cluster

pytestmark = pytest.mark.slurm
USER = "colocuser"


def test_refused_rerun_is_recorded_and_shown(slurm_cluster: Cluster) -> None:
    c = slurm_cluster
    c.scontrol("create", "PartitionName=oomrefuse", "Nodes=n1", "State=UP", "MaxTime=INFINITE")
    work = c.jobs_dir / f"refuse-{os.getpid()}"
    work.mkdir()
    shutil.chown(work, USER, USER)
    shutil.copy(REPO / "examples" / "oom_job.sh", work / "oom_job.sh")
    (work / "slow_oom.sh").write_text(f"#!/bin/bash\nsleep 6\nexec {work / 'oom_job.sh'} 8\n")
    for p in work.iterdir():
        os.chmod(p, 0o755)
    try:
        out = c.run(["sbatch", "--parsable", "-p", "oomrefuse", "-J", "oom-refused", "--gres=shard:4",
                     "-o", "r.out", "-e", "r.err", str(work / "slow_oom.sh")], cwd=work)
        assert out.returncode == 0, out.stderr
        job_id = int(out.stdout.strip())
        c.wait_state(job_id, ["RUNNING"], timeout=60)
        c.scontrol("update", "PartitionName=oomrefuse", "AllowGroups=root")
        assert c.wait_job(job_id, timeout=120)["job_state"] == "FAILED"
        row = None
        for _ in range(60):
            row = store_oom.load_oom_event(open_ctld_db(c.ctld_db), job_id)
            if row is not None and row.retry_status != "submitting":
                break
            time.sleep(0.5)
        assert row is not None and row.retry_status == "failed", row
        assert row.retry_error and row.retry_job_id is None
        assert not [j for j in c.squeue() if f"oom-retry-of-{job_id}" in (j.get("comment") or "")]
        err = (work / "r.err").read_text()
        assert "could NOT be submitted" in err and "coloc-sbatch --exclusive-gpu" in err
        report = c.run(["coloc-report", "--json", "--job", str(job_id)], user=USER)
        assert report.returncode == 0, report.stderr
        view = next(j for j in json.loads(report.stdout)["jobs"] if j["job_id"] == job_id)
        assert view["oom"] is True and view["retry_status"] == "failed"
    finally:
        c.scontrol("delete", "PartitionName=oomrefuse")
