"""Opening slurm-coloc databases: WAL, busy timeout, migrations, and who may read them. A database and its
``-wal``/``-shm`` files are readable by root and the admin group only (0640 with that group, 0600 without;
directories we create 0750 / 0700): they hold every user's job names, script SHA-256s, model specs and stderr
lines. Users read their own rows through coloc-report's reader (``report/reader.py``). A root opener tightens
files left looser by an older version (docs/admin.md)."""
from __future__ import annotations

import contextlib
import grp
import logging
import os
import random
import sqlite3
import stat
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, Optional, Union

from sqlite_utils import Database
from sqlite_utils.migrations import Migrations

from slurm_coloc.atomic import make_dirs
from slurm_coloc.errors import StoreError
from slurm_coloc.store.schema import CTLD, NODE

log = logging.getLogger(__name__)

FILE_MODE_GROUP, DIR_MODE_GROUP = 0o640, 0o750  # root rw, admin group r
FILE_MODE_ROOT, DIR_MODE_ROOT = 0o600, 0o700  # no admin group: root only
SIDE_SUFFIXES = ("-wal", "-shm", "-journal")


def admin_gid(admin_group: Optional[str]) -> Optional[int]:
    """The gid of ``admin_group`` (name or number); None: "" or an unknown group (logged): root only. None in:
    the loaded config's ``admin_group`` (a config that does not load: root only), so that every opener (hooks,
    sampler, report) agrees on a file's group. Never raises."""
    if admin_group is None:
        from slurm_coloc import config as config_mod

        try:
            admin_group = config_mod.load().admin_group
        except Exception as exc:  # a bad config is reported by its loader's callers
            log.warning("cannot read admin_group from the config (%s): databases readable by root only", exc)
            admin_group = ""
    if not admin_group:
        return None
    try:
        return grp.getgrnam(admin_group).gr_gid
    except KeyError:
        if admin_group.isdigit():
            return int(admin_group)
        log.warning("admin_group %r is not a group on this host: databases stay readable by root only",
                    admin_group)
        return None


def restrict(path: Path, gid: Optional[int], directory: bool = False) -> None:
    """Make ``path`` owner read-write and readable by group ``gid`` only (None: owner only); missing: ignored.
    As root the group is set to ``gid`` (0 without one); as another user only the mode. Symlinks are not
    followed. ``directory``: modes 0750 / 0700 instead of 0640 / 0600. Raises OSError (the owner or mode
    cannot be set)."""
    group, owner = (DIR_MODE_GROUP, DIR_MODE_ROOT) if directory else (FILE_MODE_GROUP, FILE_MODE_ROOT)
    mode = group if gid is not None else owner
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if os.geteuid() == 0 and st.st_gid != (0 if gid is None else gid):
        os.lchown(path, -1, 0 if gid is None else gid)
    if st.st_mode & 0o7777 != mode:
        os.chmod(path, mode)


def restrict_database(path: Path, gid: Optional[int]) -> None:
    """``restrict`` the database file, its side files (missing: skipped) and, when ours, its directory. Ours:
    root-owned with mode 0700 or 0750 (``_ensure_dir`` made it); it then follows ``admin_group``. Any other
    directory is left as it is: it may be shared (``state_dir: /var/lib``), and the files' own modes keep
    other users out. Raises OSError (an owner or mode cannot be set)."""
    with contextlib.suppress(FileNotFoundError):
        st = os.stat(path.parent)
        if st.st_uid == 0 and stat.S_IMODE(st.st_mode) in (DIR_MODE_ROOT, DIR_MODE_GROUP):
            restrict(path.parent, gid, directory=True)
    for p in (path, *(Path(f"{path}{suffix}") for suffix in SIDE_SUFFIXES)):
        restrict(p, gid)


def _ensure_dir(path: Path, gid: Optional[int]) -> None:
    """Create ``path``'s directory (and parents) root-owned, readable by root and group ``gid`` only."""
    parent = path.parent
    if not parent.exists():
        make_dirs(parent, DIR_MODE_ROOT)
        restrict(parent, gid, directory=True)


class ColocDatabase(Database):
    """A sqlite-utils Database whose ``atomic()`` transactions start with ``BEGIN IMMEDIATE``. sqlite-utils'
    deferred ``BEGIN``: a transaction that reads, then writes fails at once with "database is locked" when
    another process committed in between (WAL snapshot upgrade: SQLite skips the busy handler). Taking the
    write lock at BEGIN makes writers wait their turn, up to the busy timeout. Nested blocks use savepoints.
    """

    @contextlib.contextmanager
    def atomic(self) -> Iterator["ColocDatabase"]:
        if self.conn.in_transaction:
            with super().atomic():
                yield self
            return
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self
        except BaseException:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            raise
        try:
            self.conn.execute("COMMIT")
        except BaseException:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            raise


def _unknown_applied(db: Database, migrations: Migrations) -> list:
    known = {m.name for m in migrations._migrations}
    return [m.name for m in migrations.applied(db) if m.name not in known]


def migrate(db: Database, migrations: Migrations, label: str = "") -> None:
    """Apply pending migrations under one ``BEGIN IMMEDIATE`` (concurrent first openers never race). ``db``
    outside any transaction; ``label``: its name in errors. Raises StoreError (the database holds migrations
    of this set unknown to this code (a downgrade)), sqlite3.Error (locked past the busy timeout, disk full,
    not a database)."""
    unknown = _unknown_applied(db, migrations)
    if not unknown and not migrations.pending(db):
        return
    db.conn.execute("BEGIN IMMEDIATE")
    try:
        unknown = _unknown_applied(db, migrations)
        if unknown:
            raise StoreError(
                f"database {label!r} was written by a newer slurm-coloc (schema {migrations.name} has "
                f"{', '.join(unknown)}, unknown to this version): refusing to use it",
                hint="upgrade slurm-coloc on this host, or restore the database from before the upgrade")
        migrations.apply(db)
        db.conn.execute("COMMIT")
    except BaseException:
        if db.conn.in_transaction:
            db.conn.execute("ROLLBACK")
        raise


def _wal_and_migrate(db: Database, migrations: Migrations, label: str) -> None:
    if db.journal_mode != "wal":
        db.enable_wal()
    db.execute("PRAGMA synchronous = NORMAL")
    migrate(db, migrations, label)


def _retry_locked(fn: Callable[[], None], busy_timeout_s: float) -> None:
    """Run ``fn``, again while it fails with 'database is locked' and ``busy_timeout_s`` has not passed.
    SQLite returns SQLITE_BUSY at once, without its busy handler, where waiting could deadlock
    (sqlite.org/c3ref/busy_handler.html): e.g. two connections switching a fresh file to WAL, each holding a
    read lock. Defensive: seen once, not reproduced."""
    deadline = time.monotonic() + busy_timeout_s
    while True:
        try:
            fn()
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01 + 0.04 * random.random())


def _create_private(p: Path) -> None:
    """Create ``p`` empty and 0600 when missing, without ever opening (and closing) the file itself: closing
    any descriptor of a file drops every POSIX lock this process holds on it (fcntl(2)), SQLite's included,
    and another process may then take the database for unused and delete its ``-wal``/``-shm``. A temporary
    file is made and hard-linked into place (no overwrite; a concurrent creator wins). Raises OSError."""
    if os.path.islink(p):  # as open(2) with O_NOFOLLOW: a database is never reached through a link
        raise OSError(f"{p} is a symbolic link")
    if os.path.lexists(p):
        return
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{threading.get_ident()}.new")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
    try:
        with contextlib.suppress(FileExistsError):
            os.link(tmp, p)
    finally:
        os.unlink(tmp)


def open_db(path: Union[str, Path], migrations: Migrations, busy_timeout_s: float = 5.0,
            admin_group: Optional[str] = None) -> Database:
    """Open (creating if needed) a database for writing, in WAL mode, with migrations applied. The file, its
    side files and its directory are made readable by root and ``admin_group`` only ("": root only; None: the
    loaded config's), also when an older version left them 0644. The file is created 0600 (SQLite gives
    ``-wal``/``-shm`` its mode; ``_create_private``), so no one else opens it first; the umask is never
    touched (process-wide). ``busy_timeout_s``: wait for another writer's lock. Raises StoreError (the file
    cannot be opened, is not a database, or migrating fails)."""
    p = Path(path)
    gid = admin_gid(admin_group)
    try:
        _ensure_dir(p, gid)
        _create_private(p)
        restrict_database(p, gid)  # an existing file first: tightened before we add -wal/-shm beside it
        conn = sqlite3.connect(str(p), timeout=busy_timeout_s, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        db = ColocDatabase(conn)
        _retry_locked(lambda: _wal_and_migrate(db, migrations, str(p)), busy_timeout_s)
        restrict_database(p, gid)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open database {str(p)!r}: {exc}",
                         hint="check the file is a slurm-coloc database and the disk is not full") from None
    except OSError as exc:
        raise StoreError(f"cannot create database {str(p)!r}: {exc}") from None
    return db


def open_ctld_db(path: Union[str, Path], busy_timeout_s: float = 5.0,
                 admin_group: Optional[str] = None) -> Database:
    """The controller-side database (jobs, events), as ``open_db`` (also its StoreError)."""
    return open_db(path, CTLD, busy_timeout_s, admin_group)


def open_node_db(path: Union[str, Path], busy_timeout_s: float = 5.0,
                 admin_group: Optional[str] = None) -> Database:
    """A node database (job_runs, hook_runs, samples), as ``open_db`` (also its StoreError)."""
    return open_db(path, NODE, busy_timeout_s, admin_group)


def open_readonly(path: Union[str, Path], busy_timeout_s: float = 2.0) -> Database:
    """Open an existing database read-only (coloc-report); never creates or migrates. ``busy_timeout_s`` in s.
    Raises StoreError (missing, unreadable or not a SQLite database)."""
    p = Path(path)
    if not p.is_file():
        raise StoreError(f"database {str(p)!r} does not exist")
    try:
        conn = sqlite3.connect(f"file:{p}?mode=ro", uri=True, timeout=busy_timeout_s)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as exc:
        raise StoreError(f"cannot read database {str(p)!r}: {exc}") from None
    return Database(conn)
