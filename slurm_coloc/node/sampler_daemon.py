"""The sampler daemon's process as the node hooks see it: its single-instance lock, its detached start by the
Prolog, and the Epilog's flush request.

One instance per node: an exclusive flock on ``<run_dir>/sampler-<node>.lock`` held for the daemon's life, the
lock file holding its pid. ``SIGTERM``/``SIGINT`` stop the sampling loop and ``SIGUSR1`` asks it to write its
buffer at once (node/sampler.py).

The flush (the sampler writes its rows once per ``sampler_batch_s``; the summary needs the last ones):
the Epilog (root) takes the pid from the held lock, checks ``/proc/<pid>`` is our sampler (our uid, running
``coloc-sampler run``; anything else is never signalled), notes ``t_req`` and sends ``SIGUSR1``. After every
write the sampler replaces ``<run_dir>/sampler-<node>.flushed`` (root-owned 0644 JSON ``{"pid", "upto_ts",
"flushes"}``: every frame read before ``upto_ts`` is stored); the Epilog waits for ``upto_ts >= t_req`` at
most ``flush_wait_s``. A sampler absent, not ours or late is a ``status``, never an Epilog failure.
"""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Optional

from slurm_coloc.atomic import write_atomic
from slurm_coloc.config import Config

log = logging.getLogger("slurm_coloc.sampler")
flush_log = logging.getLogger("slurm_coloc.node.flush")

POLL_S = 0.05
MAX_WAIT_S = 3.0
MIN_WAIT_S = 1.0


def lock_path(cfg: Config, node: str) -> Path:
    """``<run_dir>/sampler-<node>.lock``."""
    return Path(cfg.run_dir) / f"sampler-{node}.lock"


def take_lock(cfg: Config, node: str) -> Optional[int]:
    """The single-instance lock's fd (kept open for life; pid written in), or None when another sampler holds
    it. Ignores SIGUSR1 while it is the default (a flush request must not kill a starting sampler). Raises
    OSError: the file cannot be made or opened (e.g. a symlink), or ``flock`` fails otherwise."""
    path = lock_path(cfg, node)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    fd = os.open(str(path), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return None
        raise
    if signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL:
        signal.signal(signal.SIGUSR1,
                      signal.SIG_IGN)  # a flush request must not kill a sampler still starting
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def running_pid(cfg: Config, node: str) -> Optional[int]:
    """Pid in the lock file of the sampler holding it; -1: held without a pid; None: nobody holds it."""
    path = lock_path(cfg, node)
    try:
        fd = os.open(str(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return None  # nobody holds it exclusively
        except OSError:
            text = os.read(fd, 64).decode(errors="replace").strip()
            return int(text) if text.isdigit() else -1
    finally:
        os.close(fd)


def ensure_running(cfg: Config, node: str, python: str = sys.executable) -> Optional[int]:
    """Pid of the running sampler, or of one started detached (new session, no fds); None if failed."""
    pid = running_pid(cfg, node)
    if pid:
        return pid
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "COLOC_CONFIG": os.environ.get("COLOC_CONFIG", "")}
    for k in ("LD_LIBRARY_PATH", "COLOC_LOG_LEVEL", "SLURM_CONF"):  # SLURM_CONF: the watchdog's scancel
        if os.environ.get(k):
            env[k] = os.environ[k]
    if not env["COLOC_CONFIG"]:
        del env["COLOC_CONFIG"]
    try:
        proc = subprocess.Popen([python, "-m", "slurm_coloc.cli.sampler", "run", "--node", node],
                                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True, cwd="/")
    except OSError as exc:
        log.error("cannot start coloc-sampler: %s", exc)
        return None
    return proc.pid


def marker_path(cfg: Config, node: str) -> Path:
    """``<run_dir>/sampler-<node>.flushed``."""
    return Path(cfg.run_dir) / f"sampler-{node}.flushed"


def flush_wait_s(cfg: Config) -> float:
    """How long the Epilog waits for a requested flush: 2 x ``sampler_interval_s`` within [1, 3] s."""
    return max(MIN_WAIT_S, min(MAX_WAIT_S, 2.0 * cfg.sampler_interval_s))


def write_marker(cfg: Config, node: str, upto_ts: float, flushes: int) -> None:
    """Replace the marker atomically, no fsync (the sampler, after each write); ``upto_ts``: newest sample
    (Unix s). Raises OSError: the run directory cannot be written."""
    data = json.dumps({"pid": os.getpid(), "upto_ts": upto_ts, "flushes": flushes}).encode("utf-8")
    write_atomic(marker_path(cfg, node), data, 0o644)


def read_marker(cfg: Config, node: str) -> Optional[Dict[str, Any]]:
    """``{"pid", "upto_ts", "flushes"}``; None if absent, bad, a symlink, irregular, not ours or shared."""
    try:
        fd = os.open(str(marker_path(cfg, node)), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return None
        data = json.loads(os.read(fd, 4096).decode("utf-8"))
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def is_our_sampler(pid: int, proc_root: str = "/proc") -> bool:
    """Whether ``pid`` runs ``coloc-sampler run`` (or ``-m slurm_coloc.cli.sampler run``) as our uid."""
    try:
        args = [a.decode(errors="replace")
                for a in Path(proc_root, str(pid), "cmdline").read_bytes().split(b"\0")]
        uid = next(int(ln.split()[1]) for ln in Path(proc_root, str(pid), "status").read_text().splitlines()
                   if ln.startswith("Uid:"))
    except (OSError, ValueError, IndexError, StopIteration):
        return False
    ours = "slurm_coloc.cli.sampler" in args or any(os.path.basename(a) == "coloc-sampler" for a in args[:2])
    return uid == os.geteuid() and ours and "run" in args


def request_flush(cfg: Config, node: str, pid: Optional[int],
                  wait_s: Optional[float] = None) -> Dict[str, Any]:
    """SIGUSR1 to sampler ``pid`` (None or <= 0: none), then wait up to ``wait_s`` (None: ``flush_wait_s``)
    for its marker; ``{"status": ..., ...}``: ``ok`` (with ``wait_ms``), ``no-sampler``, ``not-a-sampler``
    (not signalled), ``signal-failed`` or ``timeout``. Never raises: a failure is a status (and logged)."""
    wait_s = flush_wait_s(cfg) if wait_s is None else wait_s
    if not pid or pid <= 0:
        flush_log.info("no sampler runs on %s: the summary has the samples already written", node)
        return {"status": "no-sampler"}
    if not is_our_sampler(pid):
        flush_log.warning("the pid %s in the sampler lock of %s is not our sampler: not signalled", pid, node)
        return {"status": "not-a-sampler", "pid": pid}
    t0, t_req = time.monotonic(), time.time()
    try:
        os.kill(pid, signal.SIGUSR1)
    except OSError as exc:
        flush_log.warning("cannot signal the sampler %s of %s: %s", pid, node, exc)
        return {"status": "signal-failed", "pid": pid, "error": str(exc)}
    while True:
        m = read_marker(cfg, node)
        if m and m.get("pid") == pid and isinstance(m.get("upto_ts"), (int, float)) and m["upto_ts"] >= t_req:
            return {"status": "ok", "pid": pid, "wait_ms": round((time.monotonic() - t0) * 1000, 1)}
        if time.monotonic() - t0 >= wait_s:
            flush_log.warning("the sampler %s of %s did not flush within %.1f s: the summary may miss its "
                              "last samples", pid, node, wait_s)
            return {"status": "timeout", "pid": pid, "wait_s": wait_s}
        time.sleep(POLL_S)
