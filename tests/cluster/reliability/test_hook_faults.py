"""Faults injected under every hook of a real job on a real cluster (docs/reliability.md, table "Hook
faults").

For each fault: the job still runs to COMPLETED, no node is drained, every root hook process ends within its
bound (hooks/runner.py ``bound_s``: 9 s with this cluster's config), and once the fault is removed the next
job's hooks leave the first job's records in the databases (written directly, or replayed from the spool).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Callable, Dict, Iterator

import pytest

from tests.cluster.reliability.conftest import HOOK_BOUND_S, FaultCluster

pytestmark = pytest.mark.slurm
ROOT_HOOKS = {"prolog-slurmctld", "prolog", "epilog", "epilog-slurmctld"}


def _fault_bin(fc: FaultCluster, name: str, body: str) -> Path:
    d = fc.c.dir / "faultbin" / name
    d.mkdir(parents=True, exist_ok=True)
    for prog in ("scontrol", "squeue", "sbatch"):
        (d / prog).write_text("#!/bin/sh\n" + body)
        os.chmod(d / prog, 0o755)
    return d


@contextlib.contextmanager
def _locked(paths) -> Iterator[None]:
    """Hold an EXCLUSIVE transaction on each database (another process keeps the write lock) until exit."""
    conns = []
    for p in paths:
        conn = sqlite3.connect(str(p), timeout=5, isolation_level=None)
        conn.execute("BEGIN EXCLUSIVE")
        conns.append(conn)
    try:
        yield
    finally:
        for conn in conns:
            conn.execute("ROLLBACK")
            conn.close()


def _dbs(fc: FaultCluster):
    return [fc.ctld_db, fc.node_db("n1")]


def _warm(fc: FaultCluster) -> None:
    """One job so both databases exist before a fault is injected into them."""
    if not all(p.exists() for p in _dbs(fc)):
        rec = fc.run_job(fc.script("warm.sh"))
        assert rec["job_state"] == "COMPLETED"


@contextlib.contextmanager
def fault_db_locked(fc: FaultCluster) -> Iterator[None]:
    _warm(fc)
    with _locked(_dbs(fc)):
        yield


@contextlib.contextmanager
def fault_db_corrupt(fc: FaultCluster) -> Iterator[None]:
    _warm(fc)
    for p in _dbs(fc):
        conn = sqlite3.connect(str(p))  # fold the WAL in first: otherwise it would shadow the damaged page
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        with open(p, "r+b") as fh:  # the header and first page overwritten: "file is not a database"
            fh.write(b"\x5a" * 4096)
    yield
    for p in _dbs(fc):  # the admin's repair: set the corrupt file aside; the next hook starts a new one
        for suffix in ("", "-wal", "-shm"):
            q = Path(str(p) + suffix)
            if q.exists():
                q.rename(str(q) + ".corrupt")


@contextlib.contextmanager
def fault_db_full_fs(fc: FaultCluster) -> Iterator[None]:
    """state_dir on a small tmpfs (databases copied in) filled to the last byte; on exit the filler goes
    (space again) and the tmpfs stays mounted for the recovery job; ``_unmount_full_fs`` puts state_dir
    back."""
    _warm(fc)
    state = fc.state_dir
    saved = fc.c.dir / "state-saved"
    shutil.rmtree(saved, ignore_errors=True)
    shutil.copytree(state, saved)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs", str(state)], check=True)
    fc._tmpfs = state  # type: ignore[attr-defined]
    for item in saved.iterdir():
        (shutil.copytree if item.is_dir() else shutil.copy2)(item, state / item.name)
    for p in _dbs(fc):  # no WAL space left over to absorb writes: every write must grow a file
        conn = sqlite3.connect(str(p))
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
    subprocess.run(["dd", "if=/dev/zero", f"of={state}/filler", "bs=1k"], capture_output=True)
    assert os.statvfs(state).f_bavail == 0
    _restart_slurmds(fc)
    yield
    os.unlink(state / "filler")


def _unmount_full_fs(fc: FaultCluster) -> None:
    state = getattr(fc, "_tmpfs", None)
    if state is None:
        return
    back = fc.c.dir / "state-back"
    shutil.rmtree(back, ignore_errors=True)
    shutil.copytree(state, back)
    subprocess.run(["umount", str(state)], check=True)
    shutil.rmtree(state)
    shutil.copytree(back, state)
    fc._tmpfs = None  # type: ignore[attr-defined]
    _restart_slurmds(fc)


def _restart_slurmds(fc: FaultCluster) -> None:
    """24.11/26.05 only: their slurmd runs in a mount namespace of its own, copied when it starts
    (``scripts/slurm_versions.sh``: the release's slurmstepd is bound over /usr/sbin/slurmstepd there), so a
    mount made or removed later is not seen by it or its hooks: restart both slurmd to make the node hooks see
    the tmpfs (and, after ``_unmount_full_fs``, the state directory again). 22.05's slurmd shares the
    host's."""
    if fc.c.version == "22.05":
        return
    for node in ("n1", "n2"):
        pidfile = fc.c.dir / "run" / f"slurmd-{node}.pid"
        pid = int(pidfile.read_text().strip())
        os.kill(pid, 15)
        deadline = time.time() + 15
        while time.time() < deadline and Path(f"/proc/{pid}").exists():
            time.sleep(0.1)
        subprocess.run([f"{fc.c.bin_dir}/slurmd", "-f", str(fc.c.conf), "-N", node], check=True, timeout=30)
    deadline = time.time() + 30
    while time.time() < deadline and set(fc.c.node_states().values()) != {"idle"}:
        time.sleep(0.3)
    assert set(fc.c.node_states().values()) == {"idle"}, fc.c.node_states()


@contextlib.contextmanager
def fault_config(fc: FaultCluster, text_of: Callable[[str], str]) -> Iterator[None]:
    base = fc.c.coloc_config.read_text()
    fc.set_config(text_of(base))
    yield
    fc.set_config()


@contextlib.contextmanager
def fault_config_missing(fc: FaultCluster) -> Iterator[None]:
    """``$COLOC_CONFIG`` names a file that is not there (an empty file would be a valid all-defaults
    config)."""
    fc.c.coloc_config.unlink()
    assert not Path("/var/lib/slurm-coloc").exists(), "the defaults' state_dir must not exist on a test host"
    yield
    fc.set_config()
    assert not Path("/var/lib/slurm-coloc").exists() and not Path("/run/slurm-coloc").exists(), \
        "a hook without its config must not create the default directories"


@contextlib.contextmanager
def fault_extra(fc: FaultCluster, **extra: object) -> Iterator[None]:
    fc.set_config(**extra)
    yield
    fc.set_config()


FAKE_NVML_C = r"""
/* INJECTED FAULT: a libnvidia-ml.so.1 whose init fails (NVML_ERROR_UNKNOWN) or, with -DHANG, never returns. */
#include <unistd.h>
static int fault(void) {
#ifdef HANG
    for (;;) sleep(3600);
#endif
    return 999;
}
int nvmlInitWithFlags(unsigned int flags) { (void)flags; return fault(); }
int nvmlInit_v2(void) { return fault(); }
int nvmlInit(void) { return fault(); }
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int r) { (void)r; return "injected NVML fault"; }
"""


@contextlib.contextmanager
def fault_nvml(fc: FaultCluster, mode: str) -> Iterator[None]:
    """Every node hook loads a fake libnvidia-ml.so.1 (LD_LIBRARY_PATH in this cluster's hook wrappers)."""
    libdir = fc.c.dir / "faultlib" / mode
    libdir.mkdir(parents=True, exist_ok=True)
    src = libdir / "fake_nvml.c"
    src.write_text(FAKE_NVML_C)
    subprocess.run(["gcc", "-shared", "-fPIC", *(["-DHANG"] if mode == "hang" else []), "-o",
                    str(libdir / "libnvidia-ml.so.1"), str(src)], check=True)
    wrappers = [fc.c.dir / "etc" / "hooks" / f"{h}.sh" for h in ("prolog", "epilog")]
    saved = {w: w.read_text() for w in wrappers}
    for w, text in saved.items():
        w.write_text(text.replace("export COLOC_CONFIG", f"LD_LIBRARY_PATH={libdir}\nexport LD_LIBRARY_PATH\n"
                                  "export COLOC_CONFIG", 1))
    try:
        yield
    finally:
        for w, text in saved.items():
            w.write_text(text)


FAULTS: Dict[str, Callable[[FaultCluster], "contextlib.AbstractContextManager[None]"]] = {
    "db-locked": fault_db_locked,
    "db-full-fs": fault_db_full_fs,
    "db-corrupt": fault_db_corrupt,
    "config-bad-value": lambda fc: fault_config(fc, lambda t: t + "mps_mode: sometimes\n"),
    "config-not-yaml": lambda fc: fault_config(fc, lambda t: t + "gpu_mem_gib: [80,\n"),
    "config-missing": fault_config_missing,
    "scontrol-fails": lambda fc: fault_extra(fc,
                                             slurm_bin_dir=_fault_bin(fc, "fail", "echo boom >&2; exit 1\n")),
    "scontrol-hangs": lambda fc: fault_extra(fc, slurm_bin_dir=_fault_bin(fc, "hang", "exec sleep 300\n")),
    "nvml-erroring": lambda fc: fault_nvml(fc, "error"),
    "nvml-hangs": lambda fc: fault_nvml(fc, "hang"),  # C code: only the hard kill of the hook's child ends it
    "mps-missing": lambda fc: fault_extra(fc, mps_control_bin="/nonexistent/nvidia-cuda-mps-control"),
    "mps-fails": lambda fc: fault_extra(fc, mps_control_bin="/bin/false"),
    # MPS control hangs; its own timeout (30 s) > the hook's (4 s)
    "hook-over-budget": lambda fc: fault_extra(
        fc, mps_control_bin=_fault_bin(fc, "mpshang", "exec sleep 300\n") / "scontrol",
        mps_start_timeout_s=30),
}
# The hook that fails under each fault and words of its recorded error (the others succeed, degraded).
EXPECT_FAILED = {
    "db-locked": ("prolog", "locked"), "db-corrupt": ("prolog", "not a database"),
    "db-full-fs": ("prolog", "full"),
    "config-bad-value": ("prolog", "mps_mode"), "config-not-yaml": ("prolog", "not valid YAML"),
    "scontrol-fails": ("prolog", "boom"), "scontrol-hangs": ("prolog", "timed out"),
    "hook-over-budget": ("prolog", "timed out after 4 s"), "nvml-hangs": ("prolog", "killed after 5 s"),
}
# Faults after which the first job's records cannot exist: the hook cannot know where the store is.
RECORDS_LOST = {"config-missing"}


def _records(fc: FaultCluster, job_id: int) -> Dict[str, object]:
    n1 = fc.node_db("n1")
    return {
        "job_run": fc.rows(n1, "SELECT * FROM job_runs WHERE job_id = ?", (job_id,)),
        "hook_runs": {r["hook"]
                      for r in fc.rows(n1, "SELECT hook FROM hook_runs WHERE job_id = ?", (job_id,))},
        "job": fc.rows(fc.ctld_db, "SELECT * FROM jobs WHERE job_id = ?", (job_id,)),
    }


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_hook_fault(fc: FaultCluster, fault: str) -> None:
    script = fc.script(f"fault-{fault}.sh", "echo ran-$SLURM_JOB_ID share=${COLOC_SHARE:-none}\n")
    t0 = time.time()
    try:
        _run_fault(fc, fault, script, t0)
    finally:
        _unmount_full_fs(fc)


def _run_fault(fc: FaultCluster, fault: str, script: Path, t0: float) -> None:
    with FAULTS[fault](fc):
        job_a = fc.sbatch(script)
        rec = fc.c.wait_job(job_a, timeout=120)
        if fault in RECORDS_LOST:
            time.sleep(2)  # no hook log to wait on: the hooks cannot know where it is
        else:
            fc.wait_hooks(job_a)
        assert rec["job_state"] == "COMPLETED", rec
        assert f"ran-{job_a}" in (fc.c.jobs_dir / f"{script.stem}-{job_a}.out").read_text()
        assert not fc.drained(), fc.c.node_states()
        spooled_during = len(fc.spooled())
    durations = fc.hook_durations_ms(job_a)
    if fault not in RECORDS_LOST:
        assert ROOT_HOOKS <= {h for h, _ in durations}, durations
    assert all(ms <= HOOK_BOUND_S * 1000 for _, ms in durations), durations
    # the store is usable again: the next job's hooks write the first job's records (replaying the spool)
    rec_b = fc.run_job(fc.script("after.sh"))
    assert rec_b["job_state"] == "COMPLETED" and not fc.drained()
    got = _records(fc, job_a)
    if fault in RECORDS_LOST:
        assert not got["job"] and not got["job_run"]
        return
    assert got["job_run"] and got["job_run"][0]["end_ts"], (fault, got, spooled_during)
    assert {"prolog", "epilog"} <= got["hook_runs"], got
    assert got["job"] and got["job"][0]["end_ts"] and got["job"][0]["user_name"] == "colocuser", got
    if fault in ("db-locked", "db-corrupt"):
        assert spooled_during >= 2, "a database fault must go through the spool"
    elif fault == "db-full-fs":  # SQLite reuses the existing WAL file's space, so some writes may still fit
        assert spooled_during >= 1
    assert not fc.spooled(), "everything pending was replayed"
    n1_hooks = fc.rows(fc.node_db("n1"), "SELECT hook, ok, detail_json FROM hook_runs WHERE job_id = ?",
                       (job_a,))
    if fault in EXPECT_FAILED:  # the fault really hit: the failed hook and its reason are on record
        hook, words = EXPECT_FAILED[fault]
        rows = [r for r in n1_hooks if r["hook"] == hook] + [
            r for r in fc.rows(fc.ctld_db,
                               "SELECT detail_json FROM events WHERE job_id = ? AND kind = 'hook-error'",
                               (job_a,)) if f'"{hook}"' in r["detail_json"]]
        assert any(words in r["detail_json"] and not r.get("ok") for r in rows), (fault, rows)
    if fault in ("scontrol-fails",
                 "scontrol-hangs"):  # the Epilog tears down and records without Slurm's answer
        ep = [r for r in n1_hooks if r["hook"] == "epilog"]
        assert len(ep) == 1 and ep[0]["ok"] and '"slurm"' in ep[0]["detail_json"], ep
    if fault == "nvml-erroring":
        # our fake lib answered
        assert "NVML cannot be initialised: Unknown Error" in fc.hooks_log.read_text()
    assert time.time() - t0 < 150
