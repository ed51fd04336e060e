"""Honest jobs that outgrow their 2 GiB grant get their OOM rerun, whatever their allocation pattern, and fake
OOM lines do not ("the lost rerun"), on a real Slurm cluster of any version (``COLOC_SLURM``).

No GPU here: while each 2-shard job runs, the test stores what the sampler would have recorded for it
(tests/oom_patterns.py, SYNTHETIC series, through the sampler's own ``write_rows`` into the node database);
the job then prints PyTorch's OOM message and fails. The real EpilogSlurmctld reads that evidence, the job's
stderr and the budget, and reruns it on a whole GPU, where the job sees 80 shards and completes. The same
patterns run on a real GPU in tests/gpu/test_honest_rerun.py.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Dict, List

import pytest

from slurm_coloc.store import oom as store_oom
from slurm_coloc.store.db import open_readonly
from tests.oom_patterns import GRANT_SHARDS, PATTERNS, write_pattern
from tests.slurm_cluster import Cluster

pytestmark = pytest.mark.slurm
USER = "colocuser"
JOB = """#!/bin/bash
if [ "${{SLURM_SHARDS_ON_NODE:-0}}" -ge 80 ]; then
    echo "{name}: rerun done on $SLURM_SHARDS_ON_NODE shards"; exit 0
fi
for i in $(seq 600); do [ -e "$1" ] && break; sleep 0.2; done
echo '{message}' >&2
exit 1
"""


def _retries_of(c: Cluster, job_id: int) -> List[dict]:
    return [j for j in c.squeue() if f"oom-retry-of-{job_id}" in (j.get("comment") or "").split()]


@pytest.fixture(scope="module")
def patterns(slurm_cluster: Cluster) -> Dict[str, Dict]:
    c = slurm_cluster
    work = c.jobs_dir / f"honest-{os.getpid()}"
    work.mkdir()
    shutil.chown(work, USER, USER)
    flags = c.dir / f"flags-{os.getpid()}"
    flags.mkdir(mode=0o755)
    jobs: Dict[str, Dict] = {}
    for name, (_, message, _) in PATTERNS.items():
        script = work / f"{name}.sh"
        script.write_text(JOB.format(name=name, message=message))
        shutil.chown(script, USER, USER)
        script.chmod(0o755)
        out = c.run(["sbatch", "--parsable", "-J", name, f"--gres=shard:{GRANT_SHARDS}", "-t", "5",
                     "-o", f"{name}.out", "-e", f"{name}.err", str(script), str(flags / name)], user=USER,
                     cwd=work)
        assert out.returncode == 0, out.stderr
        jobs[name] = {"id": int(out.stdout.strip().split(";")[0])}
    for name, job in jobs.items():
        rec = c.wait_state(job["id"], ["RUNNING"], timeout=120)
        t0 = max(float(rec.get("start_time") or 0), time.time() - 1) + 0.1
        write_pattern(c.node_db(rec["nodes"]), job["id"], PATTERNS[name][0], t0=t0)
        (flags / name).touch()
    for job in jobs.values():
        job["final"] = c.wait_job(job["id"], timeout=120)
    time.sleep(2)  # the EpilogSlurmctld runs after the state flips
    return {"dir": work, "jobs": jobs}


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_honest_pattern_gets_one_rerun_that_completes_and_fakes_none(slurm_cluster: Cluster, patterns,
                                                                      name: str) -> None:
    """Before the fix, ``one-alloc-first-step`` was not rerun ("the sampler watched its GPU and saw no memory
    of this job")."""
    c, job = slurm_cluster, patterns["jobs"][name]
    assert job["final"]["job_state"] == "FAILED"
    deadline = time.time() + 30
    row = None
    while time.time() < deadline and (row is None or row.retry_status == "submitting"):
        row = store_oom.load_oom_event(open_readonly(c.ctld_db), job["id"])
        time.sleep(0.5)
    assert row is not None, f"no oom_events row for {name}"
    honest = PATTERNS[name][2]
    if not honest:
        assert row.retry_status == "not-retried" and _retries_of(c, job["id"]) == [], row.retry_reason
        return
    assert row.retry_status == "submitted", row.retry_reason
    retries = _retries_of(c, job["id"])
    assert len(retries) == 1
    done = c.wait_job(retries[0]["job_id"], timeout=180)
    assert done["job_state"] == "COMPLETED" and done["tres_per_node"].endswith("shard:80")
    out = (Path(patterns["dir"]) / f"{name}.out").read_text()
    assert f"{name}: rerun done on 80 shards" in out
