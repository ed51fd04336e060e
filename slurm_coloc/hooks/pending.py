"""Pending hook environments: what a hook run that ended before it could record leaves, replayed later.

A hook process SIGTERMed by the shim's ``timeout`` during its Python start-up (an overloaded host: 24 s of
imports, docs/reliability.md "Load"), SIGKILLed, or crashed, records nothing itself. Its rows can still be built
from its environment alone (hooks/record.py ``record_ops``), so the environment is kept: one file per hook run,
``<dir>/<hook>-<job>-<run>.env``, holding ``NAME=value`` items separated by NUL (``env -0``): the job's
``SLURM_*``/``SLURMD_*``/``SPANK_COLOC_*`` variables, ``USER``, ``COLOC_CONFIG`` and the run's own
``COLOC_PENDING_*`` (hook, reason/rc, wall-clock end ``TS``, ``/proc/uptime`` at start/end ``UP0``/``UP1``).

Written by the shim (prolog_epilog/coloc-hook.sh: the hook ended with rc != 0) or by ``coloc-hook`` itself when
SIGTERMed during start-up (cli/hook.py; it then exits 0 so the shim adds none). Both name the entry after the
shim's run id (``COLOC_SHIM_RUN``), so one run leaves at most one entry. The next hook run of the same database
(hooks/record.py ``replay_pending``) claims entries by renaming them, builds their rows and applies them with
``once`` windows (store/spool.py): replaying an entry twice, or one whose run did record, changes nothing.

Directory: ``$COLOC_PENDING_DIR``, default ``/var/lib/slurm-coloc/pending`` (the shim cannot read the YAML
config; the cluster scripts set it per cluster). Root-only (0700, owned by the hook's uid); entries are read
with ``O_NOFOLLOW``, must be regular files owned by that uid, not group/other-writable, at most
``MAX_ENTRY_BYTES``; values are data (never evaluated). Unusable entries are renamed ``.bad`` and logged.

A light module (os, stat, time and store/claims.py only): ``coloc-hook`` writes entries from its start-up path, before its imports.
"""
from __future__ import annotations

import os
import stat
import time
from typing import Dict, List, Mapping, Optional

from slurm_coloc.store import claims

DEFAULT_DIR = "/var/lib/slurm-coloc/pending"  # = prolog_epilog/coloc-hook.sh
SUFFIX = ".env"
MAX_ENTRY_BYTES = 256 * 1024
MAX_PENDING = 10_000
STALE_CLAIM_S = claims.STALE_CLAIM_S
KEEP_PREFIXES = ("SLURM_", "SLURMD_", "SPANK_COLOC_", "COLOC_PENDING_")
KEEP_NAMES = ("USER", "COLOC_CONFIG")
NODE_HOOKS = ("prolog", "epilog")
CTLD_HOOKS = ("prolog-slurmctld", "epilog-slurmctld")


class PendingError(ValueError):
    """An entry that cannot be used (unsafe file, malformed content); it is set aside, never executed."""


def pending_dir(env: Mapping[str, str]) -> str:
    """The pending directory of this hook's environment: ``$COLOC_PENDING_DIR`` or ``DEFAULT_DIR``."""
    value = env.get("COLOC_PENDING_DIR", "")
    return value if value.startswith("/") else DEFAULT_DIR


def _token(value: str, allowed: str = "0123456789-.", default: str = "none") -> str:
    kept = "".join(ch for ch in value if ch in allowed)[:64]
    return kept or default


def entry_name(hook: str, env: Mapping[str, str]) -> str:
    """``<hook>-<job>-<run>.env``: ``run`` is the shim's ``COLOC_SHIM_RUN`` (pid and uptime), else pid-ns."""
    job = env.get("SLURM_JOB_ID", "")
    run = env.get("COLOC_SHIM_RUN", "") or f"{os.getpid()}-{time.time_ns()}"
    return f"{hook}-{job if job.isdigit() else 'none'}-{_token(run)}{SUFFIX}"


def keep(name: str) -> bool:
    """Whether an environment variable goes into an entry (what record.py's row builder may read)."""
    return name in KEEP_NAMES or name.startswith(KEEP_PREFIXES)


def safe_dir(path: str, create: bool) -> Optional[str]:
    """``path`` if it is a real directory owned by us and not group/other-accessible (created 0700 when asked and
    absent; never through a symlink); None otherwise."""
    try:
        if create and not os.path.lexists(path):
            old = os.umask(0o022)
            try:
                os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
                try:
                    os.mkdir(path, 0o700)
                except FileExistsError:
                    pass
            finally:
                os.umask(old)
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return None
    return path


def write_entry(hook: str, env: Mapping[str, str], reason: str, up0: Optional[float] = None) -> Optional[str]:
    """Write this run's pending entry atomically (temp file with O_EXCL|O_NOFOLLOW, 0600, then rename).

    Args:
        hook: the hook name (a node or slurmctld hook; others keep nothing).
        env: the hook's environment (filtered by ``keep``).
        reason: why the run could not record (``startup`` or the shim's rc).
        up0: ``/proc/uptime`` when the run began (default: this process's exec time).

    Returns:
        The entry's path, or None when nothing was written (no such hook, unusable directory, spool full).
        Never raises.
    """
    try:
        if hook not in NODE_HOOKS + CTLD_HOOKS:
            return None
        d = safe_dir(pending_dir(env), create=True)
        if d is None or len(os.listdir(d)) >= MAX_PENDING:
            return None
        up1 = _uptime()
        if up0 is None:
            from slurm_coloc.hooks.startup import process_age_s
            up0 = up1 - process_age_s()
        items = {k: v for k, v in env.items() if keep(k) and not k.startswith("COLOC_PENDING_")}
        items.update({"COLOC_PENDING_HOOK": hook, "COLOC_PENDING_RC": reason, "COLOC_PENDING_TS": f"{time.time():.6f}",
                      "COLOC_PENDING_UP0": f"{up0:.2f}", "COLOC_PENDING_UP1": f"{up1:.2f}"})
        data = b"".join(f"{k}={v}".encode("utf-8", "replace") + b"\0" for k, v in sorted(items.items())
                        if "\0" not in k + v)
        name = entry_name(hook, env)
        tmp = os.path.join(d, f".{name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, data[:MAX_ENTRY_BYTES])
        finally:
            os.close(fd)
        os.rename(tmp, os.path.join(d, name))
        return os.path.join(d, name)
    except BaseException:  # noqa: BLE001 - called while being terminated: never fail the node
        return None


def _uptime() -> float:
    try:
        with open("/proc/uptime", "rb") as fh:
            return float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0


def candidates(d: str) -> List[str]:
    """Entry paths of ``d`` to replay, oldest first (a Prolog's before its Epilog's): ``*.env`` and stale claims
    (store/claims.py: the claimer's pid is gone, or older than ``STALE_CLAIM_S``)."""
    try:
        names = os.listdir(d)
    except OSError:
        return []
    now = time.time()
    out = []
    for n in names:
        p = os.path.join(d, n)
        claim = claims.is_claim(n, SUFFIX)
        if not claim and (not n.endswith(SUFFIX) or n.startswith(".")):
            continue
        try:
            mtime = os.lstat(p).st_mtime
        except OSError:
            continue
        if not claim or claims.claim_is_stale(p, mtime, now):
            out.append((mtime, n, p))
    return [p for _, _, p in sorted(out)]


def read_entry(path: str) -> Dict[str, str]:
    """Parse an entry without following symlinks. Raises PendingError when unsafe or malformed,
    FileNotFoundError when it is gone (claimed by another replayer)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise PendingError(f"cannot open: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PendingError("not a regular file")
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise PendingError(f"owned by uid {st.st_uid} (mode {st.st_mode & 0o777:o}): not ours alone")
        if st.st_size > MAX_ENTRY_BYTES:
            raise PendingError(f"{st.st_size} bytes, over {MAX_ENTRY_BYTES}")
        data = os.read(fd, MAX_ENTRY_BYTES + 1)
    except OSError as exc:
        raise PendingError(f"cannot read: {exc.strerror}") from None
    finally:
        os.close(fd)
    env: Dict[str, str] = {}
    for item in data.split(b"\0"):
        if not item:
            continue
        key, sep, value = item.decode("utf-8", "replace").partition("=")
        if not sep or not key or not all(c.isascii() and (c.isalnum() or c == "_") for c in key) or not keep(key):
            raise PendingError(f"malformed item {item[:80]!r}")
        env[key] = value
    if env.get("COLOC_PENDING_HOOK") not in NODE_HOOKS + CTLD_HOOKS:
        raise PendingError(f"no known hook ({env.get('COLOC_PENDING_HOOK')!r:.40})")
    return env


def times_of(env: Mapping[str, str], path_mtime: float) -> tuple:
    """``(started_ts, ended_ts)`` of the run: its wall-clock end (``TS``, else the file's mtime) and its length
    from ``/proc/uptime`` at start and end (``UP0``/``UP1``; 0 when unknown or implausible)."""
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
    if not 0.0 <= length < 86400.0:
        length = 0.0
    return ended - length, ended
