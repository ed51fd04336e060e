"""The pending-records spool: what a hook could not write to its database, kept until the store works again.

A hook whose database is locked past its budget, on a full filesystem, corrupt or missing still has to exit 0
quickly (facts §5: a failing Prolog/Epilog drains the node). What it would have recorded goes into one JSON file
per hook run in a root-only spool directory (``<run_dir>/spool``, 0700, owned by the hook's uid, never followed
through a symlink); the next hook on the same host that opens the same database replays the pending files into
it, each in one transaction, and deletes them.

Entry format (``<ns>-<pid>.json``)::

    {"target": "ctld" | "node:<name>", "ts": <unix s>, "ops": [{"op": <kind>, "row": {...}}, ...]}

Op kinds and how a replay applies them (never overwriting what a successful hook wrote):

- ``hook_run``: append a ``hook_runs`` row (node DB).
- ``node_event``: append a ``node_events`` row (node DB).
- ``event``: append an ``events`` row (ctld DB).
- ``job_start``: insert the ``job_runs`` row if absent (node DB).
- ``job_end``: set a ``job_runs`` row's end columns where ``end_ts`` is NULL; insert it if absent (node DB).
- ``submission``: insert the ``jobs`` row if absent, else fill its NULL columns (ctld DB).
- ``ctld_end``: set a ``jobs`` row's end columns where ``end_ts`` is NULL; insert it if absent (ctld DB).

An op may carry ``"once": [t0, t1]`` (recovered runs, hooks/pending.py): a ``hook_run`` is then skipped when a
row of the same job, node and hook has ``ts`` in that window, an ``event`` when one of the same job, kind and
``hook`` has; so a run recorded by itself and recovered too, or recovered twice, leaves one row.

Exactly-once: a replayer claims a file by renaming it to ``<name>.<pid>.replaying`` (atomic; a second replayer
misses it), commits the ops in one transaction, then unlinks it. A claim whose replayer is gone (its pid no
longer exists: SIGKILLed by the shim's ``timeout -k``, seen under load) or older than ``STALE_CLAIM_S`` is taken
again. The ops a hook writes are idempotent (appends carry a ``once`` window of their own timestamp,
hooks/record.py ``record_ops``; the rest insert-if-absent or fill NULLs), so replaying a file whose replayer died
between its commit and its unlink changes nothing.
"""
from __future__ import annotations

import json
import logging
import os
import stat
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from sqlite_utils import Database

from slurm_coloc.errors import StoreError
from slurm_coloc.store.claims import STALE_CLAIM_S, claim_is_stale, claim_name, is_claim, split_claim

log = logging.getLogger("slurm_coloc.store")

MAX_PENDING = 10_000  # files; beyond this a new entry is only logged (the spool must not fill /run)
MAX_ENTRY_BYTES = 256 * 1024
OPS = ("hook_run", "node_event", "event", "job_start", "job_end", "submission", "ctld_end")
_JOB_RUN_END = ("end_ts", "state", "exit_code", "signal")
_JOB_END = ("end_ts", "state", "exit_code", "signal", "node_list", "start_ts", "updated_ts")


def _safe_dir(path: Path) -> Path:
    """Create ``path`` 0700 (parents 0755) or check an existing one: a real directory owned by us, not group/other
    accessible. Raises StoreError otherwise (a planted symlink or a user-owned directory is refused)."""
    if not os.path.lexists(path):
        old = os.umask(0o022)
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                pass
        finally:
            os.umask(old)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise StoreError(f"spool {str(path)!r} is not a directory (symlink or file): refused")
    if st.st_uid != os.geteuid():
        raise StoreError(f"spool {str(path)!r} is owned by uid {st.st_uid}, not {os.geteuid()}: refused")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def write_entry(spool_dir: Path, target: str, ops: Sequence[Dict[str, Any]]) -> Path:
    """Write one pending entry atomically (temp file, fsync, rename); 0600, never through a symlink.

    Args:
        spool_dir: the spool directory (created 0700 if absent).
        target: ``"ctld"`` or ``"node:<name>"``.
        ops: ``[{"op": <one of OPS>, "row": {...}}, ...]``.

    Returns:
        The entry's path.

    Raises:
        StoreError: unusable directory, spool full (``MAX_PENDING``), entry too large, or an OS error (disk full).
    """
    d = _safe_dir(Path(spool_dir))
    if sum(1 for _ in os.scandir(d)) >= MAX_PENDING:
        raise StoreError(f"spool {str(d)!r} holds {MAX_PENDING} pending entries: not adding more")
    data = json.dumps({"target": target, "ts": time.time(), "ops": list(ops)}, sort_keys=True,
                      default=str).encode()
    if len(data) > MAX_ENTRY_BYTES:
        raise StoreError(f"spool entry of {len(data)} bytes is over {MAX_ENTRY_BYTES}")
    name = f"{time.time_ns()}-{os.getpid()}.json"
    tmp = d / f".{name}.tmp"
    try:
        fd = os.open(str(tmp), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, d / name)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise StoreError(f"cannot write spool entry in {str(d)!r}: {exc}") from None
    return d / name


def pending(spool_dir: Path, target: Optional[str] = None) -> List[Dict[str, Any]]:
    """The entries waiting in ``spool_dir`` (of ``target`` if given), oldest first; unreadable ones skipped."""
    out = []
    for path in _candidates(Path(spool_dir), claimed_too=True):
        entry = _read(path)
        if entry is not None and (target is None or entry.get("target") == target):
            out.append(entry)
    return out


def _candidates(d: Path, claimed_too: bool = False) -> List[Path]:
    try:
        names = sorted(os.listdir(d))
    except OSError:
        return []
    now = time.time()
    out = []
    for n in names:
        p = d / n
        if n.endswith(".json") and not n.startswith("."):
            out.append(p)
        elif is_claim(n, ".json"):
            try:
                if claimed_too or claim_is_stale(str(p), os.lstat(p).st_mtime, now):
                    out.append(p)
            except OSError:
                pass
    return out


def _read(path: Path) -> Optional[Dict[str, Any]]:
    """Parse an entry: a regular file owned by us, read without following symlinks; None if unusable."""
    try:
        fd = os.open(str(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size > MAX_ENTRY_BYTES:
            return None
        data = json.loads(os.read(fd, MAX_ENTRY_BYTES + 1).decode())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    finally:
        os.close(fd)
    if not isinstance(data, dict) or not isinstance(data.get("ops"), list):
        return None
    return data


def _already(db: Database, op: str, row: Dict[str, Any], once: Any) -> bool:
    """Whether an append op with a ``once`` window finds its row already there (module docstring)."""
    if not (isinstance(once, list) and len(once) == 2 and all(isinstance(t, (int, float)) for t in once)):
        raise ValueError(f"malformed once window {once!r:.100}")
    if op == "hook_run" and db["hook_runs"].exists():
        sql = "SELECT 1 FROM hook_runs WHERE job_id = ? AND node = ? AND hook = ? AND ts BETWEEN ? AND ?"
        return db.execute(sql, [row["job_id"], row["node"], row["hook"], *once]).fetchone() is not None
    if op == "event" and db["events"].exists():
        sql = ("SELECT 1 FROM events WHERE job_id = ? AND kind = ? AND ts BETWEEN ? AND ? "
               "AND json_extract(detail_json, '$.hook') = json_extract(?, '$.hook')")
        return db.execute(sql, [row["job_id"], row["kind"], *once, row["detail_json"]]).fetchone() is not None
    return False


def _apply_op(db: Database, op: str, row: Dict[str, Any], once: Any = None) -> None:
    if once is not None and _already(db, op, row, once):
        return
    if op == "hook_run":
        db["hook_runs"].insert(row)
    elif op == "node_event":
        db["node_events"].insert(row)
    elif op == "event":
        db["events"].insert(row)
    elif op == "job_start":
        db["job_runs"].insert(row, pk=("job_id", "node"), ignore=True)
    elif op == "job_end":
        _fill_end(db, "job_runs", ("job_id", "node"), row, _JOB_RUN_END)
    elif op == "submission":
        key = [row["job_id"]]
        if db["jobs"].exists() and db.execute("SELECT 1 FROM jobs WHERE job_id = ?", key).fetchone():
            for col, value in row.items():
                if col != "job_id" and value is not None:
                    db.execute(f"UPDATE jobs SET [{col}] = ? WHERE job_id = ? AND [{col}] IS NULL", [value, *key])
        else:
            db["jobs"].insert(row, pk="job_id")
    elif op == "ctld_end":
        _fill_end(db, "jobs", ("job_id",), row, _JOB_END)
    else:
        raise ValueError(f"unknown spool op {op!r}")


def _fill_end(db: Database, table: str, pk: Sequence[str], row: Dict[str, Any], cols: Sequence[str]) -> None:
    where = " AND ".join(f"{k} = ?" for k in pk)
    key = [row[k] for k in pk]
    if db[table].exists() and db.execute(f"SELECT 1 FROM {table} WHERE {where}", key).fetchone():
        sets = [(c, row[c]) for c in cols if c in row]
        if sets:
            db.execute(f"UPDATE {table} SET {', '.join(f'{c} = ?' for c, _ in sets)} WHERE {where} AND end_ts IS NULL",
                       [v for _, v in sets] + key)
    else:
        db[table].insert(row, pk=tuple(pk) if len(pk) > 1 else pk[0])


def apply_ops(db: Database, ops: Sequence[Dict[str, Any]]) -> None:
    """Apply ops (see the module docstring) in ONE transaction. sqlite3 errors propagate; bad ops raise
    ValueError/KeyError."""
    with db.atomic():
        for item in ops:
            if not isinstance(item, dict) or item.get("op") not in OPS or not isinstance(item.get("row"), dict):
                raise ValueError(f"malformed spool op {item!r:.200}")
            _apply_op(db, item["op"], item["row"], item.get("once"))


def replay(spool_dir: Path, target: str, db: Database, max_entries: int = 500, budget_s: float = 2.0) -> int:
    """Apply pending entries of ``target`` to ``db`` (oldest first), each in one transaction, then delete them.

    Stops after ``max_entries`` or ``budget_s`` (the rest waits for the next hook). An entry that cannot be parsed or
    applied for a reason other than the database (malformed op) is renamed ``.bad`` and logged, never retried.

    Returns:
        The number of entries applied. A database error stops the replay and propagates (the entry stays pending).
    """
    d = Path(spool_dir)
    if not os.path.isdir(d) or os.path.islink(d):
        return 0
    t_end = time.monotonic() + budget_s
    done = 0
    for path in _candidates(d):
        if done >= max_entries or time.monotonic() > t_end:
            break
        entry = _read(path)
        if entry is None or entry.get("target") != target:
            continue
        base = path.with_name(split_claim(path.name)[0]) if path.name.endswith(".replaying") else path
        claimed = base.with_name(claim_name(base.name))
        try:
            os.rename(path, claimed)  # atomic claim (a stale claim is re-claimed, refreshing its mtime)
            os.utime(claimed)
        except OSError:
            continue  # another replayer took it
        try:
            apply_ops(db, entry["ops"])
        except (ValueError, KeyError, TypeError) as exc:
            log.error("spool entry %s is malformed (%s): set aside as .bad", base, exc)
            os.rename(claimed, base.with_name(base.name + ".bad"))
            continue
        except BaseException:  # a database error, or the hook's timeout: still pending
            os.rename(claimed, base)
            raise
        os.unlink(claimed)
        done += 1
    return done
