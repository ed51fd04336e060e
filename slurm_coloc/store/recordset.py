"""Record sets: the rows a hook run leaves, as idempotent ops, applied in one transaction. A record set is
``{"target": "ctld" | "node:<name>", "ts": <unix s>, "ops": [{"op", "row"[, "once"]}, ...]}``; queued, one
``.json`` entry of the recovery queue (store/queue.py). Ops, never overwriting what a successful hook wrote:
``hook_run``, ``node_event`` (node DB) and ``event`` (ctld DB) append a row; ``job_start`` inserts the
``job_runs`` row if absent; ``job_end``/``ctld_end`` set a ``job_runs``/``jobs`` row's end columns where
``end_ts`` is NULL, else insert it; ``submission`` inserts the ``jobs`` row if absent, else fills its NULLs.
``"once": [t0, t1]`` skips a ``hook_run`` when one of the same job, node and hook has ``ts`` in it, an
``event`` when one of the same job, kind and ``hook`` has: applying a record set twice leaves what once does.
"""
from __future__ import annotations

import json
import os
import sqlite3
import time
from typing import Any, Dict, List, Sequence, Tuple

from sqlite_utils import Database

SUFFIX = ".json"
OPS = ("hook_run", "node_event", "event", "job_start", "job_end", "submission", "ctld_end")
_JOB_RUN_END = ("end_ts", "state", "exit_code", "signal")
_JOB_END = ("end_ts", "state", "exit_code", "signal", "node_list", "start_ts", "updated_ts")
# SQLite primary result codes meaning the database itself cannot be written now (busy, locked, out of memory,
# read-only, interrupted, I/O error, corrupt, full, cannot open, lock protocol, not a database):
# sqlite.org/rescode.html
_STORE_CODES = frozenset({5, 6, 7, 8, 9, 10, 11, 13, 14, 15, 26})


def entry_name() -> str:
    """A new record set's queue entry name: ``<time_ns>-<pid>.json`` (sorts by time)."""
    return f"{time.time_ns()}-{os.getpid()}{SUFFIX}"


def encode(target: str, ops: Sequence[Dict[str, Any]]) -> bytes:
    """The queue entry bytes of a record set (sorted-key JSON, else ``str``), stamped now."""
    return json.dumps({"target": target, "ts": time.time(), "ops": list(ops)}, sort_keys=True,
                      default=str).encode()


def decode(data: bytes) -> Tuple[str, List[Dict[str, Any]]]:
    """``(target, ops)`` of a queued record set. Raises ValueError (malformed JSON, not UTF-8, no ``target``
    string or ``ops`` list)."""
    entry = json.loads(data.decode())
    if not isinstance(entry, dict) or not isinstance(entry.get("target"), str):
        raise ValueError("not a record set (no target)")
    if not isinstance(entry.get("ops"), list):
        raise ValueError("not a record set (no ops list)")
    return entry["target"], entry["ops"]


def store_unusable(exc: BaseException) -> bool:
    """Whether ``exc`` from ``apply_ops`` is the database's own failure (retry later), not the record set's
    (never succeeds): MemoryError and SQLite's primary codes in ``_STORE_CODES`` (sqlite.org/rescode.html)."""
    if isinstance(exc, MemoryError):
        return True
    if not isinstance(exc, sqlite3.Error):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _STORE_CODES
    return type(exc) in (sqlite3.OperationalError, sqlite3.DatabaseError)


def _already(db: Database, op: str, row: Dict[str, Any], once: object) -> bool:
    """Whether an append op with a ``once`` window finds its row already there (module docstring). Raises
    ValueError (a malformed window)."""
    if not (isinstance(once, list) and len(once) == 2 and all(isinstance(t, (int, float)) for t in once)):
        raise ValueError(f"malformed once window {once!r:.100}")
    if op == "hook_run" and db.table("hook_runs").exists():
        sql = "SELECT 1 FROM hook_runs WHERE job_id = ? AND node = ? AND hook = ? AND ts BETWEEN ? AND ?"
        return db.execute(sql, [row["job_id"], row["node"], row["hook"], *once]).fetchone() is not None
    if op == "event" and db.table("events").exists():
        sql = ("SELECT 1 FROM events WHERE job_id = ? AND kind = ? AND ts BETWEEN ? AND ? "
               "AND json_extract(detail_json, '$.hook') = json_extract(?, '$.hook')")
        return db.execute(sql, [row["job_id"], row["kind"], *once, row["detail_json"]]).fetchone() is not None
    return False


def _apply_op(db: Database, op: str, row: Dict[str, Any], once: object = None) -> None:
    if once is not None and _already(db, op, row, once):
        return
    if op == "hook_run":
        db.table("hook_runs").insert(row)
    elif op == "node_event":
        db.table("node_events").insert(row)
    elif op == "event":
        db.table("events").insert(row)
    elif op == "job_start":
        db.table("job_runs").insert(row, pk=("job_id", "node"), ignore=True)
    elif op == "job_end":
        _fill_end(db, "job_runs", ("job_id", "node"), row, _JOB_RUN_END)
    elif op == "submission":
        key = [row["job_id"]]
        if db.table("jobs").exists() and db.execute("SELECT 1 FROM jobs WHERE job_id = ?", key).fetchone():
            for col, value in row.items():
                if col != "job_id" and value is not None:
                    db.execute(f"UPDATE jobs SET [{col}] = ? WHERE job_id = ? AND [{col}] IS NULL",
                               [value, *key])
        else:
            db.table("jobs").insert(row, pk="job_id")
    elif op == "ctld_end":
        _fill_end(db, "jobs", ("job_id",), row, _JOB_END)
    else:
        raise ValueError(f"unknown record op {op!r}")


def _fill_end(db: Database, table: str, pk: Sequence[str], row: Dict[str, Any], cols: Sequence[str]) -> None:
    where = " AND ".join(f"{k} = ?" for k in pk)
    key = [row[k] for k in pk]
    if db.table(table).exists() and db.execute(f"SELECT 1 FROM {table} WHERE {where}", key).fetchone():
        sets = [(c, row[c]) for c in cols if c in row]
        if sets:
            db.execute(f"UPDATE {table} SET {', '.join(f'{c} = ?' for c, _ in sets)} WHERE {where} AND "
                       "end_ts IS NULL",
                       [v for _, v in sets] + key)
    else:
        db.table(table).insert(row, pk=tuple(pk) if len(pk) > 1 else pk[0])


def apply_ops(db: Database, ops: Sequence[Dict[str, Any]]) -> None:
    """Apply ``ops`` (module docstring; ``once`` in Unix s) to ``db`` in ONE transaction: all of them or none.
    Raises sqlite3.Error (from SQLite (``store_unusable`` tells the database's own failures from the ops')),
    ValueError, KeyError, TypeError, OverflowError (a malformed op, or a value SQLite cannot hold)."""
    with db.atomic():
        for item in ops:
            if not isinstance(item, dict) or item.get("op") not in OPS or not isinstance(item.get("row"),
                                                                                         dict):
                raise ValueError(f"malformed record op {item!r:.200}")
            _apply_op(db, item["op"], item["row"], item.get("once"))
