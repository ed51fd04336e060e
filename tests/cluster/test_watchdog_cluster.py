"""The watchdog against hostile jobs under real Slurm (no GPU here): real Prologs set up MPS (TEST DOUBLE of
``nvidia-cuda-mps-control``, tests/test_mps_lifecycle.py) and the fences; the sampler replays one NVML frame
built from the process lists MEASURED on the H100 during the hostile run (``escape_kill`` in
``benchmarks/device/results/h100-mps-limits/mps_limits.json``: a neighbour MPS client at 9,158 MiB, an MPS
client that raised its fence and a client that left MPS, each at 21,092 MiB, the MPS server at 66 MiB), with
the recorded pids replaced by the live processes of three real Slurm jobs. The watchdog must SIGKILL the
offenders' processes, scancel them, write its line into their output files as their users, record the events,
and leave the neighbour running. The real GPU version is tests/gpu/test_hostile_tenant.py.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Dict, Iterator

import pytest

from slurm_coloc.config import load
from slurm_coloc.node.sampler import Sampler
from slurm_coloc.nvml import ReplayReader
from slurm_coloc.store import oom as store_oom
from slurm_coloc.store.db import open_readonly
from tests.cluster.test_mps_lifecycle import FAKE_MPS, configure, job_env, submit
from tests.slurm_cluster import Cluster, host_lock, start_cluster, stop_cluster

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[2]
LIMITS = REPO / "benchmarks" / "device" / "results" / "h100-mps-limits" / "mps_limits.json"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
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


def _first_sleep_of(c: Cluster, job_id: int, timeout_s: float = 20.0) -> int:
    """The pid of the job's running ``sleep`` (found through /proc environ, as the sampler attributes it; of
    this cluster: another session's cluster may run a job of the same id)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        for p in Path("/proc").iterdir():
            if not p.name.isdigit():
                continue
            try:
                if (p / "cmdline").read_bytes().startswith(b"sleep\0") and \
                        f"SLURM_JOB_ID={job_id}\0".encode() in (env := (p / "environ").read_bytes()) and \
                        c.owns_environ(env):
                    return int(p.name)
            except OSError:
                continue
        time.sleep(0.2)
    raise TimeoutError(f"no sleep process of job {job_id}")


def _recording(path: Path, gpu_of: Dict[int, int], pid_of: Dict[int, int]) -> Path:
    """One frame: the measured lists, each recorded pid on the GPU its stand-in job holds."""
    row = next(r for r in json.loads(LIMITS.read_text())["rows"] if r["scenario"] == "escape_kill")
    lists: Dict[int, Dict[str, list]] = {}
    for kind in ("compute", "mps"):
        for pid_s, mib in row[f"{kind}_list_pids"].items():
            gpu = gpu_of.get(int(pid_s), 0)
            lists.setdefault(gpu, {"compute": [], "mps": []})[kind].append([int(pid_s), float(mib)])
    header = {"recording": "one frame built from NVML process lists measured on an NVIDIA H100 80GB HBM3 "
                           "(benchmarks/device/results/h100-mps-limits/mps_limits.json, escape_kill)",
              "pids": {str(k): v for k, v in pid_of.items()}}
    frame = {"t": 0.0, "gpus": [{"index": g} for g in sorted(lists)],
             "procs": [], "lists": [{"gpu_index": g, **v} for g, v in sorted(lists.items())]}
    path.write_text(json.dumps(header) + "\n" + json.dumps(frame) + "\n")
    return path


def test_offenders_stopped_neighbour_untouched(cluster: Cluster, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    configure(cluster)
    # the shell outlives one sleep
    script = "env | grep -E '^(SLURM_JOB_GPUS|COLOC_SHARE)='; sleep 60; sleep 60"
    neighbour = submit(cluster, "shard:10", script, "colocuser", "-w", "n1")
    raised = submit(cluster, "shard:2", script, "colocuser2", "-w",
                    "n1")   # stands in for pid 1132 (MPS, 0=70G)
    escaped = submit(cluster, "shard:2", script, "colocuser", "-w", "n1")   # stands in for pid 1110 (no MPS)
    jobs = {1080: neighbour, 1132: raised, 1110: escaped}
    pid_map = {rec: _first_sleep_of(cluster, jid) for rec, jid in jobs.items()}
    gpu_of = {rec: int(job_env(cluster, jid)["SLURM_JOB_GPUS"]) for rec, jid in jobs.items()}
    assert all(job_env(cluster, jid)["COLOC_SHARE"] == "mps" for jid in jobs.values())
    rec = _recording(tmp_path / "hostile.jsonl", gpu_of, pid_map)

    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))  # the sampler's environment (the Prolog passes it)
    cfg = load(str(cluster.coloc_config))
    s = Sampler(cfg, "n1", ReplayReader(str(rec), pid_map))
    t0 = time.monotonic()
    s.run(max_frames=3)
    s.watchdog.join()
    assert time.monotonic() - t0 < 1.0  # 2 frames to confirm, 0.1 s apart

    for jid in (raised, escaped):
        job = cluster.wait_job(jid, timeout=60)
        assert job["job_state"] == "CANCELLED", job
        out = (cluster.jobs_dir / f"{jid}.out").read_text()
        assert f"slurm-coloc: job {jid} stopped by the GPU watchdog" in out, out
    assert cluster.job(neighbour)["job_state"] == "RUNNING"  # and its sleep was never signalled
    assert os.path.exists(f"/proc/{pid_map[1080]}")

    evs = {e.job_id: e for e in store_oom.load_events(open_readonly(cluster.node_db("n1")))}
    assert set(evs) == {raised, escaped}
    assert (evs[raised].reason, evs[raised].grant_mib, evs[raised].used_mib) == ("over-grant", 2048, 21092)
    assert evs[escaped].reason in ("over-grant", "outside-mps") and evs[escaped].pids == (pid_map[1110],)
    for ev in evs.values():
        assert ev.outcome["scancel"] == "ok" and ev.outcome["stderr"] == "written", ev.outcome
        assert ev.outcome["killed"] and ev.outcome["kill_ts"] - ev.ts < 0.5
    cluster.run(["scancel", str(neighbour)], user=None)
    assert cluster.wait_job(neighbour)["job_state"] == "CANCELLED"


def _escaped_sleep(c: Cluster, uid: int, claim: int, timeout_s: float = 20.0) -> int:
    """The pid of a ``sleep 120`` of ``uid`` whose environment claims job ``claim`` (an escaped process of a
    job of this cluster)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        for p in Path("/proc").iterdir():
            try:
                if p.name.isdigit() and (p / "cmdline").read_bytes() == b"sleep\x00120\x00" \
                        and p.stat().st_uid == uid \
                        and f"SLURM_JOB_ID={claim}\0".encode() in (env := (p / "environ").read_bytes()) \
                        and c.owns_environ(env):
                    return int(p.name)
            except OSError:
                continue
        time.sleep(0.2)
    raise TimeoutError("no escaped sleep")


def test_a_process_in_a_user_made_job_cgroup_cannot_get_another_users_job_stopped(
        cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """N4 (and N7's claim): colocuser2's process leaves its job (``setsid``, re-parented to init),
    claims colocuser's job in its environment and sits in ``.../user@2002.service/app.slice/job_<victim>`` (a
    cgroup its systemd user manager lets it create; made here by root on this host's cgroup v2 hierarchy,
    owned by 2002). The sampler replays one frame in which that process holds 21,092 MiB (the H100 figure
    above) on the victim's GPU. Before: attributed to the victim, whose job the watchdog cancelled. Now:
    attributed to no job; the victim runs."""
    from slurm_coloc.node.attribution import cgroup_mounts

    mounts = cgroup_mounts()
    if "" not in mounts:
        pytest.skip("no cgroup v2 hierarchy on this host")
    configure(cluster)
    victim = submit(cluster, "shard:2", "env | grep -E '^(SLURM_JOB_GPUS|COLOC_SHARE)='; sleep 60; sleep 60",
                    "colocuser", "-w", "n1")
    victim_sleep = _first_sleep_of(cluster, victim)
    escape = f"(setsid env SLURM_JOB_ID={victim} sleep 120 < /dev/null > /dev/null 2>&1 &); sleep 60"
    attacker = submit(cluster, "shard:2", escape, "colocuser2", "-w",
                      "n1")  # double fork: out of Slurm's tracking
    pid = _escaped_sleep(cluster, 2002, victim)
    # the cgroup's path is fixed by the attack (user 2002's app.slice), not by this session: sessions side by
    # side take turns making and removing it
    with host_lock("cgroup-user-2002"):
        made = []
        d = Path(mounts[""])
        for part in f"user.slice/user-2002.slice/user@2002.service/app.slice/job_{victim}".split("/"):
            d = d / part
            if not d.exists():
                d.mkdir()
                made.append(d)
        os.chown(d, 2002, 2002)
        (d / "cgroup.procs").write_text(str(pid))
        try:
            gpu = int(job_env(cluster, victim)["SLURM_JOB_GPUS"])
            rec = tmp_path / "n4.jsonl"
            rec.write_text(json.dumps({"recording": "one frame: the H100 figure of an escaped client (21,092 "
                                                    "MiB), "
                                                    "mps_limits.json escape_kill, on the victim's GPU",
                                       "pids": {"1110": pid}}) + "\n" +
                           json.dumps({"t": 0.0, "gpus": [{"index": gpu}], "procs": [],
                                       "lists": [{"gpu_index": gpu, "compute": [[1110, 21092.0]],
                                                  "mps": [[1110, 21092.0]]}]}) + "\n")
            monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
            s = Sampler(load(str(cluster.coloc_config)), "n1", ReplayReader(str(rec), {1110: pid}))
            assert s.attr.job_of(pid) is None, open(f"/proc/{pid}/status").read()
            s.run(max_frames=3)
            s.watchdog.join()
            time.sleep(1)
            assert cluster.job(victim)["job_state"] == "RUNNING" and os.path.exists(f"/proc/{victim_sleep}")
            events = store_oom.load_events(open_readonly(cluster.node_db("n1")))
            assert victim not in {e.job_id for e in events}
        finally:
            os.kill(pid, 9)
            cluster.run(["scancel", str(victim), str(attacker)], user=None)
            for m in reversed(made):
                for _ in range(50):
                    try:
                        m.rmdir()
                        break
                    except OSError:
                        time.sleep(0.1)
