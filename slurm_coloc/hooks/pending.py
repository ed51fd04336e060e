"""A hook run's start-up age and its pending environment: the ``.env`` entries of the recovery queue
(store/queue.py), left by a run that ends before it can record (SIGTERMed in start-up, killed, crashed), from
which a later run builds its rows (hooks/record.py ``recovered_ops``). Entry ``<dir>/<hook>-<job>-<run>.env``:
NUL-separated ``NAME=value`` items (``env -0``) of the job's ``SLURM_*``/``SLURMD_*``/``SPANK_COLOC_*``
variables, ``USER``, ``COLOC_CONFIG`` and ``COLOC_PENDING_*`` (``HOOK``; ``RC``: ``startup`` or the shim's rc;
``TS``: end; ``UP0``/``UP1``: ``/proc/uptime``). ``<run>``: the shim's ``COLOC_SHIM_RUN``, so the shim and
``coloc-hook`` name one run's entry alike. Values are data, never evaluated. Directory:
``$COLOC_PENDING_DIR``, else ``DEFAULT_DIR``. Light on purpose (os, time, store/queue.py): ``coloc-hook``'s
start-up path uses it."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Dict, Mapping, Optional, Tuple

from slurm_coloc.store import queue

DEFAULT_DIR = "/var/lib/slurm-coloc/pending"  # = prolog_epilog/coloc-hook.sh
SUFFIX = ".env"
KEEP_PREFIXES = ("SLURM_", "SLURMD_", "SPANK_COLOC_", "COLOC_PENDING_")
KEEP_NAMES = ("USER", "COLOC_CONFIG")
NODE_HOOKS = ("prolog", "epilog")
CTLD_HOOKS = ("prolog-slurmctld", "epilog-slurmctld")
MAX_RUN_S = 86400.0  # a run length (UP1 - UP0) outside 0..this is taken as unknown (0)


def pending_dir(env: Mapping[str, str]) -> str:
    """``$COLOC_PENDING_DIR`` when absolute, else ``DEFAULT_DIR`` (pure, never raises)."""
    value = env.get("COLOC_PENDING_DIR", "")
    return value if value.startswith("/") else DEFAULT_DIR


def _token(value: str, allowed: str = "0123456789-.", default: str = "none") -> str:
    kept = "".join(ch for ch in value if ch in allowed)[:64]
    return kept or default


def entry_name(hook: str, env: Mapping[str, str]) -> str:
    """``<hook>-<job>-<run>.env``: ``run`` the shim's ``COLOC_SHIM_RUN`` (pid and uptime), else pid-ns. The
    job is ``none`` when not a number; ``run`` is kept to 64 digits, ``-`` and ``.``."""
    job = env.get("SLURM_JOB_ID", "")
    run = env.get("COLOC_SHIM_RUN", "") or f"{os.getpid()}-{time.time_ns()}"
    return f"{hook}-{job if job.isdigit() else 'none'}-{_token(run)}{SUFFIX}"


def keep(name: str) -> bool:
    """Whether a variable goes into an entry: in ``KEEP_NAMES`` or with a prefix of ``KEEP_PREFIXES``."""
    return name in KEEP_NAMES or name.startswith(KEEP_PREFIXES)


def encode(hook: str, env: Mapping[str, str], reason: str, up0: float, up1: float) -> bytes:
    """An entry's bytes: ``env``'s kept variables and the run's ``COLOC_PENDING_*`` items, sorted,
    NUL-separated, cut at ``queue.MAX_ENTRY_BYTES`` (items holding a NUL left out). ``up0``/``up1``:
    ``/proc/uptime`` (s)."""
    items = {k: v for k, v in env.items() if keep(k) and not k.startswith("COLOC_PENDING_")}
    items.update({"COLOC_PENDING_HOOK": hook, "COLOC_PENDING_RC": reason,
                  "COLOC_PENDING_TS": f"{time.time():.6f}",
                  "COLOC_PENDING_UP0": f"{up0:.2f}", "COLOC_PENDING_UP1": f"{up1:.2f}"})
    data = b"".join(f"{k}={v}".encode("utf-8", "replace") + b"\0" for k, v in sorted(items.items())
                    if "\0" not in k + v)
    return data[:queue.MAX_ENTRY_BYTES]


def process_age_s() -> float:
    """Seconds since exec (``/proc/self/stat`` start time vs ``/proc/uptime``); 0 if unknown."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime_s - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def write_entry(hook: str, env: Mapping[str, str], reason: str, up0: Optional[float] = None) -> Optional[str]:
    """Write this run's entry (``queue.write``, no fsync: little time left); its path, or None (not a node or
    slurmctld hook, unusable directory, queue full). ``up0`` None: this process's exec time. Never raises."""
    try:
        if hook not in NODE_HOOKS + CTLD_HOOKS:
            return None
        up1 = _uptime()
        if up0 is None:
            up0 = up1 - process_age_s()
        return (queue.write(pending_dir(env), entry_name(hook, env), encode(hook, env, reason, up0, up1),
                            sync=False))
    except BaseException:  # called while being terminated: never fail the node
        return None


def _uptime() -> float:
    try:
        with open("/proc/uptime", "rb") as fh:
            return float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0


def decode(data: bytes) -> Dict[str, str]:
    """The variables of an entry (``encode``). Raises queue.EntryError (an item not ``NAME=value`` with a kept
    name, or no known ``COLOC_PENDING_HOOK``)."""
    env: Dict[str, str] = {}
    for item in data.split(b"\0"):
        if not item:
            continue
        key, sep, value = item.decode("utf-8", "replace").partition("=")
        if not sep or not key or not all(c.isascii() and (c.isalnum() or c == "_")
                                         for c in key) or not keep(key):
            raise queue.EntryError(f"malformed item {item[:80]!r}")
        env[key] = value
    if env.get("COLOC_PENDING_HOOK") not in NODE_HOOKS + CTLD_HOOKS:
        raise queue.EntryError(f"no known hook ({env.get('COLOC_PENDING_HOOK')!r:.40})")
    return env


def times_of(env: Mapping[str, str], path_mtime: float) -> Tuple[float, float]:
    """``(started_ts, ended_ts)`` of the run, Unix s (pure, never raises). The end is ``TS`` (else the file's
    mtime); the length is ``UP1 - UP0`` from ``/proc/uptime`` (0 when unknown or outside 0..``MAX_RUN_S``)."""
    try:
        ended = float(env.get("COLOC_PENDING_TS", ""))
    except ValueError:
        ended = path_mtime
    if not ended == ended or not 0 < ended < 1e11:  # NaN, absurd
        ended = path_mtime
    try:
        length = float(env["COLOC_PENDING_UP1"]) - float(env["COLOC_PENDING_UP0"])
    except (KeyError, ValueError):
        length = 0.0
    if not 0.0 <= length < MAX_RUN_S:
        length = 0.0
    return ended - length, ended
