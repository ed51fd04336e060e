"""The sampler daemon's process: its single-instance lock, its detached start by the node Prolog, and its
signal handlers.

One instance per node: an exclusive flock on ``<run_dir>/sampler-<node>.lock`` held for the daemon's life, the
lock file holding its pid. ``SIGTERM``/``SIGINT`` stop the sampling loop (node/sampler.py); ``SIGUSR1`` (sent
by the Epilog, node/flush.py) asks it to write its buffer at once.
"""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from slurm_coloc.config import Config

if TYPE_CHECKING:
    from slurm_coloc.node.sampler import Sampler

log = logging.getLogger("slurm_coloc.sampler")


def lock_path(cfg: Config, node: str) -> Path:
    """``<run_dir>/sampler-<node>.lock``."""
    return Path(cfg.run_dir) / f"sampler-{node}.lock"


def take_lock(cfg: Config, node: str) -> Optional[int]:
    """The single-instance lock's fd (kept open for life; pid written in), or None when another sampler holds
    it.

    Also ignores SIGUSR1 while its handler is the default (a flush request must not kill a starting sampler).

    Raises:
        OSError: the directory or file cannot be made or opened (e.g. a symlink), or ``flock`` fails other
            than by another holder.
    """
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


def install_signal_handlers(sampler: Sampler) -> None:
    """SIGTERM/SIGINT: finish the step, flush, exit. SIGUSR1: flush now (served by the loop, not here)."""
    def _stop(signum: int, frame: Any) -> None:
        sampler.stopping = True

    def _flush(signum: int, frame: Any) -> None:
        sampler.flush_requested = True
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGUSR1, _flush)
