"""Opening slurm-coloc databases: WAL, busy timeout, migrations, root-only directories."""
from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Union

from sqlite_utils import Database
from sqlite_utils.migrations import Migrations

from slurm_coloc.errors import StoreError
from slurm_coloc.store.schema import CTLD, NODE


def _ensure_dir(path: Path) -> None:
    """Create ``path``'s parents root-owned 0755 (readable by coloc-report, writable by root only)."""
    parent = path.parent
    if not parent.exists():
        old = os.umask(0o022)
        try:
            parent.mkdir(parents=True, mode=0o755, exist_ok=True)
        finally:
            os.umask(old)


def open_db(path: Union[str, Path], migrations: Migrations, busy_timeout_s: float = 5.0) -> Database:
    """Open (creating if needed) a database for writing, in WAL mode, with migrations applied.

    Args:
        path: database file.
        migrations: ``schema.CTLD`` or ``schema.NODE``.
        busy_timeout_s: how long to wait for a lock held by another writer.

    Raises:
        StoreError: the file cannot be opened, is not a database, or migrating fails.
    """
    p = Path(path)
    try:
        _ensure_dir(p)
        conn = sqlite3.connect(str(p), timeout=busy_timeout_s, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        db = Database(conn)
        if db.journal_mode != "wal":
            db.enable_wal()
        db.execute("PRAGMA synchronous = NORMAL")
        migrations.apply(db)
        if p.exists():
            os.chmod(p, 0o644)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open database {str(p)!r}: {exc}",
                         hint="check the file is a slurm-coloc database and the disk is not full") from None
    except OSError as exc:
        raise StoreError(f"cannot create database {str(p)!r}: {exc}") from None
    return db


def open_ctld_db(path: Union[str, Path], busy_timeout_s: float = 5.0) -> Database:
    """The controller-side database (jobs, events)."""
    return open_db(path, CTLD, busy_timeout_s)


def open_node_db(path: Union[str, Path], busy_timeout_s: float = 5.0) -> Database:
    """A node database (job_runs, hook_runs, samples)."""
    return open_db(path, NODE, busy_timeout_s)


def open_readonly(path: Union[str, Path], busy_timeout_s: float = 2.0) -> Database:
    """Open an existing database read-only (coloc-report); never creates or migrates.

    Raises:
        StoreError: missing, unreadable or not a SQLite database.
    """
    p = Path(path)
    if not p.is_file():
        raise StoreError(f"database {str(p)!r} does not exist")
    try:
        conn = sqlite3.connect(f"file:{p}?mode=ro", uri=True, timeout=busy_timeout_s)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as exc:
        raise StoreError(f"cannot read database {str(p)!r}: {exc}") from None
    return Database(conn)
