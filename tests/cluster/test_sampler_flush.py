"""The Epilog's flush request (node/sampler_daemon.py): samples still in the sampler's write buffer reach
the job summary.

CI has no GPU: the sampler replays the NVML recording made on the real H100 (tests/data/nvml, labelled there).
``sampler_batch_s: 30`` keeps every sample of a short job in the buffer, so without the flush the Epilog's
summary would have none of them.
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
from typing import Iterator

import pytest

from slurm_coloc.config import Config
from slurm_coloc.node import sampler_daemon
from slurm_coloc.node.sampler_daemon import running_pid
from slurm_coloc.store import samples as st
from slurm_coloc.store import summaries as store_summaries
from slurm_coloc.store.db import open_readonly
from tests.slurm_cluster import Cluster

pytestmark = pytest.mark.slurm  # starts a real Slurm cluster

REC = Path(__file__).parents[1] / "data" / "nvml" / "h100_mps_2jobs.jsonl"
REPO = Path(__file__).resolve().parents[2]


def _cfg(tmp_path: Path) -> Config:
    return dataclasses.replace(Config(), state_dir=str(tmp_path / "state"), run_dir=str(tmp_path / "run"),
                               log_dir=str(tmp_path / "log"), sampler_batch_s=30.0, sampler_interval_s=0.1)


def _stop(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError:
        return
    for _ in range(100):
        if not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            return
        time.sleep(0.1)


@pytest.fixture
def sampler(tmp_path: Path) -> Iterator[Config]:
    """A replaying sampler (interval 0.1 s, batch 30 s) on node ``f1``, stopped after the test."""
    cfg = _cfg(tmp_path)
    conf = tmp_path / "c.yaml"
    conf.write_text("".join(f"{k}: {json.dumps(getattr(cfg, k))}\n" for k in
                            ("state_dir", "run_dir", "log_dir", "sampler_batch_s", "sampler_interval_s")))
    p = subprocess.Popen([sys.executable, "-m", "slurm_coloc.cli.sampler", "run", "--node", "f1", "--replay",
                          str(REC), "--foreground-log"], env={**os.environ, "COLOC_CONFIG": str(conf)},
                          cwd=REPO,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            if running_pid(cfg, "f1") == p.pid and cfg.node_db_path("f1").exists():
                break
            time.sleep(0.05)
        yield cfg
    finally:
        _stop(p.pid)
        p.wait(timeout=10)


def _gpu_samples(cfg: Config, node: str) -> int:
    return st.count_samples(open_readonly(cfg.node_db_path(node)))["gpu_samples"]


def test_flush_request_writes_the_buffer_at_once(sampler: Config) -> None:
    time.sleep(1.5)
    assert _gpu_samples(sampler, "f1") == 0  # batch 30 s: everything read so far is still buffered
    t_req = time.time()
    res = sampler_daemon.request_flush(sampler, "f1", running_pid(sampler, "f1"))
    assert res["status"] == "ok" and res["wait_ms"] < 1000, res
    conn = sqlite3.connect(str(sampler.node_db_path("f1")))
    n, last = conn.execute("SELECT count(*), max(ts) FROM gpu_samples").fetchone()
    assert n >= 8 and last >= t_req - 0.5, (n, last, t_req)
    marker = sampler_daemon.read_marker(sampler, "f1")
    assert marker and marker["pid"] == running_pid(sampler, "f1") and marker["upto_ts"] >= t_req


def test_no_sampler_and_a_foreign_lock_holder_are_never_signalled(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    t0 = time.monotonic()
    assert sampler_daemon.request_flush(cfg, "f2", running_pid(cfg, "f2")) == {"status": "no-sampler"}
    assert time.monotonic() - t0 < 0.5
    lock = Path(cfg.run_dir) / "sampler-f2.lock"
    lock.parent.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, str(os.getpid()).encode()); print('held', flush=True)\n"
        "time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert running_pid(cfg, "f2") == holder.pid
        res = sampler_daemon.request_flush(cfg, "f2", holder.pid)
        assert res == {"status": "not-a-sampler", "pid": holder.pid}
        time.sleep(0.3)
        assert holder.poll() is None  # SIGUSR1 would have killed it (default action)
    finally:
        holder.kill()
        holder.wait()


def test_epilog_summary_has_the_samples_of_the_last_batch(slurm_cluster: Cluster) -> None:
    """Real Prolog (starts the replaying sampler), real job, real Epilog: its summary counts the buffered
    samples."""
    c = slurm_cluster
    node = "n2"
    original = c.coloc_config.read_text()
    cfg = dataclasses.replace(Config(), run_dir=str(c.dir / "coloc" / "run"))
    old = running_pid(cfg, node)
    if old and old > 0:
        _stop(old)
    c.coloc_config.write_text(original + f"sampler_replay_path: {REC}\nsampler_batch_s: 30\n"
                              "sampler_interval_s: 0.2\nsampler_autostart: true\n")
    try:
        res = c.run(["sbatch", "--parsable", "-w", node, "--gres=gpu:2", "-t", "2", "-o", "/dev/null",
                     "--wrap", "sleep 6"])
        assert res.returncode == 0, res.stderr
        job = int(res.stdout.strip().split(";")[0])
        c.wait_state(job, ["RUNNING"])
        time.sleep(3)
        db_path = c.node_db(node)
        assert running_pid(cfg, node), "the Prolog started the sampler"
        before = sqlite3.connect(str(db_path)).execute(
            "SELECT count(*) FROM gpu_samples WHERE ts >= ?", (time.time() - 3,)).fetchone()[0]
        assert before == 0  # batch 30 s: the job's samples are all still in the sampler's buffer
        c.wait_job(job)
        summary, hook = None, None
        deadline = time.time() + 60
        while time.time() < deadline and (summary is None or hook is None):
            db = open_readonly(db_path)
            summary = next(iter(store_summaries.load_summaries(db, job)), None)
            rows = [r for r in db["hook_runs"].rows_where("job_id = ? AND hook = 'epilog'", [job])]
            hook = rows[0] if rows else None
            time.sleep(0.5)
        assert summary is not None and hook is not None
        assert json.loads(hook["detail_json"])["sampler_flush"]["status"] == "ok", hook["detail_json"]
        assert summary.n_samples >= 10, summary  # ~6 s at 0.2 s, minus the sampler's start-up
    finally:
        c.coloc_config.write_text(original)
        pid = running_pid(cfg, node)
        if pid and pid > 0:
            _stop(pid)
