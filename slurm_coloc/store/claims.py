"""Claims on spool and pending entries: how a replayer takes a file, and when a claim may be taken again.

A replayer renames entry ``<base>`` to ``<base>.<pid>.replaying`` (atomic: a second replayer's rename fails), applies
it, then unlinks the claim. A claim whose replayer is gone (its pid no longer exists: SIGKILLed by the shim's
``timeout -k`` under load, docs/reliability.md "Load") or older than ``STALE_CLAIM_S`` is taken again; entries
are idempotent (once windows, store/spool.py), so taking one again changes nothing when it had been applied.

A light module (os, re only): hooks/pending.py uses it from ``coloc-hook``'s start-up path.
"""
from __future__ import annotations

import os
import re
from typing import Optional, Tuple

STALE_CLAIM_S = 120.0  # > any hook's bound (the shim's 30 s + 2 s kill); only for claims without a live-pid test

_CLAIM_RE = re.compile(r"^(?P<base>[^/]+?)(?:\.(?P<pid>[0-9]{1,10}))?\.replaying$")


def claim_name(base: str) -> str:
    """The name a replayer renames entry ``base`` (a path or name) to: ``<base>.<pid>.replaying``."""
    return f"{base}.{os.getpid()}.replaying"


def split_claim(name: str) -> Tuple[str, Optional[int]]:
    """``(base name, claimer pid)`` of a claim name (``<base>.<pid>.replaying``; the older ``<base>.replaying``
    has no pid: None). Raises ValueError for a name that is not a claim."""
    m = _CLAIM_RE.match(name)
    if m is None:
        raise ValueError(f"not a claim name: {name!r:.100}")
    return m.group("base"), int(m.group("pid")) if m.group("pid") else None


def is_claim(name: str, suffix: str) -> bool:
    """Whether ``name`` is a claim of an entry whose name ends with ``suffix`` (``.json``, ``.env``)."""
    m = _CLAIM_RE.match(name)
    return m is not None and m.group("base").endswith(suffix) and not name.startswith(".")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def claim_is_stale(path: str, mtime: float, now: float) -> bool:
    """Whether the claim at ``path`` (modified at ``mtime``) may be taken again: its replayer's pid is gone or is
    this process, or the claim is older than ``STALE_CLAIM_S`` seconds (a pid reused meanwhile, or no pid)."""
    try:
        _, pid = split_claim(os.path.basename(path))
    except ValueError:
        return False
    if now - mtime > STALE_CLAIM_S:
        return True
    # our own pid: a replay loop holds its claims only while it applies them and never lists them again, so a
    # claim of ours seen here was left by an earlier replay this process cut short (the recording alarm)
    return pid is not None and (pid == os.getpid() or not _pid_alive(pid))
