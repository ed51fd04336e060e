"""The recovery queue (store/queue.py) on real SQLite files and real processes: record sets applied twice
leave one row; claims of dead replayers are taken again; the recording alarm firing anywhere loses no row; an
entry that cannot be written is set aside without blocking the entries behind it (docs/reliability.md "Load").
"""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path
from typing import Any, Dict, List

import pytest

from slurm_coloc.hooks.context import HookContext
from slurm_coloc.hooks.record import record_ops, replay_queue
from slurm_coloc.store import queue, recordset
from slurm_coloc.store.db import open_ctld_db, open_node_db
from tests.cluster.reliability.test_pending_env import _good_entry


def _ctx(job: int, context: str) -> HookContext:
    return HookContext.from_env({"SLURM_JOB_ID": str(job), "SLURMD_NODENAME": "n1",
                                 "SLURM_SCRIPT_CONTEXT": context,
                                 "SLURM_JOB_USER": "colocuser", "SLURM_JOB_UID": "2001",
                                 "SLURM_JOB_EXIT_CODE": "0"})


def _spool(d: Path, target: str, ops: List[Dict[str, Any]]) -> Path:
    """Queue a record set as ``record.enqueue_ops`` does."""
    return Path(queue.write(str(d), recordset.entry_name(), recordset.encode(target, ops)))


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_the_same_ops_applied_twice_leave_one_row(tmp_path: Path) -> None:
    node = open_node_db(tmp_path / "n1.db")
    ok = record_ops("epilog", _ctx(80, "epilog_slurmd"), True, {"state": "COMPLETED"}, 1795467543.82792,
                    4065.47)
    failed = record_ops("epilog", _ctx(81, "epilog_slurmd"), False, {"error": "timed out"}, 1795467544.1,
                        6948.0)
    for _ in range(2):  # the run's own commit, then its spooled copy replayed
        recordset.apply_ops(node, ok)
        recordset.apply_ops(node, json.loads(json.dumps(failed)))  # through JSON, as from a spool file
    rows = list(node.query("SELECT job_id, hook, ok FROM hook_runs ORDER BY job_id"))
    assert rows == [{"job_id": 80, "hook": "epilog", "ok": 1}, {"job_id": 81, "hook": "epilog", "ok": 0}]
    assert [r["job_id"] for r in node.query("SELECT job_id FROM job_runs WHERE end_ts IS NOT NULL")] == [81]
    # a different run of the same hook and job (another start time) is still recorded
    recordset.apply_ops(node, record_ops("epilog", _ctx(80, "epilog_slurmd"), True, {}, 1795467600.0, 10.0))
    assert node.execute("SELECT count(*) FROM hook_runs WHERE job_id = 80").fetchone()[0] == 2
    ctld = open_ctld_db(tmp_path / "ctld.db")
    end = record_ops("epilog-slurmctld", _ctx(87, "epilog_slurmctld"), False, {"error": "squeue timed out"},
                     1795467549.0, 3000.0)
    recordset.apply_ops(ctld, end)
    recordset.apply_ops(ctld, end)
    assert ctld.execute("SELECT count(*) FROM events WHERE job_id = 87").fetchone()[0] == 1
    assert ctld.execute("SELECT count(*) FROM jobs WHERE job_id = 87 "
                        "AND end_ts IS NOT NULL").fetchone()[0] == 1


def test_claim_names_parse() -> None:
    assert queue.split_claim("prolog-5-100-123.45.env.777.replaying") == ("prolog-5-100-123.45.env", 777)
    assert queue.split_claim("1795-10957.json.replaying") == ("1795-10957.json",
                                                              None)  # before pids were kept
    with pytest.raises(ValueError):
        queue.split_claim("1-2.json")
    assert queue.claim_name("/x/1-2.json") == f"/x/1-2.json.{os.getpid()}.replaying"
    now = 1795000000.0
    assert queue.claim_is_stale(f"1-2.json.{_dead_pid()}.replaying", now, now)
    assert queue.claim_is_stale(f"1-2.json.{os.getpid()}.replaying", now, now)  # left by this process
    assert not queue.claim_is_stale(f"1-2.json.{os.getppid()}.replaying", now, now)  # a live replayer
    assert not queue.claim_is_stale("1-2.json.replaying", now, now)  # no pid: only by age
    assert queue.claim_is_stale("1-2.json.replaying", now - queue.STALE_CLAIM_S - 1, now)


def test_a_claim_whose_replayer_died_is_taken_at_once_a_live_one_is_not(tmp_path: Path) -> None:
    d = tmp_path / "spool"
    ctld = open_ctld_db(tmp_path / "ctld.db")
    ops = record_ops("epilog-slurmctld", _ctx(87, "epilog_slurmctld"), False, {"error": "squeue timed out"},
                     1795467549.0, 3000.0)
    dead = _spool(d, "ctld", ops)
    os.rename(dead, f"{dead}.{_dead_pid()}.replaying")  # claimed, then its replayer was SIGKILLed
    live_ops = record_ops("epilog-slurmctld", _ctx(88, "epilog_slurmctld"), False, {"error": "x"},
                          1795467550.0, 1.0)
    live = _spool(d, "ctld", live_ops)
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        os.rename(live, f"{live}.{sleeper.pid}.replaying")  # a replayer still at work
        assert replay_queue("ctld", ctld, [str(d)], "") == 1
        assert [r["job_id"] for r in ctld.query("SELECT job_id FROM jobs WHERE end_ts IS NOT NULL")] == [87]
        assert [p.name for p in d.iterdir()] == [f"{live.name}.{sleeper.pid}.replaying"]
    finally:
        sleeper.kill()
        sleeper.wait()
    assert replay_queue("ctld", ctld, [str(d)], "") == 1  # its replayer is gone now
    assert ctld.execute("SELECT count(*) FROM jobs WHERE end_ts IS NOT NULL").fetchone()[0] == 2
    assert list(d.iterdir()) == []


def test_a_pending_entry_claimed_by_a_dead_replayer_is_recorded(tmp_path: Path) -> None:
    pend = tmp_path / "pending"
    entry = _good_entry(pend, "epilog-slurmctld-7-1-1.0.env", 7)
    os.rename(entry, f"{entry}.{_dead_pid()}.replaying")
    db = open_ctld_db(tmp_path / "ctld.db")
    env = {"COLOC_CONFIG": "/etc/x.yaml", "COLOC_PENDING_DIR": str(pend)}
    assert queue.candidates([str(pend)], (".env",)) != []
    assert replay_queue("ctld", db, [str(pend)], env["COLOC_CONFIG"]) == 1
    assert [r["job_id"] for r in db.query("SELECT job_id FROM jobs WHERE end_ts IS NOT NULL")] == [7]
    assert list(pend.iterdir()) == []


# an alarm that lands in a gc callback (hypothesis installs one in this process) is reported and dropped by
# Python: that recording simply runs on unbounded, which the assertion below covers as well
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_the_recording_alarm_firing_anywhere_loses_no_row_and_doubles_none(tmp_path: Path) -> None:
    """Fire the recording phase's alarm at random moments of 300 real recordings: after one replay of the
    queue, every run has exactly one row."""
    import random

    from slurm_coloc.config import Config
    from slurm_coloc.hooks import record, runner

    cfg = Config(state_dir=str(tmp_path / "state"), run_dir=str(tmp_path / "run"))
    rng = random.Random(7)
    for job in range(1, 301):
        ctx, ts = _ctx(job, "prolog_slurmd"), 1795468000.0 + job
        record.RECORD_BUDGET_S = runner.RECORD_BUDGET_S = rng.uniform(0.00002, 0.004)  # the alarm, anywhere
        try:
            runner.record_bounded("prolog", ctx, cfg, True, {"n": job}, ts, 5.0, {}, {})
        finally:
            record.RECORD_BUDGET_S = runner.RECORD_BUDGET_S = 3.0
    db = open_node_db(cfg.node_db_path("n1"))
    replay_queue("node:n1", db, [str(tmp_path / "run" / "spool")], "", budget_s=60, max_entries=1000)
    counts = dict(db.execute("SELECT job_id, count(*) FROM hook_runs GROUP BY job_id").fetchall())
    left = sorted(os.listdir(tmp_path / "run" / "spool"))
    assert [(j, counts.get(j)) for j in range(1, 301) if counts.get(j) != 1] == [], left


def _aged(path: Path, age_s: float) -> Path:
    t = os.lstat(path).st_mtime - age_s
    os.utime(path, (t, t), follow_symlinks=False)
    return path


def test_an_entry_that_cannot_be_written_is_set_aside_and_the_rest_replay(tmp_path: Path) -> None:
    """Entries SQLite refuses (an integer over 64 bits: OverflowError; an unknown column) or that cannot be
    parsed are set aside with a log line, oldest first, and every entry behind them is still applied."""
    spool_dir, pend = tmp_path / "spool", tmp_path / "pending"
    db = open_ctld_db(tmp_path / "ctld.db")
    huge = 100000000000000000000  # > 2**63: "Python int too large to convert to SQLite INTEGER"
    bad = [
        _spool(spool_dir, "ctld", [{"op": "submission", "row": {"job_id": 1, "estimate_mib": huge}}]),
        _spool(spool_dir, "ctld", [{"op": "ctld_end", "row": {"job_id": 2, "end_ts": huge}}]),
        _spool(spool_dir, "ctld", [{"op": "event", "row": {"job_id": 3, "kind": "k", "no_such_column": 1}}]),
    ]
    garbled = spool_dir / "4-1.json"
    garbled.write_bytes(b'{"target": "ctld", "ops": [')
    garbled.chmod(0o600)
    bad.append(garbled)
    for i, path in enumerate(bad):
        _aged(path, 100 - i)  # the oldest: replayed first
    good = _spool(spool_dir, "ctld", record_ops("epilog-slurmctld", _ctx(7, "epilog_slurmctld"), False,
                                                 {"error": "x"}, 1795467549.0, 10.0))
    # a pending environment whose comment carries the same value, and a good one behind it
    overflow_env = _good_entry(pend, "prolog-slurmctld-9-1-1.0.env", 9)
    overflow_env.write_bytes(overflow_env.read_bytes().replace(b"epilog-slurmctld", b"prolog-slurmctld")
                             + b'SLURM_JOB_COMMENT=coloc:{"mem_mib":100000000000000000000,"shards":1}\0')
    _aged(overflow_env, 50)
    _good_entry(pend, "epilog-slurmctld-8-1-1.0.env", 8)
    assert replay_queue("ctld", db, [str(spool_dir), str(pend)], "/etc/x.yaml") == 2 + (not _set_aside(pend))
    ended = [r["job_id"]
             for r in db.query("SELECT job_id FROM jobs WHERE end_ts IS NOT NULL ORDER BY job_id")]
    assert ended == [7, 8], ended
    assert sorted(p.name for p in spool_dir.iterdir()) == sorted(p.name + ".bad" for p in bad)
    assert not good.exists()
    assert [p.name for p in pend.iterdir() if not p.name.endswith(".bad")] == []  # nothing left in the way
    # a second replay finds nothing to do: set-aside entries are never retried
    assert replay_queue("ctld", db, [str(spool_dir), str(pend)], "/etc/x.yaml") == 0


def _set_aside(d: Path) -> List[str]:
    return sorted(p.name for p in d.iterdir() if p.name.endswith(".bad"))


def test_a_database_failure_puts_the_entry_back_and_stops(tmp_path: Path) -> None:
    """Locked past its busy timeout, the database is the problem, not the entry: it stays queued,
    unclaimed."""
    d = tmp_path / "spool"
    db = open_ctld_db(tmp_path / "ctld.db", 0.1)
    first = _spool(d, "ctld",
                   record_ops("epilog-slurmctld", _ctx(5, "epilog_slurmctld"), False, {}, 1795.0, 1.0))
    second = _spool(d, "ctld",
                    record_ops("epilog-slurmctld", _ctx(6, "epilog_slurmctld"), False, {}, 1796.0, 1.0))
    lock = sqlite3.connect(str(tmp_path / "ctld.db"), isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            replay_queue("ctld", db, [str(d)], "")
    finally:
        lock.rollback()
        lock.close()
    assert first.exists() and second.exists() and _set_aside(d) == []
    assert replay_queue("ctld", db, [str(d)], "") == 2


def test_one_replay_takes_record_sets_first_within_one_budget(tmp_path: Path) -> None:
    """Record sets of every directory go before pending environments (whose rows then find theirs); one
    ``max_entries`` and one time budget hold for all directories together."""
    run_spool, state_spool, pend = tmp_path / "run", tmp_path / "state", tmp_path / "pending"
    db = open_ctld_db(tmp_path / "ctld.db")
    env_entry = _aged(_good_entry(pend, "epilog-slurmctld-1-1-1.0.env", 1), 1000)  # the oldest file
    a = _spool(state_spool, "ctld",
               record_ops("epilog-slurmctld", _ctx(2, "epilog_slurmctld"), False, {}, 1.0, 1.0))
    b = _spool(run_spool, "ctld",
               record_ops("epilog-slurmctld", _ctx(3, "epilog_slurmctld"), False, {}, 2.0, 1.0))
    dirs = [str(run_spool), str(state_spool), str(pend)]
    assert [p for p, _, _ in queue.candidates(dirs, (".json", ".env"))] == [str(a), str(b), str(env_entry)]
    assert replay_queue("ctld", db, dirs, "/etc/x.yaml", max_entries=1) == 1
    assert not a.exists() and b.exists() and env_entry.exists()
    assert replay_queue("ctld", db, dirs, "/etc/x.yaml", budget_s=-1.0) == 0
    assert replay_queue("ctld", db, dirs, "/etc/x.yaml") == 2
    assert db.execute("SELECT count(*) FROM jobs WHERE end_ts IS NOT NULL").fetchone()[0] == 3
