"""OOM evidence from the sampler: a job that fails silently while its GPU memory sits at its fence is an OOM
death ("the sampler's evidence"), and one that fails well below its fence is not."""
from __future__ import annotations

import time

import pytest

from slurm_coloc.store import oom as store_oom
from slurm_coloc.store.db import open_ctld_db, open_node_db
from slurm_coloc.store.samples import write_rows
from tests.slurm_cluster import Cluster

pytestmark = pytest.mark.slurm
SCRIPT = "#!/bin/sh\n#SBATCH -w n1\nsleep 5\necho 'died without a message' >&2\nexit 1\n"


def _run_with_samples(c: Cluster, name: str, used_mib: float) -> int:
    script = c.jobs_dir / f"{name}.sh"
    script.write_text(SCRIPT)
    script.chmod(0o644)
    out = c.run(["sbatch", "--parsable", "-J", name, "--gres=shard:2", "-o", f"{name}.out", str(script)])
    assert out.returncode == 0, out.stderr
    job_id = int(out.stdout.strip())
    c.wait_state(job_id, ["RUNNING"], timeout=60)
    now = time.time()
    row = {"ts": now, "gpu_index": 0, "pid": 424242, "job_id": job_id, "used_mem_mib": used_mib,
           "sm_util_pct": None, "mem_util_pct": None, "mps_client": 1, "n": 1, "res_s": 1.0}
    write_rows(open_node_db(c.node_db("n1")), [], [row])  # what the sampler writes on a GPU node
    c.wait_job(job_id, timeout=90)
    return job_id


def _oom_row(c: Cluster, job_id: int, timeout: float = 20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        row = store_oom.load_oom_event(open_ctld_db(c.ctld_db), job_id)
        if row is not None:
            return row
        time.sleep(0.5)
    return None


def test_memory_at_fence_counts_as_oom(slurm_cluster: Cluster):
    job_id = _run_with_samples(slurm_cluster, "fence-hit", used_mib=2048.0)
    row = _oom_row(slurm_cluster, job_id)
    assert row is not None, "no OOM recorded for a job whose memory sat at its 2 GiB fence"
    assert "at its fence" in row.evidence["decision"] and row.evidence["sampler_peak_mib"] == 2048
    assert row.fence_mib == 2048 and row.retry_status in ("submitting", "submitted")


def test_memory_far_below_fence_is_not_oom(slurm_cluster: Cluster):
    job_id = _run_with_samples(slurm_cluster, "fence-far", used_mib=600.0)
    assert _oom_row(slurm_cluster, job_id, timeout=6) is None
