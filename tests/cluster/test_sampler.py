"""The node sampler on CI (no GPU): it replays an NVML recording made on the real H100
(tests/data/nvml/h100_mps_2jobs.jsonl, labelled in its header) into real SQLite, attributing processes through
the real /proc of real Slurm jobs; error handling (locked/full database, failed reads, SIGKILL) and retention.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_coloc.config import Config
from slurm_coloc.node.lifecycle import percentile, summarize
from slurm_coloc.node.sampler import JobAttributor, Sampler
from slurm_coloc.node.sampler_daemon import running_pid
from slurm_coloc.nvml import GpuReading, ReplayReader
from slurm_coloc.store import samples as st
from slurm_coloc.store.db import open_node_db

pytestmark = pytest.mark.slurm  # starts a real Slurm cluster

REC = Path(__file__).parents[1] / "data" / "nvml" / "h100_mps_2jobs.jsonl"
REPO = Path(__file__).resolve().parents[2]


def _cfg(tmp_path: Path, **kw) -> Config:
    return dataclasses.replace(Config(), state_dir=str(tmp_path / "state"), run_dir=str(tmp_path / "run"),
                               log_dir=str(tmp_path / "log"), **kw)


def _write_cfg(cfg: Config, path: Path) -> Path:
    keys = ("state_dir", "run_dir", "log_dir", "sampler_batch_s", "sampler_interval_s")
    path.write_text("".join(f"{k}: {json.dumps(getattr(cfg, k))}\n" for k in keys))
    return path


def test_recording_is_labelled_and_from_h100() -> None:
    r = ReplayReader(str(REC))
    assert "recorded live" in r.header["recording"] and "H100" in r.header["recording"]
    f = r.read()
    assert f.gpus and f.gpus[0].smact_pct is not None or any(
        Frame.get("gpus", [{}])[0].get("smact_pct") is not None for Frame in r.frames)


def test_replay_rows_attributed_to_real_slurm_job(slurm_cluster, tmp_path: Path) -> None:
    """A real Slurm job's pid stands in for a recorded client pid; its rows carry that job id."""
    # the sleep is the long-lived job process
    res = slurm_cluster.run(["sbatch", "--parsable", "--gres=shard:2", "--wrap", "sleep 60"])
    assert res.returncode == 0, res.stderr
    jid = int(res.stdout.strip())
    slurm_cluster.wait_state(jid, ["RUNNING"])
    pid = None
    for _ in range(50):
        for p in Path("/proc").iterdir():
            if p.name.isdigit():
                try:
                    if (p / "cmdline").read_bytes().startswith(b"sleep\0") and \
                            f"SLURM_JOB_ID={jid}".encode() in (p / "environ").read_bytes().split(b"\0"):
                        pid = int(p.name)
                        break
                except OSError:
                    continue
        if pid:
            break
        time.sleep(0.1)
    assert pid, "no process of the job found in /proc"
    header = json.loads(REC.read_text().splitlines()[0])
    rec_pid = int(header["pids"]["9102"])
    cfg = _cfg(tmp_path, sampler_batch_s=0.5)
    conf = _write_cfg(cfg, tmp_path / "c.yaml")
    try:
        out = subprocess.run([sys.executable, "-m", "slurm_coloc.cli.sampler", "run", "--node", "t1",
                              "--replay",
                              str(REC), "--pid-map", f"{rec_pid}={pid}", "--interval-s", "0.1",
                              "--duration-s", "7",
                              "--foreground-log"], env={**os.environ, "COLOC_CONFIG": str(conf)}, cwd=REPO,
                             capture_output=True, text=True, timeout=60)
    finally:
        slurm_cluster.run(["scancel", str(jid)], user=None)
    assert out.returncode == 0, out.stderr
    db = open_node_db(cfg.node_db_path("t1"))
    rows = st.load_job_proc_samples(db, jid)
    assert rows and all(r["pid"] == pid for r in rows)
    assert any(r["used_mem_mib"] for r in rows)
    n = st.count_samples(db)
    assert n["gpu_samples"] >= 10


TRAINER = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'while True: pass']); "
           "time.sleep(60)")


def test_cpu_use_of_a_real_slurm_jobs_process_tree(slurm_cluster, tmp_path: Path) -> None:
    """A real Slurm job: an idle Python process (standing in for the CUDA process: the recording's pid is
    mapped onto it) with one busy child (a loader worker). The sampler records the job's CPU use split between
    them."""
    res = slurm_cluster.run(["sbatch", "--parsable", "--gres=shard:2", "--wrap", f'python3 -c "{TRAINER}"'])
    assert res.returncode == 0, res.stderr
    jid = int(res.stdout.strip())
    slurm_cluster.wait_state(jid, ["RUNNING"])
    pid = None
    for _ in range(50):
        for p in Path("/proc").iterdir():
            if p.name.isdigit():
                try:
                    if b"time.sleep(60)" in (p / "cmdline").read_bytes() and \
                            (p / "cmdline").read_bytes().startswith(b"python3") and \
                            f"SLURM_JOB_ID={jid}".encode() in (p / "environ").read_bytes().split(b"\0"):
                        pid = int(p.name)
                        break
                except OSError:
                    continue
        if pid:
            break
        time.sleep(0.1)
    assert pid, "no training process of the job found in /proc"
    # its worker forked (found by /proc/<pid>/cmdline as soon as it exec'ed, before the fork)
    for _ in range(100):
        if Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            break
        time.sleep(0.1)
    rec_pid = int(json.loads(REC.read_text().splitlines()[0])["pids"]["9102"])
    cfg = _cfg(tmp_path, sampler_batch_s=0.5)
    conf = _write_cfg(cfg, tmp_path / "c.yaml")
    try:
        out = subprocess.run([sys.executable, "-m", "slurm_coloc.cli.sampler", "run", "--node", "t1",
                              "--replay",
                              str(REC), "--pid-map", f"{rec_pid}={pid}", "--interval-s", "0.5",
                              "--duration-s", "12",
                              "--foreground-log"], env={**os.environ, "COLOC_CONFIG": str(conf)}, cwd=REPO,
                             capture_output=True, text=True, timeout=60)
        affinity = len(os.sched_getaffinity(pid))
        env = dict(x.split(b"=", 1) for x in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                   if b"=" in x)
    finally:
        slurm_cluster.run(["scancel", str(jid)], user=None)
    assert out.returncode == 0, out.stderr
    db = open_node_db(cfg.node_db_path("t1"))
    rows = st.load_job_cpu_samples(db, jid, 0, time.time() + 1)
    assert len(rows) >= 5 and all(r["train_pids"] == 1 and r["workers"] == 1 for r in rows)
    # the job's CPUs as Slurm allocated them (its environment), capped by where the process may run
    assert env[b"SLURM_CPUS_ON_NODE"].isdigit()
    assert all(r["cpus"] == min(affinity, int(env[b"SLURM_CPUS_ON_NODE"])) for r in rows)
    train = sum(r["train_cores"] for r in rows) / len(rows)
    workers = sum(r["workers_cores"] for r in rows) / len(rows)
    assert workers > 0.3 and train < 0.1, (train, workers)


def test_killed_sampler_leaves_db_intact_and_lock_free(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, sampler_batch_s=0.1)
    conf = _write_cfg(cfg, tmp_path / "c.yaml")
    env = {**os.environ, "COLOC_CONFIG": str(conf)}
    argv = [sys.executable, "-m", "slurm_coloc.cli.sampler", "run", "--node", "k1", "--replay", str(REC),
            "--interval-s", "0.1", "--foreground-log"]
    p = subprocess.Popen(argv, env=env, cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(2.5)
        assert running_pid(cfg, "k1") == p.pid
        second = subprocess.run(argv + ["--duration-s", "1"], env=env, cwd=REPO, capture_output=True,
                                text=True,
                                timeout=30)
        assert second.returncode == 0 and "another sampler holds" in second.stderr
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    conn = sqlite3.connect(str(cfg.node_db_path("k1")))
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert conn.execute("SELECT count(*) FROM gpu_samples").fetchone()[0] > 5
    assert running_pid(cfg, "k1") is None  # the kernel released the flock


def _sampler(tmp_path: Path, reader, **kw) -> Sampler:
    return Sampler(_cfg(tmp_path, **kw), "u1", reader, attributor=JobAttributor(), interval_s=0.1)


def test_survives_locked_database_and_keeps_rows(tmp_path: Path) -> None:
    s = _sampler(tmp_path, ReplayReader(str(REC)), db_busy_timeout_s=0.2)
    s.step()
    assert s.flush()
    other = sqlite3.connect(str(s.db_path), timeout=0, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    for _ in range(5):
        assert s.step()
    assert s.flush() is False and len(s.gpu_buf) == 5  # kept, not lost, no exception
    other.execute("COMMIT")
    assert s.flush() and not s.gpu_buf
    assert st.count_samples(open_node_db(s.db_path))["gpu_samples"] == 6


def test_survives_full_database(tmp_path: Path) -> None:
    s = _sampler(tmp_path, ReplayReader(str(REC)))
    s.step()
    assert s.flush()
    db = s._open()
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.execute(f"PRAGMA max_page_count = {pages}")  # SQLite now answers SQLITE_FULL for any growth
    for _ in range(300):
        s.step()
    assert s.flush() is False and s.gpu_buf
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.execute("PRAGMA max_page_count = 1073741823")
    assert s.flush() and st.count_samples(db)["gpu_samples"] == 301


def test_failed_reads_are_survived(tmp_path: Path) -> None:
    lines = REC.read_text().splitlines()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([lines[0], lines[1], json.dumps({"t": 1, "error": "NVMLError_GpuIsLost"}),
                              lines[2]]))
    s = _sampler(tmp_path, ReplayReader(str(bad)))
    s.run(max_frames=3)
    assert (s.frames, s.errors) == (2, 1)
    assert st.count_samples(open_node_db(s.db_path))["gpu_samples"] == 2


def test_retention_downsamples_then_purges(tmp_path: Path) -> None:
    db = open_node_db(tmp_path / "r.db")
    now = 1_800_000_000.0
    rows = []
    for i in range(120):  # two old minutes at 1 s, then fresh rows
        ts = now - 7200 + i
        rows += st.gpu_rows(ts, [GpuReading(index=0, util_pct=i % 2 * 100, energy_j=1000 + i,
                                            mem_used_mib=i)], 1.0)
    rows += st.gpu_rows(now, [GpuReading(index=0, util_pct=7)], 1.0)
    st.write_rows(db, rows, [])
    folded = st.downsample(db, now - 3600, 60)
    assert folded == 120
    got = list(db.query("SELECT * FROM gpu_samples ORDER BY ts"))
    assert [r["n"] for r in got] == [60, 60, 1] or [r["n"] for r in got][-1] == 1
    assert sum(r["n"] for r in got) == 121
    old = [r for r in got if r["res_s"] == 60]
    assert all(abs(r["util_pct"] - 50) < 1e-9 for r in old)
    assert max(r["energy_j"] for r in old) == 1119 and max(r["mem_used_mib"] for r in old) == 119
    assert st.downsample(db, now - 3600, 60) == 0  # idempotent
    assert st.purge(db, now - 10) == len(old)
    assert st.count_samples(db)["gpu_samples"] == 1


def test_summary_splits_energy_by_sm_utilization() -> None:
    g = [{"ts": 10.0, "gpu_index": 0, "energy_j": 1000.0, "power_w": 100, "smact_pct": 40, "smocc_pct": 10},
         {"ts": 11.0, "gpu_index": 0, "energy_j": 1200.0, "power_w": 300, "smact_pct": 80, "smocc_pct": 30}]
    p = [{"ts": 11.0, "gpu_index": 0, "pid": 1, "job_id": 7, "used_mem_mib": 900, "sm_util_pct": 30},
         {"ts": 11.0, "gpu_index": 0, "pid": 2, "job_id": 8, "used_mem_mib": 500, "sm_util_pct": 10},
         {"ts": 10.0, "gpu_index": 0, "pid": 1, "job_id": 7, "used_mem_mib": 1200, "sm_util_pct": None}]
    s7 = summarize(7, "n", [0], 10, 11, g, p)
    s8 = summarize(8, "n", [0], 10, 11, g, p)
    assert s7.energy_j == pytest.approx(150) and s8.energy_j == pytest.approx(50)
    assert s7.gpu_s == pytest.approx(0.75) and s8.gpu_s == pytest.approx(0.25)
    assert s7.peak_mem_mib == 1200 and s8.peak_mem_mib == 500
    assert s7.smact_mean == 60 and s7.smocc_p95 == 30 and percentile([1, 2, 3, 4], 50) == 2


def test_summary_of_recorded_mps_jobs() -> None:
    """On the H100 recording, each job's peak is what NVML showed for its own process."""
    r = ReplayReader(str(REC))
    header = r.header
    gpu, proc = [], []
    for k in range(len(r.frames)):
        f = r.read()
        jobs = {int(v): int(j) for j, v in header["pids"].items()}
        ts = 1000.0 + r.frames[k]["t"]  # recorded timing
        gpu += st.gpu_rows(ts, f.gpus, 0.5)
        proc += st.proc_rows(ts, [st.ProcSample(p, jobs.get(p.pid)) for p in f.procs], 0.5)
    for job, pid in header["pids"].items():
        mine = [p["used_mem_mib"] for p in proc if p["pid"] == int(pid) and p["used_mem_mib"] is not None]
        s = summarize(int(job), "n", [0], None, None, gpu, proc)
        assert mine and s.peak_mem_mib == max(mine)
        assert s.smact_mean is not None and 0 <= s.smact_mean <= 100
        assert s.energy_j and s.energy_j > 0 and s.gpu_s and s.gpu_s > 0  # MPS clients: split by memory
