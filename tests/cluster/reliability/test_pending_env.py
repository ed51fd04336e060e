"""Hook runs that end before they can record (killed during start-up, by the shim's timeout, crashed) leave
their environment in the pending directory; the next hook run of the same database records their rows, once
(hooks/pending.py, store/queue.py). Real coloc-hook processes, the real shim, real SQLite.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Dict, List

import pytest

from slurm_coloc.hooks import pending
from slurm_coloc.hooks.record import replay_queue
from slurm_coloc.store import queue
from slurm_coloc.store.db import open_ctld_db, open_node_db
from tests.cluster.reliability.conftest import FaultCluster
from tests.cluster.reliability.test_hook_lines import _catches_sigterm
from tests.slurm_cluster import REPO, VENV_BIN

pytestmark = pytest.mark.slurm  # starts a real Slurm cluster

SHIM = REPO / "prolog_epilog" / "coloc-hook.sh"


def _env(conf: Path, pend: Path, job: int, context: str, **extra: str) -> Dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "COLOC_CONFIG": str(conf), "COLOC_PENDING_DIR": str(pend),
            "SLURM_JOB_ID": str(job), "SLURM_SCRIPT_CONTEXT": context, "SLURM_JOB_USER": "colocuser",
            "SLURM_JOB_UID": "2001", "SLURM_JOB_EXIT_CODE": "0", **extra}


def _kill_in_start_up(hook: str, env: Dict[str, str]) -> None:
    """Run coloc-hook and SIGTERM it as soon as it catches SIGTERM (during its imports): exit 0."""
    proc = subprocess.Popen([str(VENV_BIN / "coloc-hook"), hook], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 10
    while time.time() < deadline and not _catches_sigterm(proc.pid):
        time.sleep(0.001)
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=10) == 0


def _shim_times_out(hook: str, env: Dict[str, str], slow: Path) -> None:
    """The real shim with a 1 s limit around a hook that sleeps (no Python: killed before any handler)."""
    t0 = time.monotonic()
    proc = subprocess.run(["/bin/sh", str(SHIM), hook], env={**env, "COLOC_HOOK": str(slow),
                                                             "COLOC_HOOK_TIMEOUT_S": "1"}, timeout=30)
    assert proc.returncode == 0 and time.monotonic() - t0 < 5


def _entries(pend: Path, suffix: str = ".env") -> List[Path]:
    return sorted(p for p in pend.iterdir() if p.name.endswith(suffix)) if pend.is_dir() else []


def test_killed_runs_leave_entries_and_the_next_runs_record_them_once(fc: FaultCluster,
                                                                      tmp_path: Path) -> None:
    conf, pend = fc.c.coloc_config, fc.c.dir / "coloc" / "pending"
    first = fc.run_job(fc.script("pend1.sh"), node="n1")["job_id"]  # a real job first: the databases exist
    ghost = first + 100000  # a job id of its own: only the recovered rows can name it
    slow = tmp_path / "slow-hook"
    slow.write_text("#!/bin/sh\nexec sleep 10\n")
    slow.chmod(0o755)
    node_env = {"SLURMD_NODENAME": "n1"}
    _shim_times_out("prolog", _env(conf, pend, ghost, "prolog_slurmd", **node_env), slow)
    _kill_in_start_up("epilog", _env(conf, pend, ghost, "epilog_slurmd", COLOC_SHIM_RUN="9-1.5", **node_env))
    _kill_in_start_up("prolog-slurmctld", _env(conf, pend, ghost, "prolog_slurmctld"))
    _shim_times_out("epilog-slurmctld", _env(conf, pend, ghost, "epilog_slurmctld"), slow)
    entries = _entries(pend)
    assert sorted(p.name.split(f"-{ghost}-")[0] for p in entries) == sorted(
        ["prolog", "epilog", "prolog-slurmctld", "epilog-slurmctld"]), entries
    saved = {p.name: p.read_bytes() for p in entries}
    envs = {p: pending.decode(queue.read(str(p))[0]) for p in entries}
    captured = {env["COLOC_PENDING_HOOK"]: pending.times_of(env, p.stat().st_mtime) for p,
                env in envs.items()}

    nxt = fc.run_job(fc.script("pend2.sh"), node="n1")["job_id"]  # its hooks replay the entries
    deadline = time.time() + 30
    while time.time() < deadline and _entries(pend):
        time.sleep(0.3)
    assert _entries(pend) == [] and not _entries(pend, ".bad"), list(pend.iterdir())

    def node_rows() -> List[Dict]:
        return fc.rows(fc.c.node_db("n1"), "SELECT hook, ts, ok, detail_json FROM hook_runs WHERE job_id = ? "
                       "ORDER BY hook", (ghost,))

    def check() -> None:
        rows = node_rows()
        assert [(r["hook"], r["ok"]) for r in rows] == [("epilog", 0), ("prolog", 0)], rows
        for r in rows:
            assert "recorded later" in r["detail_json"] and abs(r["ts"] - captured[r["hook"]][0]) < 0.01, r
        runs = fc.rows(fc.c.node_db("n1"), "SELECT start_ts, end_ts FROM job_runs WHERE job_id = ?", (ghost,))
        assert len(runs) == 1 and abs(runs[0]["end_ts"] - captured["epilog"][1]) < 0.01, runs
        assert abs(runs[0]["start_ts"] - captured["prolog"][0]) < 0.01, runs
        jobs = fc.rows(fc.c.ctld_db, "SELECT end_ts, updated_ts FROM jobs WHERE job_id = ?", (ghost,))
        assert len(jobs) == 1 and abs(jobs[0]["end_ts"] - captured["epilog-slurmctld"][1]) < 0.01, jobs
        events = fc.rows(fc.c.ctld_db,
                         "SELECT ts, detail_json FROM events WHERE job_id = ? AND kind = 'hook-error'",
                         (ghost,))
        assert len(events) == 2 and all("recorded later" in e["detail_json"] for e in events), events

    check()
    assert len(fc.rows(fc.c.node_db("n1"), "SELECT 1 FROM hook_runs WHERE job_id = ?", (nxt,))) == 2
    # replayed again (the same entries planted anew): nothing changes
    for name, data in saved.items():
        (pend / name).write_bytes(data)
        os.chmod(pend / name, 0o600)
    assert replay_queue("node:n1", open_node_db(fc.c.node_db("n1")), [str(pend)], str(conf)) == 2
    assert replay_queue("ctld", open_ctld_db(fc.c.ctld_db), [str(pend)], str(conf)) == 2
    assert _entries(pend) == []
    check()


def _good_entry(pend: Path, name: str, job: int) -> Path:
    pend.mkdir(mode=0o700, exist_ok=True)
    path = pend / name
    path.write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in {
        "COLOC_PENDING_HOOK": "epilog-slurmctld", "COLOC_PENDING_RC": "143",
        "COLOC_PENDING_TS": "1700000000.5",
        "COLOC_PENDING_UP0": "100.00", "COLOC_PENDING_UP1": "101.00", "SLURM_JOB_ID": str(job),
        "SLURM_JOB_EXIT_CODE": "0", "COLOC_CONFIG": "/etc/x.yaml"}.items()))
    path.chmod(0o600)
    return path


def test_unsafe_or_malformed_entries_are_set_aside_never_applied(tmp_path: Path) -> None:
    pend = tmp_path / "pending"
    db = open_ctld_db(tmp_path / "ctld.db")
    env = {"COLOC_CONFIG": "/etc/x.yaml", "COLOC_PENDING_DIR": str(pend)}
    outside = _good_entry(tmp_path / "outside", "target.env", 1)
    (pend).mkdir(mode=0o700)
    os.symlink(outside, pend / "epilog-slurmctld-1-1-1.0.env")
    user_owned = _good_entry(pend, "epilog-slurmctld-2-1-1.0.env", 2)
    os.chown(user_owned, 2001, 2001)
    group_writable = _good_entry(pend, "epilog-slurmctld-3-1-1.0.env", 3)
    group_writable.chmod(0o620)
    big = _good_entry(pend, "epilog-slurmctld-4-1-1.0.env", 4)
    with open(big, "ab") as fh:
        fh.write(b"SLURM_JOB_COMMENT=" + b"x" * queue.MAX_ENTRY_BYTES + b"\0")
    (pend / "epilog-slurmctld-5-1-1.0.env").write_bytes(b"LD_PRELOAD=/tmp/evil.so\0COLOC_PENDING_HOOK=prolog\0")
    (pend / "epilog-slurmctld-5-1-1.0.env").chmod(0o600)
    other = _good_entry(pend, "epilog-slurmctld-6-1-1.0.env", 6)
    other.write_bytes(other.read_bytes().replace(b"/etc/x.yaml", b"/etc/other.yaml"))
    good = _good_entry(pend, "epilog-slurmctld-7-1-1.0.env", 7)
    assert replay_queue("ctld", db, [str(pend)], env["COLOC_CONFIG"]) == 1
    assert [r["job_id"] for r in db.query("SELECT job_id FROM jobs")] == [7]
    assert next(db.query("SELECT end_ts FROM jobs"))["end_ts"] == 1700000000.5  # the captured time
    assert not good.exists() and other.exists()  # another cluster's entry is left alone
    bad = sorted(p.name for p in pend.iterdir() if p.name.endswith(".bad"))
    assert bad == [f"epilog-slurmctld-{j}-1-1.0.env.bad" for j in (1, 2, 3, 4, 5)], bad
    # link moved, not followed
    assert (pend / "epilog-slurmctld-1-1-1.0.env.bad").is_symlink() and outside.exists()
    # a planted symlink directory is not used at all
    shutil.rmtree(pend)
    os.symlink(tmp_path / "outside", pend)
    _good_entry(tmp_path / "outside", "epilog-slurmctld-8-1-1.0.env", 8)
    assert replay_queue("ctld", db, [str(pend)], env["COLOC_CONFIG"]) == 0
    assert pending.write_entry("epilog", {**env, "SLURM_JOB_ID": "9"}, "startup") is None


@pytest.mark.parametrize("hook", ["task-prolog"])
def test_task_prolog_leaves_no_entry(tmp_path: Path, hook: str) -> None:
    pend = tmp_path / "pending"
    assert pending.write_entry(hook, {"COLOC_PENDING_DIR": str(pend), "SLURM_JOB_ID": "1"}, "startup") is None
    assert not pend.exists()
