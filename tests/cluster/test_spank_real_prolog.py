"""The SPANK plugin delivers what the REAL node Prolog prepared, with TaskProlog off:
a shard job sees its MPS pipe directory and memory fence in the batch step and in an srun step; a whole-GPU
job sees no MPS variables. The MPS control binary is the CI test double of tests/test_mps_lifecycle.py.
"""
from __future__ import annotations

import os
import subprocess
from typing import Dict, Iterator

import pytest

from tests.cluster.test_mps_lifecycle import FAKE_MPS, configure, run_dir
from tests.slurm_cluster import REPO, Cluster, slurm_version, start_cluster, stop_cluster

pytestmark = pytest.mark.slurm
JOB = "echo '== batch'; env; echo '== step'; srun -n1 env"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    if os.geteuid() != 0:
        pytest.skip("the local Slurm cluster needs root")
    so = REPO / "spank" / f"coloc_spank-{slurm_version()}.so"  # built against this version's headers
    subprocess.run(["make", "-s", "-C", str(REPO / "spank"), f"SLURM_VERSION={slurm_version()}",
                    f"OUT={so.name}"],
                   check=True)
    c = start_cluster()
    try:
        c.script("stop")
        plugstack = c.dir / "etc" / "plugstack.conf"
        plugstack.write_text(f"required {so} run_dir={run_dir(c)}\n")
        c.extra_env["COLOC_PLUGSTACK"] = str(plugstack)
        c.script("start")
        (c.dir / "etc" / "hooks" / "task_prolog.sh").write_text("#!/bin/sh\nexit 0\n")  # SPANK path only
        fake = c.dir / "fakebin" / "nvidia-cuda-mps-control"
        fake.parent.mkdir(mode=0o755)
        fake.write_text(FAKE_MPS)
        fake.chmod(0o755)
        configure(c)
        yield c
    finally:
        stop_cluster(c)


def step_envs(c: Cluster, job_id: int) -> Dict[str, Dict[str, str]]:
    out: Dict[str, Dict[str, str]] = {}
    cur = None
    for line in (c.jobs_dir / f"{job_id}.out").read_text().splitlines():
        if line.startswith("== "):
            cur = out.setdefault(line[3:], {})
        elif cur is not None and "=" in line:
            k, v = line.split("=", 1)
            cur[k] = v
    return out


def submit(c: Cluster, *args: str) -> int:
    res = c.run(["sbatch", "--parsable", "-o", f"{c.jobs_dir}/%j.out", *args, "--wrap", JOB])
    assert res.returncode == 0, res.stderr
    return int(res.stdout.strip())


def test_shard_job_gets_prolog_env_through_the_plugin(cluster: Cluster) -> None:
    jid = submit(cluster, "--gres=shard:5", "--coloc-mem=5G")
    job = cluster.wait_job(jid)
    assert job["job_state"] == "COMPLETED"
    envs = step_envs(cluster, jid)
    assert set(envs) == {"batch", "step"}
    for env in envs.values():
        gpu = env["SLURM_JOB_GPUS"]
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(run_dir(cluster) / "mps" / f"idx{gpu}" / "pipe")
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=5G"
        assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["COLOC_SHARE"] == "mps"


def test_whole_gpu_job_gets_no_mps_through_the_plugin(cluster: Cluster) -> None:
    jid = submit(cluster, "--gres=shard:80", "--coloc-share=exclusive")
    assert cluster.wait_job(jid)["job_state"] == "COMPLETED"
    for env in step_envs(cluster, jid).values():
        assert not any(k.startswith("CUDA_MPS_") for k in env), env
        assert env["COLOC_SHARE"] == "exclusive"
