"""MPS lifecycle through the real Prolog/TaskProlog/Epilog of a real local Slurm cluster (no GPU here).

CI has no NVIDIA driver, so ``nvidia-cuda-mps-control`` is a TEST DOUBLE written below (a shell script that
daemonizes a sleeper named like the real daemon, writes the pid file where the real one does, logs its argv
and CUDA_VISIBLE_DEVICES, and quits on ``quit``). Everything else is real: slurmd runs the hooks, jobs print
the environment TaskProlog gave them, the node database is real SQLite. The real binary is exercised on the
device (tests/gpu/test_node_gpu.py).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Dict, Iterator

import pytest

from slurm_coloc.store import samples as st
from slurm_coloc.store.db import open_readonly
from tests.slurm_cluster import Cluster, start_cluster, stop_cluster

pytestmark = pytest.mark.slurm

FAKE_MPS = """#!/bin/bash
# TEST DOUBLE of nvidia-cuda-mps-control for CI (no NVIDIA driver). Not used on GPU machines.
P=$CUDA_MPS_PIPE_DIRECTORY
if [ "$1" = -d ]; then
  echo "start $* CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES" >> "$CUDA_MPS_LOG_DIRECTORY/control.log"
  setsid bash -c 'exec -a nvidia-cuda-mps-control sleep 600' </dev/null >/dev/null 2>&1 &
  echo $! > "$P/nvidia-cuda-mps-control.pid"
  exit 0
fi
read -r cmd
if [ "$cmd" = quit ]; then
  echo "quit" >> "$CUDA_MPS_LOG_DIRECTORY/control.log"
  kill "$(cat "$P/nvidia-cuda-mps-control.pid")" && rm -f "$P/nvidia-cuda-mps-control.pid"
  exit 0
fi
echo "cmd $cmd" >> "$CUDA_MPS_LOG_DIRECTORY/control.log"
# a test lists fake MPS server pids in fake_servers (no real server: no CUDA client here)
if [ "$cmd" = get_server_list ] && [ -f "$P/fake_servers" ]; then cat "$P/fake_servers"; fi
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if os.geteuid() != 0:
        pytest.skip("the local Slurm cluster needs root")
    c = start_cluster()
    bindir = c.dir / "fakebin"
    bindir.mkdir(mode=0o755)
    fake = bindir / "nvidia-cuda-mps-control"
    fake.write_text(FAKE_MPS)
    fake.chmod(0o755)
    try:
        yield c
    finally:
        stop_cluster(c)


def configure(c: Cluster, **extra: object) -> None:
    """Rewrite the cluster's coloc.yaml (hooks read it on every run)."""
    base = {"state_dir": str(c.state_dir), "run_dir": str(c.dir / "coloc" / "run"),
            "log_dir": str(c.dir / "log"),
            "slurm_bin_dir": c.bin_dir, "gpu_mem_gib": 80, "sampler_autostart": False,
            "mps_control_bin": str(c.dir / "fakebin" / "nvidia-cuda-mps-control")}
    base.update(extra)
    c.coloc_config.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in base.items()))


def submit(c: Cluster, gres: str, script: str, user: str = "colocuser", *extra: str) -> int:
    res = c.run(["sbatch", "--parsable", f"--gres={gres}", "-o", f"{c.jobs_dir}/%j.out", *extra, "--wrap",
                 script],
                user=user)
    assert res.returncode == 0, res.stderr
    return int(res.stdout.strip().split(";")[0])


def job_env(c: Cluster, job_id: int) -> Dict[str, str]:
    text = (c.jobs_dir / f"{job_id}.out").read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def events(c: Cluster, node: str, job_id: int) -> list:
    return [e["kind"] for e in st.load_node_events(open_readonly(c.node_db(node)), job_id)]


def run_dir(c: Cluster) -> Path:
    return c.dir / "coloc" / "run"


def test_shard_job_gets_mps_env_and_daemon_stops_after(cluster: Cluster) -> None:
    configure(cluster)
    jid = submit(cluster, "shard:5", "env | grep -E '^(CUDA|COLOC|SLURM_JOB_GPUS)' | sort")
    job = cluster.wait_job(jid)
    assert job["job_state"] == "COMPLETED"
    env = job_env(cluster, jid)
    node, gpu = job["nodes"], env["SLURM_JOB_GPUS"]
    daemon_dir = run_dir(cluster) / "mps" / f"idx{gpu}"
    assert env["COLOC_SHARE"] == "mps"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=5G"
    assert env["CUDA_VISIBLE_DEVICES"] == "0"  # MPS remaps the daemon's one GPU to device 0
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(daemon_dir / "pipe")
    assert env["CUDA_MPS_LOG_DIRECTORY"] == str(daemon_dir / "log")
    control_log = (daemon_dir / "log" / "control.log").read_text().splitlines()
    # the ceiling (the job's grant) goes to the control daemon before any client can start a server
    assert control_log[-4:] == [f"start -d -M CUDA_VISIBLE_DEVICES={gpu}",
                                "cmd set_default_device_pinned_mem_limit 0 5G", "cmd get_server_list", "quit"]
    assert not (run_dir(cluster) / "jobs" / f"{jid}.env").exists()
    assert not (daemon_dir / "pipe" / "nvidia-cuda-mps-control.pid").exists()
    assert events(cluster, node, jid) == ["mps-start", "mps-stop"]


def test_env_file_is_root_owned_0644_while_job_runs(cluster: Cluster) -> None:
    configure(cluster)
    jid = submit(cluster, "shard:3", "sleep 4")
    cluster.wait_state(jid, ["RUNNING"])
    path = run_dir(cluster) / "jobs" / f"{jid}.env"
    for _ in range(50):
        if path.exists():
            break
        time.sleep(0.1)
    stt = path.stat()
    assert stt.st_uid == 0 and oct(stt.st_mode & 0o777) == "0o644"
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=3G\n" in path.read_text()
    cluster.wait_job(jid)
    assert not path.exists()


def test_two_shard_jobs_share_one_daemon_stopped_by_the_last(cluster: Cluster) -> None:
    configure(cluster)
    a = submit(cluster, "shard:40", "env | grep ^SLURM_JOB_GPUS; sleep 6", "colocuser", "-w", "n2")
    cluster.wait_state(a, ["RUNNING"])
    b = submit(cluster, "shard:30", "env | grep -E '^(SLURM_JOB_GPUS|COLOC_SHARE)'", "colocuser2", "-w", "n2")
    ja, jb = cluster.wait_job(a), cluster.wait_job(b)
    assert ja["job_state"] == jb["job_state"] == "COMPLETED"
    node = "n2"
    if job_env(cluster, a)["SLURM_JOB_GPUS"] != job_env(cluster, b)["SLURM_JOB_GPUS"]:
        pytest.skip("the scheduler put the second job on the other GPU")
    ev_a, ev_b = events(cluster, node, a), events(cluster, node, b)
    assert ev_a[0] == "mps-start" and ev_b[0] == "mps-running"  # one daemon for the GPU
    assert ev_b[-1] == "mps-kept" and ev_a[-1] == "mps-stop"    # b ended first: a was still using it
    assert job_env(cluster, b)["COLOC_SHARE"] == "mps"


def test_ceiling_follows_the_largest_grant_through_real_prologs(cluster: Cluster) -> None:
    """A small job, then a larger one on its GPU (raise), the larger ends first (lower, for new clients
    only)."""
    configure(cluster)
    a = submit(cluster, "shard:10", "env | grep ^SLURM_JOB_GPUS; sleep 8", "colocuser", "-w", "n2")
    cluster.wait_state(a, ["RUNNING"])
    time.sleep(1)
    b = submit(cluster, "shard:30", "env | grep ^SLURM_JOB_GPUS; sleep 1", "colocuser2", "-w", "n2")
    jb = cluster.wait_job(b)
    ja = cluster.wait_job(a)
    assert ja["job_state"] == jb["job_state"] == "COMPLETED"
    gpu = job_env(cluster, a)["SLURM_JOB_GPUS"]
    if job_env(cluster, b)["SLURM_JOB_GPUS"] != gpu:
        pytest.skip("the scheduler put the second job on the other GPU")
    log = (run_dir(cluster) / "mps" / f"idx{gpu}" / "log" / "control.log").read_text().splitlines()
    last_start = max(k for k, ln in enumerate(log) if ln.startswith("start"))
    sets = [ln.split()[-1] for ln in log[last_start:]
            if ln.startswith("cmd set_default_device_pinned_mem_limit")]
    assert sets == ["10G", "30G", "10G"], log
    assert log[-1] == "quit"


def test_whole_gpu_job_gets_no_mps(cluster: Cluster) -> None:
    configure(cluster)
    for gres in ("gpu:1", "shard:80"):
        jid = submit(cluster, gres, "env | grep -E '^(CUDA|COLOC)' | sort; echo END=1")
        job = cluster.wait_job(jid)
        assert job["job_state"] == "COMPLETED"
        env = job_env(cluster, jid)
        assert "COLOC_SHARE" not in env and not any(k.startswith("CUDA_MPS") for k in env), env
        assert events(cluster, job["nodes"], jid) == []


def test_missing_mps_binary_job_runs_time_sliced(cluster: Cluster) -> None:
    configure(cluster, mps_control_bin="/nonexistent/nvidia-cuda-mps-control")
    jid = submit(cluster, "shard:4", "env | grep -E '^(CUDA|COLOC)' | sort; echo END=1")
    job = cluster.wait_job(jid)
    assert job["job_state"] == "COMPLETED"
    env = job_env(cluster, jid)
    assert env["COLOC_SHARE"] == "timeslice"
    assert not any(k.startswith("CUDA_MPS") for k in env), env
    assert events(cluster, job["nodes"], jid) == ["mps-missing"]
    assert set(cluster.node_states().values()) <= {"idle", "mix"}  # never drained


def test_mps_mode_off_and_per_user(cluster: Cluster) -> None:
    configure(cluster, mps_mode="off")
    jid = submit(cluster, "shard:2", "env | grep ^COLOC_SHARE")
    job = cluster.wait_job(jid)
    assert job_env(cluster, jid)["COLOC_SHARE"] == "timeslice" and events(cluster, job["nodes"], jid) == []
    configure(cluster, mps_mode="per-user")
    jid = submit(cluster, "shard:2", "env | grep ^COLOC_SHARE")
    job = cluster.wait_job(jid)
    assert job_env(cluster, jid)["COLOC_SHARE"] == "mps"
    logs = list((run_dir(cluster) / "mps").glob("idx*/log/control.log"))
    starts = [ln for p in logs for ln in p.read_text().splitlines() if ln.startswith("start")]
    assert any(ln.startswith("start -d CUDA_VISIBLE_DEVICES=") for ln in starts), starts  # no -M
    per_user = [ln for p in logs if ".uid" in str(p) for ln in p.read_text().splitlines()]
    # that user's grant, sent as the user
    assert "cmd set_default_device_pinned_mem_limit 0 2G" in per_user, per_user
