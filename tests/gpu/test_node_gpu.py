"""Device tests of the node side (marker gpu): real MPS daemon, the memory fence, two users under multi-user
MPS, and the NVML + GPM sampler attributing processes to job ids. No Slurm on the device: the clients carry
``SLURM_JOB_ID`` in their environment exactly as a Slurm task does, which is what the sampler reads.

Set ``COLOC_GPU_OUT`` to a folder to keep the report (JSON) and the NVML recording made while the clients ran.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pwd
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Dict

import pytest

from slurm_coloc.config import Config
from slurm_coloc.node import lifecycle, mps, mps_daemon
from slurm_coloc.node.attribution import JobAttributor
from slurm_coloc.node.lifecycle import summarize
from slurm_coloc.node.sampler import Sampler
from slurm_coloc.store import samples as st
from slurm_coloc.store.db import open_node_db

pytestmark = pytest.mark.gpu
PY = os.environ.get("COLOC_TORCH_PY", "/opt/torch/.venv/bin/python3")
OTHER_USER = "colocgpu"
OUT = Path(os.environ.get("COLOC_GPU_OUT", "/tmp/coloc-gpu-out"))


@pytest.fixture(scope="module")
def gpu_cfg() -> Config:
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pytest.skip("no NVIDIA GPU here")
    if os.geteuid() != 0 or mps_daemon.resolve_binary(Config()) is None:
        pytest.skip("needs root and nvidia-cuda-mps-control")
    base = Path(f"/tmp/coloc-gpu-{os.getpid()}")
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(mode=0o755)
    os.chmod(base, 0o755)
    shutil.copy(Path(__file__).with_name("gpu_client.py"), base / "gpu_client.py")
    os.chmod(base / "gpu_client.py", 0o644)
    try:
        pwd.getpwnam(OTHER_USER)
    except KeyError:
        subprocess.run(["useradd", "-M", "-u", "2101", OTHER_USER], check=True)
    OUT.mkdir(parents=True, exist_ok=True)
    cfg = dataclasses.replace(Config(), run_dir=str(base / "run"), state_dir=str(base / "state"),
                              log_dir=str(base / "log"), mps_mode="multi-user")
    yield cfg
    shutil.rmtree(base, ignore_errors=True)


def _client(cfg: Config, pairs, job_id: int, user: str = "", **kw) -> subprocess.Popen:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SLURM_JOB_ID": str(job_id),
           "PYTHONUNBUFFERED": "1",
           "HOME": "/tmp", **dict(pairs)}
    if os.environ.get("LD_LIBRARY_PATH"):
        env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
    script = str(Path(cfg.run_dir).parent / "gpu_client.py")
    argv = [PY, script] + [f"--{k.replace('_', '-')}={v}" for k, v in kw.items()]
    prefix = ["runuser", "-u", user, "--"] if user else []
    return subprocess.Popen(prefix + ["env", "-i", *[f"{k}={v}" for k, v in env.items()], *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/tmp")


def _result(p: subprocess.Popen) -> Dict:
    out, err = p.communicate(timeout=180)
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    assert lines, f"client printed no result; stderr: {err[-2000:]}"
    return json.loads(lines[-1])


def test_mps_daemon_starts_and_stops(gpu_cfg: Config) -> None:
    from slurm_coloc.nvml import gpu_uuids
    uuid = gpu_uuids()[0]
    res = mps.acquire(gpu_cfg, 9001, 0, uuid)
    assert res.ok and res.event == "mps-start", res.detail
    pid = mps_daemon.daemon_pid(res.daemon)
    assert pid and Path(f"/proc/{pid}").exists()
    assert res.daemon.key == uuid
    again = mps.acquire(gpu_cfg, 9002, 0, uuid)
    assert again.ok and again.event == "mps-running" and mps_daemon.daemon_pid(again.daemon) == pid
    first = mps.release(gpu_cfg, 9001)
    assert [o.event for o in first] == ["mps-kept"] and mps_daemon.daemon_pid(res.daemon) == pid
    last = mps.release(gpu_cfg, 9002)
    assert [o.event for o in last] == ["mps-stop"], last[0].detail
    # gone (or a zombie nobody reaps)
    assert mps_daemon.daemon_pid(res.daemon) is None and not mps_daemon.pid_alive(pid)
    (OUT / "mps_start_stop.json").write_text(json.dumps({"start": res.detail, "stop": last[0].detail}))


class _Recording:
    """Wraps a reader and keeps every frame (the CI replay recording)."""

    def __init__(self, reader) -> None:
        self.reader, self.frames = reader, []

    def read(self):
        f = self.reader.read()
        self.frames.append(f)
        return f

    def close(self) -> None:
        self.reader.close()


def test_fence_two_users_and_sampler_attribution(gpu_cfg: Config) -> None:
    from slurm_coloc.nvml import NvmlReader, gpu_uuids
    uuid = gpu_uuids()[0]
    ja, jb = 9101, 9102
    ra = mps.acquire(gpu_cfg, ja, 0, uuid)
    rb = mps.acquire(gpu_cfg, jb, 0, uuid)
    assert ra.ok and rb.ok, (ra.detail, rb.detail)
    env_a = lifecycle.mps_env(ra.daemon, 2)   # 2 shards: 2 GiB fence
    env_b = lifecycle.mps_env(rb.daemon, 4)   # 4 shards: 4 GiB fence
    db_path = Path(gpu_cfg.state_dir) / "nodes" / "gpu1.db"
    rec = _Recording(NvmlReader())
    # the clients run outside Slurm (no cgroup, no slurmstepd, no Prolog row): their SLURM_JOB_ID claims count
    # because the job's uid is known and that uid runs this one job, as the Prolog records it for a real job
    # (node/attribution.py, rule 3)
    owners = {9101: 0, 9102: 2101}
    sampler = Sampler(dataclasses.replace(gpu_cfg, sampler_batch_s=1.0), "gpu1", rec, db_path=db_path,
                      interval_s=0.5, attributor=JobAttributor(job_uid=owners.get,
                                                  uid_jobs=lambda uid: [j for j, u in owners.items()
                                                                        if u == uid]))
    th = threading.Thread(target=sampler.run, kwargs={"duration_s": 60}, daemon=True)
    th.start()
    time.sleep(1.5)
    t_launch = time.time()
    pa = _client(gpu_cfg, env_a, ja, tag="A-over-fence", seconds=12, alloc_gib=4, alloc_after_s=3)
    pb = _client(gpu_cfg, env_b, jb, user=OTHER_USER, tag="B-under-fence", seconds=12, alloc_gib=1,
                 alloc_after_s=2,
                 hold_after_alloc_s=1)
    a, b = _result(pa), _result(pb)
    time.sleep(1.5)
    sampler.stopping = True
    th.join(timeout=30)
    rel = mps.release(gpu_cfg, ja) + mps.release(gpu_cfg, jb)
    db = open_node_db(db_path)
    procs = st.load_proc_samples(db, 0, time.time() + 1, [0])
    gpus = st.load_gpu_samples(db, 0, time.time() + 1, [0])
    sum_a = summarize(ja, "gpu1", [0], t_launch, time.time(), gpus, procs)
    sum_b = summarize(jb, "gpu1", [0], t_launch, time.time(), gpus, procs)
    report = {"A": a, "B": b, "release": [o.event for o in rel], "proc_rows": len(procs),
              "gpu_rows": len(gpus),
              "jobs_seen": sorted({p["job_id"] for p in procs if p["job_id"]}),
              "proc_examples": [p for p in procs if p["job_id"]][:6],
              "unattributed_pids": sorted({p["pid"] for p in procs if not p["job_id"]}),
              "gpm_rows": sum(1 for g in gpus if g["smact_pct"] is not None),
              "gpu_examples": gpus[len(gpus) // 2:len(gpus) // 2 + 3],
              "summary_A": dataclasses.asdict(sum_a), "summary_B": dataclasses.asdict(sum_b),
              "sampler": {"frames": sampler.frames, "errors": sampler.errors, "flushes": sampler.flushes}}
    (OUT / "node_gpu_report.json").write_text(json.dumps(report, indent=1, default=str))
    t0 = rec.frames[0].ts
    header = {"recording": "NVML readings recorded live on an NVIDIA H100 80GB HBM3 (device test machine)",
              "label": "two torch clients under multi-user MPS: job 9101 (root, fence 0=2G, OOMs at ~3 s) "
                       "and "
                       "job 9102 (uid 2101, fence 0=4G), sampler interval 0.5 s", "interval_s": 0.5,
              "pids": {"9101": a.get("pid"), "9102": b.get("pid")}, "frames": len(rec.frames)}
    with open(OUT / "h100_mps_2jobs.jsonl", "w") as fh:
        fh.write(json.dumps(header) + "\n")
        for f in rec.frames:
            fh.write(json.dumps(f.to_json(t0)) + "\n")
    # the fence: the client over its limit gets torch.OutOfMemoryError, the one under it does not
    assert "error" not in a and a["oom"] is True, a
    assert "error" not in b and b["oom"] is False and b["steps"] > 0, b
    # multi-user MPS: the second user's client started together with the first (not serialized)
    assert abs(b["t_first_cuda"] - a["t_first_cuda"]) < 4.0, (a, b)
    # the neighbour kept training after A's OOM
    assert b["t_end"] > a["t_end"] + 3, (a, b)
    # sampler rows are real and attributed to the right job ids; GPM columns filled on H100
    assert {ja, jb} <= set(report["jobs_seen"]), report
    pid_jobs = {(p["pid"], p["job_id"]) for p in procs if p["job_id"]}
    assert (a["pid"], ja) in pid_jobs and (b["pid"], jb) in pid_jobs, pid_jobs
    assert report["gpm_rows"] > 0
    assert sum_b.peak_mem_mib and sum_b.peak_mem_mib > 500, sum_b
    assert rel[-1].event == "mps-stop"


def test_per_user_daemon_runs_as_the_user_behind_a_0700_pipe_dir(gpu_cfg: Config) -> None:
    """mps_mode per-user with the real daemon: started as the job's user, pipe/log 0700 owned by that user,
    the user's client trains under it (the daemon's control.log: a server started for that uid, the client's
    pid accepted from that uid), the daemon stops as the user."""
    from slurm_coloc.nvml import gpu_uuids
    uuid = gpu_uuids()[0]
    cfg = dataclasses.replace(gpu_cfg, mps_mode="per-user")
    uid = pwd.getpwnam(OTHER_USER).pw_uid
    res = mps.acquire(cfg, 9201, 0, uuid, uid=uid)
    assert res.ok and res.event == "mps-start", res.detail
    d = res.daemon
    pid = mps_daemon.daemon_pid(d)
    assert pid and os.stat(f"/proc/{pid}").st_uid == uid
    for sub in (d.pipe_dir, d.log_dir):
        st_ = os.stat(sub)
        assert st_.st_uid == uid and st_.st_mode & 0o777 == 0o700, (sub, oct(st_.st_mode))
    assert os.stat(d.root).st_uid == 0
    client = _client(cfg, lifecycle.mps_env(d, 4), 9201, user=OTHER_USER, tag="per-user", seconds=5,
                     alloc_gib=1, alloc_after_s=1)
    out = _result(client)
    rel = mps.release(cfg, 9201)
    control = (d.log_dir / "control.log").read_text()
    report = {"acquire": res.detail, "client": out, "release": [o.event for o in rel],
              "control_log": control[-3000:]}
    (OUT / "mps_per_user.json").write_text(json.dumps(report, indent=1, default=str))
    assert "error" not in out and out["steps"] > 0 and out["oom"] is False, out
    assert f"for user {uid}" in control and f"NEW CLIENT {out['pid']} from user {uid}" in control, control
    assert [o.event for o in rel] == ["mps-stop"], rel[0].detail
