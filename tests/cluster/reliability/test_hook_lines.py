"""Every hook run leaves exactly one ``<hook> done in N ms`` line in hooks.log (docs/reliability.md, "Load").

The 200-submission load run found 129 of 200 EpilogSlurmctld ``done`` lines: on an overloaded host the shim's
``timeout`` (30 s from exec, Python start-up included) SIGTERMed hook processes whose own 25 s bound started
only after start-up; the parent died silently while its child (own process group) still wrote the row. Now the
budget counts start-up and a SIGTERM is caught: the run is spooled and logged as ``done ... (TERMINATED
...)``.
"""
from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List

import pytest

from slurm_coloc.store.db import open_ctld_db
from tests.cluster.reliability.conftest import FaultCluster
from tests.slurm_cluster import VENV_BIN

pytestmark = pytest.mark.slurm
HOOKS = ("prolog-slurmctld", "prolog", "epilog", "epilog-slurmctld")


def _done_lines(log: Path, job: int) -> List[str]:
    pat = re.compile(rf"coloc\[{job}\] (\S+) done in \d+ ms")
    return [ln for ln in log.read_text(errors="replace").splitlines()
            if pat.search(ln)] if log.exists() else []


def _per_hook(log: Path, jobs: List[int]) -> Dict[int, Dict[str, int]]:
    out: Dict[int, Dict[str, int]] = {j: {} for j in jobs}
    pat = re.compile(r"coloc\[(\d+)\] (\S+) done in \d+ ms")
    for ln in log.read_text(errors="replace").splitlines():
        m = pat.search(ln)
        if m and int(m.group(1)) in out:
            out[int(m.group(1))][m.group(2)] = out[int(m.group(1))].get(m.group(2), 0) + 1
    return out


def _children(pid: int) -> List[int]:
    out = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and int((p / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(p.name))
        except (OSError, IndexError, ValueError):
            continue
    return out


def test_concurrent_jobs_leave_one_done_line_per_hook_run(fc: FaultCluster) -> None:
    n = 16
    script = fc.script("lines.sh", "sleep 1\n")
    with ThreadPoolExecutor(8) as pool:
        jobs = list(pool.map(lambda i: fc.sbatch(script, node="n1" if i % 2 else "n2"), range(n)))
    for j in jobs:
        fc.c.wait_job(j, timeout=240)
    deadline = time.time() + 90
    while time.time() < deadline:
        counts = _per_hook(fc.hooks_log, jobs)
        if all(set(HOOKS) <= set(c) for c in counts.values()):
            break
        time.sleep(1)
    time.sleep(2)  # a second line, were there one, would come from the same processes: give them time
    counts = _per_hook(fc.hooks_log, jobs)
    assert all(c == {h: 1 for h in HOOKS} for c in counts.values()), counts


def test_sigterm_mid_hook_leaves_one_terminated_line_and_spools_the_run(fc: FaultCluster,
                                                                        tmp_path: Path) -> None:
    job = fc.run_job(fc.script("term.sh"))["job_id"]  # a real job scontrol still knows
    conf = tmp_path / "coloc.yaml"
    conf.write_text(f"state_dir: {tmp_path}/state\nrun_dir: {tmp_path}/run\nlog_dir: {tmp_path}/log\n"
                    f"slurm_bin_dir: {fc.c.bin_dir}\nhook_timeout_s: 20\ndb_busy_timeout_s: 20\n")
    # created, then held locked: the hook's child waits in SQLite
    open_ctld_db(tmp_path / "state" / "ctld.db")
    lock = sqlite3.connect(str(tmp_path / "state" / "ctld.db"), isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    env = {"PATH": "/usr/bin:/bin", "SLURM_CONF": str(fc.c.conf), "COLOC_CONFIG": str(conf),
           "SLURM_JOB_ID": str(job), "SLURM_SCRIPT_CONTEXT": "prolog_slurmctld",
           "SLURM_JOB_USER": "colocuser",
           "SLURM_JOB_UID": "2001", "COLOC_SHIM_TIMEOUT_S": "60"}
    proc = subprocess.Popen([str(VENV_BIN / "coloc-hook"), "prolog-slurmctld"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        child = None
        deadline = time.time() + 30
        while time.time() < deadline and child is None:
            child = next(iter(_children(proc.pid)), None)
            time.sleep(0.1)
        assert child, "the hook forked its child"
        time.sleep(2.0)  # scontrol done, the child now waits for the locked database
        assert proc.poll() is None
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        rc = proc.wait(timeout=10)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
        lock.rollback()
        lock.close()
    assert rc == 0 and took < 2.0, (rc, took, proc.stderr.read() if proc.stderr else "")
    lines = _done_lines(tmp_path / "log" / "hooks.log", job)
    assert len(lines) == 1 and "TERMINATED" in lines[0] and " ERROR " in lines[0], lines
    # the child (own process group) was left to finish: the database is free again, it writes the row and
    # exits
    deadline = time.time() + 30
    while time.time() < deadline and _alive(child):
        time.sleep(0.2)
    assert not _alive(child)
    rows = fc.rows(tmp_path / "state" / "ctld.db", "SELECT job_id, gres_req FROM jobs")
    assert [r["job_id"] for r in rows] == [job] and "shard" in (rows[0]["gres_req"] or ""), rows
    entries = sorted((tmp_path / "run" / "spool").glob("*.json"))
    assert len(entries) == 1, entries
    ops = json.loads(entries[0].read_text())["ops"]
    assert {o["op"] for o in ops} == {"event", "submission"}
    assert "terminated by SIGTERM" in ops[0]["row"]["detail_json"]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _catches_sigterm(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("SigCgt:")), 16)
    return bool(caught & (1 << (signal.SIGTERM - 1)))


def test_sigterm_during_start_up_still_leaves_one_line(tmp_path: Path) -> None:
    """SIGTERM as soon as coloc-hook catches it (during its imports, long before its work): one line, exit 0,
    and its pending environment."""
    conf = tmp_path / "coloc.yaml"
    conf.write_text(f"state_dir: {tmp_path}/state\nrun_dir: {tmp_path}/run\nlog_dir: {tmp_path}/log\n")
    (tmp_path / "log").mkdir()
    env = {"PATH": "/usr/bin:/bin", "COLOC_CONFIG": str(conf), "SLURM_JOB_ID": "4242",
           "SLURM_SCRIPT_CONTEXT": "epilog_slurmctld", "COLOC_PENDING_DIR": str(tmp_path / "pending")}
    proc = subprocess.Popen([str(VENV_BIN / "coloc-hook"), "epilog-slurmctld"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 10
    while time.time() < deadline and not _catches_sigterm(proc.pid):
        time.sleep(0.001)
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    lines = _done_lines(tmp_path / "log" / "hooks.log", 4242)
    assert len(lines) == 1 and "TERMINATED" in lines[0] and "epilog-slurmctld" in lines[0], lines
    # it left its environment for the next hook run (tests/reliability/test_pending_env.py replays such
    # entries)
    entries = list((tmp_path / "pending").glob("epilog-slurmctld-4242-*.env"))
    assert len(entries) == 1 and "pending entry" in lines[0], (entries, lines)
