"""The Epilog's flush request to the node sampler, so that a job's summary has its last samples.

The sampler writes its buffered rows once per ``sampler_batch_s``; rows read after its last write would be
missing from the summary the Epilog writes. So the Epilog (as root):

1. finds the sampler's pid in ``<run_dir>/sampler-<node>.lock`` (only while its flock is held) and checks that
   ``/proc/<pid>`` is our sampler: our uid, running ``slurm_coloc.cli.sampler`` (or ``coloc-sampler``)
   ``run``. Anything else is never signalled;
2. notes ``t_req`` and sends ``SIGUSR1``; the sampler writes its buffer at once and, after every write,
   replaces ``<run_dir>/sampler-<node>.flushed`` (root-owned 0644 JSON ``{"pid", "upto_ts", "flushes"}``:
   every frame read before ``upto_ts`` is stored);
3. waits until the marker names that pid with ``upto_ts >= t_req``, at most ``flush_wait_s(cfg)``, then
   summarises whatever the database holds.

A sampler that is absent, not ours or late is reported (``status``) and logged; it never fails the Epilog.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import stat
import time
from pathlib import Path
from typing import Any, Dict, Optional

from slurm_coloc.atomic import write_atomic
from slurm_coloc.config import Config

log = logging.getLogger("slurm_coloc.node.flush")

POLL_S = 0.05
MAX_WAIT_S = 3.0
MIN_WAIT_S = 1.0


def marker_path(cfg: Config, node: str) -> Path:
    """``<run_dir>/sampler-<node>.flushed``."""
    return Path(cfg.run_dir) / f"sampler-{node}.flushed"


def flush_wait_s(cfg: Config) -> float:
    """How long the Epilog waits for a requested flush: 2 x ``sampler_interval_s`` within [1, 3] s."""
    return max(MIN_WAIT_S, min(MAX_WAIT_S, 2.0 * cfg.sampler_interval_s))


def write_marker(cfg: Config, node: str, upto_ts: float, flushes: int) -> None:
    """Replace the marker atomically, no fsync (the sampler, after each write); ``upto_ts``: newest sample
    (Unix s).

    Raises:
        OSError: the run directory cannot be written.
    """
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


def request_flush(cfg: Config, node: str, pid: Optional[int], wait_s: Optional[float] = None) -> Dict[str,
                                                                                                      Any]:
    """SIGUSR1 to sampler ``pid`` (None or <= 0: none), then wait up to ``wait_s`` (None: ``flush_wait_s``)
    for its marker.

    Returns ``{"status": ..., ...}``: ``ok`` (with ``wait_ms``), ``no-sampler``, ``not-a-sampler`` (not
    signalled), ``signal-failed`` or ``timeout``. Never raises: every failure is a status (and logged).
    """
    wait_s = flush_wait_s(cfg) if wait_s is None else wait_s
    if not pid or pid <= 0:
        log.info("no sampler runs on %s: the summary has the samples already written", node)
        return {"status": "no-sampler"}
    if not is_our_sampler(pid):
        log.warning("the pid %s in the sampler lock of %s is not our sampler: not signalled", pid, node)
        return {"status": "not-a-sampler", "pid": pid}
    t0, t_req = time.monotonic(), time.time()
    try:
        os.kill(pid, signal.SIGUSR1)
    except OSError as exc:
        log.warning("cannot signal the sampler %s of %s: %s", pid, node, exc)
        return {"status": "signal-failed", "pid": pid, "error": str(exc)}
    while True:
        m = read_marker(cfg, node)
        if m and m.get("pid") == pid and isinstance(m.get("upto_ts"), (int, float)) and m["upto_ts"] >= t_req:
            return {"status": "ok", "pid": pid, "wait_ms": round((time.monotonic() - t0) * 1000, 1)}
        if time.monotonic() - t0 >= wait_s:
            log.warning("the sampler %s of %s did not flush within %.1f s: the summary may miss its last "
                        "samples",
                        pid, node, wait_s)
            return {"status": "timeout", "pid": pid, "wait_s": wait_s}
        time.sleep(POLL_S)
