"""The recovery queue: root-only entry files that hook runs leave when they cannot record, replayed later. One
entry is one file in a queue directory; its kind is its suffix (``.json``: a record set, store/recordset.py;
``.env``: the environment of a run that ended before recording, hooks/pending.py). This module treats every
kind alike and knows nothing of their content or of the database:

- Directory: a real directory (never a symlink) owned by the effective uid, mode 0700 (looser on our own:
  tightened; another owner: refused). Created 0700 with 0755 parents when a writer needs it.
- Writing: temp file ``.<name>.<pid>.tmp`` opened ``O_CREAT|O_EXCL|O_NOFOLLOW``, 0600, optionally fsynced,
  renamed to ``<name>``; at most ``MAX_ENTRIES`` files per directory and ``MAX_ENTRY_BYTES`` per entry.
- Reading: ``O_NOFOLLOW``; a regular file owned by the effective uid, not group/other-writable, at most
  ``MAX_ENTRY_BYTES``. Anything else is unusable (``EntryError``).
- Claims: a replayer renames ``<name>`` to ``<name>.<pid>.replaying`` (atomic), applies it, then unlinks the
  claim. A claim is stale, and taken again, when its pid is gone or is this process, or when it is older
  than ``STALE_CLAIM_S`` (a reused pid, or a claim name without a pid).
- Replay: entries of all given directories, by kind (the caller's order), mtime, name; one time budget. An
  entry that cannot be read, decoded or applied is renamed ``<name>.bad`` (logged) and the replay goes on;
  only the store's own error (``keep``: locked, full, corrupt) or a ``BaseException`` (recording alarm,
  SIGTERM) puts the claimed entry back and stops the replay, propagating the error.

Light on purpose (os, re, stat, time; logging only once an entry is set aside): ``coloc-hook`` writes entries
from its start-up path."""
from __future__ import annotations

import os
import re
import stat
import time
from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple, TypeVar

from slurm_coloc.atomic import make_dirs, write_atomic
from slurm_coloc.errors import StoreError

MAX_ENTRIES = 10_000  # files per directory; beyond it a new entry is refused (the queue must not fill /run)
MAX_ENTRY_BYTES = 256 * 1024
MAX_REPLAY = 500  # entries applied by one replay call
# > any hook process's bound (the shim's 30 s + its 2 s kill): only for claims without a pid
STALE_CLAIM_S = 120.0
CLAIM_SUFFIX = ".replaying"
BAD_SUFFIX = ".bad"

_CLAIM_RE = re.compile(r"^(?P<base>[^/]+?)(?:\.(?P<pid>[0-9]{1,10}))?\.replaying$")
_Item = TypeVar("_Item")  # what a replayer decodes an entry to


class EntryError(ValueError):
    """An entry that cannot be used (unsafe file, malformed content); it is set aside, never applied."""


class Entry(NamedTuple):
    """One entry as read for replay: ``path`` where it lies now (entry or stale claim), ``name`` without a
    claim suffix, ``kind`` its suffix, ``data`` at most ``MAX_ENTRY_BYTES``, ``mtime`` Unix s."""

    path: str
    name: str
    kind: str
    data: bytes
    mtime: float


def safe_dir(path: str, create: bool = False) -> str:
    """``path``, checked (with ``create``, made 0700, parents 0755): a real directory of ours, mode 0700.
    Raises StoreError (absent (without ``create``), a symlink or file, owned by another uid, or an OS error).
    """
    try:
        if create and not os.path.lexists(path):
            make_dirs(os.path.abspath(path), 0o700)
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode):
            raise StoreError(f"queue directory {path!r} is not a directory (symlink or file): refused")
        if st.st_uid != os.geteuid():
            raise StoreError(f"queue directory {path!r} is owned by uid {st.st_uid}, not {os.geteuid()}: "
                             "refused")
        if st.st_mode & 0o077:
            os.chmod(path, 0o700)
    except OSError as exc:
        raise StoreError(f"queue directory {path!r} is unusable: {exc.strerror or exc}") from None
    return path


def write(directory: str, name: str, data: bytes, sync: bool = True) -> str:
    """Write entry ``name`` atomically (temp file, optional fsync, rename), 0600, never through a symlink; its
    path (directory created 0700 if absent). Raises StoreError (unusable directory, ``MAX_ENTRIES`` there,
    ``data`` over ``MAX_ENTRY_BYTES``, an OS error)."""
    d = safe_dir(directory, create=True)
    if len(data) > MAX_ENTRY_BYTES:
        raise StoreError(f"queue entry of {len(data)} bytes is over {MAX_ENTRY_BYTES}")
    try:
        if len(os.listdir(d)) >= MAX_ENTRIES:
            raise StoreError(f"queue directory {d!r} holds {MAX_ENTRIES} entries: not adding more")
        write_atomic(os.path.join(d, name), data, 0o600, sync=sync)
    except OSError as exc:
        raise StoreError(f"cannot write queue entry in {d!r}: {exc.strerror or exc}") from None
    return os.path.join(d, name)


def read(path: str) -> Tuple[bytes, float]:
    """``(data, mtime)`` (at most ``MAX_ENTRY_BYTES``; Unix s) of the entry at ``path`` (no symlink). Raises
    FileNotFoundError (claimed by another replayer), EntryError (not a regular file of ours alone, too large,
    unreadable)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise EntryError(f"cannot open: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise EntryError("not a regular file")
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise EntryError(f"owned by uid {st.st_uid} (mode {st.st_mode & 0o777:o}): not ours alone")
        if st.st_size > MAX_ENTRY_BYTES:
            raise EntryError(f"{st.st_size} bytes, over {MAX_ENTRY_BYTES}")
        return os.read(fd, MAX_ENTRY_BYTES + 1), st.st_mtime
    except OSError as exc:
        raise EntryError(f"cannot read: {exc.strerror}") from None
    finally:
        os.close(fd)


def claim_name(base: str) -> str:
    """The name a replayer renames entry ``base`` (path or name) to: ``<base>.<pid>.replaying``, this pid."""
    return f"{base}.{os.getpid()}{CLAIM_SUFFIX}"


def split_claim(name: str) -> Tuple[str, Optional[int]]:
    """``(entry name, claimer pid)`` of ``<name>.<pid>.replaying`` (older ``<name>.replaying``: pid None).
    Raises ValueError (a name that is not a claim)."""
    m = _CLAIM_RE.match(name)
    if m is None:
        raise ValueError(f"not a claim name: {name!r:.100}")
    return m.group("base"), int(m.group("pid")) if m.group("pid") else None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def claim_is_stale(name: str, mtime: float, now: float) -> bool:
    """Whether claim ``name`` may be taken again (not a claim: False); Unix s. Stale: its pid is gone or is
    ours (a replay holds claims only while applying), or it is older than ``STALE_CLAIM_S``."""
    try:
        _, pid = split_claim(os.path.basename(name))
    except ValueError:
        return False
    if now - mtime > STALE_CLAIM_S:
        return True
    return pid is not None and (pid == os.getpid() or not _pid_alive(pid))


def _kind(name: str, kinds: Sequence[str]) -> Optional[str]:
    return next((k for k in kinds if name.endswith(k)), None)


def candidates(directories: Sequence[str], kinds: Sequence[str]) -> List[Tuple[str, str, str]]:
    """``(path, entry name, kind)`` of each entry (or stale claim) of ``kinds`` in ``directories``. Unsafe or
    unreadable directories are skipped. Ordered by kind (as in ``kinds``), then mtime, then name."""
    out = []
    now = time.time()
    for d in directories:
        try:
            safe_dir(d)
            names = os.listdir(d)
        except (StoreError, OSError):
            continue
        for n in names:
            if n.startswith("."):
                continue
            base = n
            if n.endswith(CLAIM_SUFFIX):
                try:
                    base = split_claim(n)[0]
                except ValueError:
                    continue
            kind = _kind(base, kinds)
            if kind is None:
                continue
            p = os.path.join(d, n)
            try:
                mtime = os.lstat(p).st_mtime
            except OSError:
                continue
            if base == n or claim_is_stale(n, mtime, now):
                out.append((kinds.index(kind), mtime, n, p, base, kind))
    return [(p, base, kind) for _, _, _, p, base, kind in sorted(out)]


def set_aside(path: str, name: str, why: object) -> None:
    """Rename the entry at ``path`` to ``<name>.bad`` beside it (a symlink moved, not followed); logged. Never
    raises: a failed rename is logged."""
    import logging

    log = logging.getLogger("slurm_coloc.store.queue")
    bad = os.path.join(os.path.dirname(path), name + BAD_SUFFIX)
    try:
        os.rename(path, bad)
        log.error("queue entry %s is unusable (%s): set aside as %s",
                  os.path.join(os.path.dirname(path), name),
                  why, bad)
    except OSError as exc:
        log.error("queue entry %s is unusable (%s) and cannot be set aside: %s", path, why, exc)


def replay(directories: Sequence[str], kinds: Sequence[str], decode: Callable[[Entry], Optional[_Item]],
           apply: Callable[[Entry, _Item], None], keep: Callable[[Exception], bool], budget_s: float,
           max_entries: int = MAX_REPLAY) -> int:
    """Apply the entries of ``directories`` (``candidates`` order) and delete them; how many were applied.
    ``decode(entry)``: the item, or None for another replayer's entry (left); ``apply(entry, item)`` writes it
    in one transaction. An ``Exception`` of either sets the entry aside, unless ``keep(exc)`` says it is the
    store's own (locked, full, corrupt): then the entry is put back and the error propagates. No entry is
    started after ``budget_s`` seconds or ``max_entries`` entries."""
    t_end = time.monotonic() + budget_s
    done = 0
    for path, name, kind in candidates(directories, kinds):
        if done >= max_entries or time.monotonic() > t_end:
            break
        try:
            data, mtime = read(path)
            item = decode(Entry(path, name, kind, data, mtime))
        except FileNotFoundError:
            continue  # claimed by another replayer meanwhile
        except Exception as exc:  # whatever an entry holds, it must not block the others
            set_aside(path, name, exc)
            continue
        if item is None:
            continue
        base = os.path.join(os.path.dirname(path), name)
        claimed = claim_name(base)
        try:
            os.rename(path, claimed)  # atomic: a second replayer misses it (a stale claim is re-claimed)
            os.utime(claimed)
        except OSError:
            continue
        try:
            apply(Entry(claimed, name, kind, data, mtime), item)
        except Exception as exc:
            if keep(exc):
                _put_back(claimed, base)
                raise
            set_aside(claimed, name, f"{type(exc).__name__}: {exc}")
            continue
        except BaseException:  # the recording alarm or SIGTERM: still pending
            _put_back(claimed, base)
            raise
        try:
            os.unlink(claimed)
        except OSError:
            pass
        done += 1
    return done


def _put_back(claimed: str, base: str) -> None:
    try:
        os.rename(claimed, base)
    except OSError:
        pass  # the claim stays: stale as soon as this process is gone (or at once for this pid)
