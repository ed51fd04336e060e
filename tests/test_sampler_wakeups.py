"""Sampler steady-state cost without changing what it records: one wake-up per tick (a blocking wait
that a flag or a signal ends at once), pid -> job attribution cached per (pid, start time), rows written by a
prepared ``executemany`` exactly as sqlite-utils' ``insert_all`` wrote them. Real SQLite, real signals, a temp
/proc tree; the NVML frames come from the H100 recording (tests/data/nvml).
"""
from __future__ import annotations

import dataclasses
import os
import signal
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from slurm_coloc.config import Config
from slurm_coloc.node import sampler_daemon
from slurm_coloc.node.sampler import JobAttributor, Sampler, install_signal_handlers
from slurm_coloc.nvml import ReplayReader
from slurm_coloc.store import samples as st
from slurm_coloc.store.db import open_node_db

REC = Path(__file__).parent / "data" / "nvml" / "h100_mps_2jobs.jsonl"


def _cfg(tmp_path: Path, **kw) -> Config:
    return dataclasses.replace(Config(), state_dir=str(tmp_path / "state"), run_dir=str(tmp_path / "run"),
                               log_dir=str(tmp_path / "log"), **kw)


def _voluntary_switches() -> int:
    """Voluntary context switches of the calling thread (each ended sleep or blocking wait counts one)."""
    for line in Path("/proc/thread-self/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in /proc/thread-self/status")


@pytest.mark.slow
def test_one_wakeup_per_tick(tmp_path: Path) -> None:
    """At 1 Hz the loop wakes about once a second (the old 0.1 s sleep slices woke 10 times)."""
    cfg = _cfg(tmp_path, sampler_batch_s=1.0)
    (tmp_path / "run").mkdir()
    s = Sampler(cfg, "w1", ReplayReader(str(REC)), attributor=JobAttributor(), interval_s=1.0)
    s.step()
    assert s.flush()  # database created before counting (schema, WAL: a few fsyncs)
    before = _voluntary_switches()
    s.run(duration_s=3.0)
    woke = _voluntary_switches() - before
    assert s.frames == 1 + 4  # ticks at 0, 1, 2, 3 s
    assert woke <= 12, f"{woke} wake-ups in 3 s at 1 Hz"


def test_signals_served_within_a_fifth_of_a_second(tmp_path: Path) -> None:
    """SIGUSR1 (the Epilog's flush request) writes the buffer and the marker at once, SIGTERM stops the loop
    at once, even in the middle of a 5 s interval."""
    cfg = _cfg(tmp_path, sampler_batch_s=30.0)
    (tmp_path / "run").mkdir()
    s = Sampler(cfg, "w2", ReplayReader(str(REC)), attributor=JobAttributor(), interval_s=5.0)
    old = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    sent = {}

    def _send() -> None:
        time.sleep(0.5)
        sent["usr1"] = time.time()
        os.kill(os.getpid(), signal.SIGUSR1)
        for _ in range(50):
            m = sampler_daemon.read_marker(cfg, "w2")
            if m and m["upto_ts"] >= sent["usr1"]:
                sent["flushed_after"] = time.time() - sent["usr1"]
                break
            time.sleep(0.01)
        time.sleep(0.2)
        sent["term"] = time.monotonic()
        os.kill(os.getpid(), signal.SIGTERM)

    install_signal_handlers(s)
    try:
        th = threading.Thread(target=_send)
        th.start()
        t0 = time.monotonic()
        s.run(duration_s=20.0)
        done = time.monotonic()
        th.join()
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
    assert done - t0 < 2.0 and done - sent["term"] < 0.2
    assert sent.get("flushed_after", 9.0) < 0.2
    assert s.frames == 1 and s.flushes == 1  # the SIGUSR1 flush wrote the row; the one at exit had none left
    db = open_node_db(cfg.node_db_path("w2"))
    assert st.count_samples(db)["gpu_samples"] == 1


def test_flag_set_by_another_thread_wakes_the_loop(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, sampler_batch_s=30.0)
    (tmp_path / "run").mkdir()
    s = Sampler(cfg, "w3", ReplayReader(str(REC)), attributor=JobAttributor(), interval_s=5.0)
    th = threading.Thread(target=s.run, kwargs={"duration_s": 20.0})
    th.start()
    time.sleep(0.3)
    t_req = time.time()
    s.flush_requested = True
    for _ in range(40):
        m = sampler_daemon.read_marker(cfg, "w3")
        if m and m["upto_ts"] >= t_req:
            break
        time.sleep(0.01)
    assert m and m["upto_ts"] - t_req < 0.2
    t_stop = time.monotonic()
    s.stopping = True
    th.join(timeout=5)
    assert not th.is_alive() and time.monotonic() - t_stop < 0.2


def _fake_proc(root: Path, pid: int, start: int, env: bytes, cgroup: str = "0::/\n") -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    fields = ["S"] + ["0"] * 18 + [str(start)] + ["0"] * 30  # field 22 (starttime) = index 19 after ")"
    (d / "stat").write_text(f"{pid} (py thon) {' '.join(fields)}\n")
    (d / "environ").write_bytes(env)
    (d / "cgroup").write_text(cgroup)
    (d / "status").write_text("PPid:\t1\nUid:\t0\t0\t0\t0\n")  # a root process: its own SLURM_JOB_ID counts


def test_attribution_read_once_per_process_start(tmp_path: Path) -> None:
    """environ/cgroup are read once per (pid, start time): a changed environ is not re-read, a reused pid
    is."""
    proc = tmp_path / "proc"
    _fake_proc(proc, 4242, 1000, b"PATH=/bin\0SLURM_JOB_ID=77\0")
    _fake_proc(proc, 4343, 1000, b"PATH=/bin\0",
               "0::/system.slice/slurmstepd.scope/job_91/step_0/user/task_0\n")
    # the v2 hierarchy: Slurm's root-owned job_91 directory (node/attribution.py)
    cgroup_root = tmp_path / "cgroup"
    (cgroup_root / "system.slice" / "slurmstepd.scope" / "job_91").mkdir(parents=True)
    a = JobAttributor(str(proc), mounts={"": str(cgroup_root)})
    assert a.job_of(4242) == 77 and a.job_of(4343) == 91 and a.job_of(999) is None
    (proc / "4242" / "environ").write_bytes(b"SLURM_JOB_ID=78\0")
    (proc / "4343" / "cgroup").write_text("0::/\n")
    assert a.job_of(4242) == 77 and a.job_of(4343) == 91  # cached: not read again
    _fake_proc(proc, 4242, 2000, b"SLURM_JOB_ID=79\0")  # the pid was reused by a new process
    assert a.job_of(4242) == 79
    (proc / "4343" / "stat").unlink()  # gone
    assert a.job_of(4343) is None


def test_rows_equal_sqlite_utils_insert_all(tmp_path: Path) -> None:
    """The prepared executemany stores exactly what ``insert_all`` stored (values, NULLs, types)."""
    r = ReplayReader(str(REC))
    gpu, proc = [], []
    for k in range(len(r.frames)):
        f = r.read()
        gpu += st.gpu_rows(1_700_000_000.123456 + k, f.gpus, 0.5)
        proc += st.proc_rows(1_700_000_000.5 + k,
                             [st.ProcSample(p, None if p.pid % 2 else 9101) for p in f.procs],
                             0.5)
    assert any(v is None for row in gpu for v in row.values()) and proc
    new, ref = open_node_db(tmp_path / "new.db"), open_node_db(tmp_path / "ref.db")
    st.write_rows(new, gpu, proc)
    with ref.atomic():
        ref["gpu_samples"].insert_all(gpu)
        ref["proc_samples"].insert_all(proc)
    for table in ("gpu_samples", "proc_samples"):
        kinds = "typeof(job_id)" if table == "proc_samples" else "typeof(smact_pct)"
        q = f"SELECT *, typeof(ts), {kinds} FROM {table} ORDER BY rowid"
        a = sqlite3.connect(str(tmp_path / "new.db")).execute(q).fetchall()
        b = sqlite3.connect(str(tmp_path / "ref.db")).execute(q).fetchall()
        assert a == b and len(a) == len(gpu if table == "gpu_samples" else proc)
