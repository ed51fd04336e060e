"""Writing and reading job rows: one transaction per write (no half-written row); dataclasses in and out,
table names stay in this package. Times are Unix s; a missing table reads as empty."""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, fields
from typing import Any, Dict, Iterator, List, Optional, Tuple, Type, TypeVar, Union

from sqlite_utils import Database


@dataclass(frozen=True)
class JobSubmission:
    """What a job asked for and what slurm-coloc estimated, recorded by PrologSlurmctld. ``share_mode``:
    ``shard`` (shared GPU), ``whole-gpu`` (all shards of one GPU), ``gpu`` (whole GPUs by ``--gres=gpu:N``),
    ``none`` (no GPU). ``estimate_mib`` is None when there was no estimate."""

    job_id: int
    user_name: str = ""
    uid: Optional[int] = None
    job_name: str = ""
    partition: str = ""
    cluster: str = ""
    submit_ts: Optional[float] = None
    gres_req: str = ""
    shards_req: Optional[int] = None
    gpus_req: Optional[int] = None
    share_mode: str = "none"
    estimate_mib: Optional[int] = None
    estimate_method: Optional[str] = None
    script_sha256: Optional[str] = None
    spec_json: Optional[str] = None
    coloc_json: Optional[str] = None


@dataclass(frozen=True)
class JobStart:
    """A job starting on one node, as the node Prolog saw it. ``gpus``: global indices ``"0,1"``."""

    job_id: int
    node: str
    user_name: str
    uid: Optional[int]
    gpus: str
    shards: Optional[int]
    gres: str
    start_ts: float


@dataclass(frozen=True)
class JobEnd:
    """A job ending (node Epilog or EpilogSlurmctld); ``state`` as Slurm names it (COMPLETED, FAILED, ...)."""

    job_id: int
    end_ts: float
    state: Optional[str]
    exit_code: Optional[int]
    signal: Optional[int]
    node: str = ""
    state_source: Optional[str] = None  # controller side: ``slurm`` (Slurm's final state) or ``inferred``


@dataclass(frozen=True)
class HookRun:
    """One hook invocation: which, how long (ms), whether our code finished without an internal error."""

    job_id: Optional[int]
    node: str
    hook: str
    ts: float
    duration_ms: float
    ok: bool
    detail: Dict[str, Any]


@dataclass(frozen=True)
class JobRow:
    """A job as the controller database holds it (all ``jobs`` columns)."""

    job_id: int
    cluster: Optional[str] = None
    user_name: Optional[str] = None
    uid: Optional[int] = None
    job_name: Optional[str] = None
    partition: Optional[str] = None
    submit_ts: Optional[float] = None
    gres_req: Optional[str] = None
    shards_req: Optional[int] = None
    gpus_req: Optional[int] = None
    share_mode: Optional[str] = None
    estimate_mib: Optional[int] = None
    estimate_method: Optional[str] = None
    script_sha256: Optional[str] = None
    spec_json: Optional[str] = None
    coloc_json: Optional[str] = None
    node_list: Optional[str] = None
    start_ts: Optional[float] = None
    end_ts: Optional[float] = None
    state: Optional[str] = None
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    restart_count: Optional[int] = None
    updated_ts: Optional[float] = None
    state_source: Optional[str] = None


@dataclass(frozen=True)
class JobRunRow:
    """A (job, node) row of a node database."""

    job_id: int
    node: str
    user_name: Optional[str] = None
    uid: Optional[int] = None
    gpus: Optional[str] = None
    shards: Optional[int] = None
    gres: Optional[str] = None
    start_ts: Optional[float] = None
    end_ts: Optional[float] = None
    state: Optional[str] = None
    exit_code: Optional[int] = None
    signal: Optional[int] = None


def _upsert(db: Database, table: str, row: Dict[str, Any], pk: Union[str, Tuple[str, str]]) -> None:
    with db.atomic():  # one transaction
        db.table(table).upsert(row, pk=pk)


def record_submission(db: Database, sub: JobSubmission) -> None:
    """Insert or update the job's submission columns, stamped now (idempotent: a requeue overwrites). Raises
    sqlite3.Error (locked past the busy timeout, disk full)."""
    row = {k: v for k, v in asdict(sub).items()}
    row["updated_ts"] = time.time()
    _upsert(db, "jobs", row, "job_id")


def record_ctld_end(db: Database, end: JobEnd, node_list: str = "", start_ts: Optional[float] = None) -> None:
    """Record how a job ended, controller side (EpilogSlurmctld). ``node_list`` "" and ``start_ts`` None or 0
    leave the stored values. Raises sqlite3.Error (locked past the busy timeout, disk full)."""
    row: Dict[str, Any] = {"job_id": end.job_id, "end_ts": end.end_ts, "state": end.state,
                           "exit_code": end.exit_code, "signal": end.signal, "updated_ts": time.time()}
    if node_list:
        row["node_list"] = node_list
    if start_ts:
        row["start_ts"] = start_ts
    if end.state_source:
        row["state_source"] = end.state_source
    _upsert(db, "jobs", row, "job_id")


def inferred_job_ids(db: Database) -> List[int]:
    """Jobs whose final state is still EpilogSlurmctld's inference (``state_source = 'inferred'``)."""
    if not db.table("jobs").exists() or "state_source" not in db.table("jobs").columns_dict:
        return []
    return [int(r[0])
            for r in db.execute("SELECT job_id FROM jobs WHERE state_source = 'inferred'").fetchall()]


def settle_state(db: Database, job_id: int, state: Optional[str]) -> None:
    """Replace an inferred final state with Slurm's own, in one transaction. ``state`` Slurm's (source
    ``slurm``; a change adds a ``state-settled`` event), or None when slurmctld no longer knows the job (the
    inference stays, source ``inferred-kept``, not looked up again). Raises sqlite3.Error (locked past the
    busy timeout, disk full)."""
    with db.atomic():
        if state is None:
            db.execute("UPDATE jobs SET state_source = 'inferred-kept' WHERE job_id = ?", [int(job_id)])
            return
        old = db.execute("SELECT state FROM jobs WHERE job_id = ?", [int(job_id)]).fetchone()
        db.execute("UPDATE jobs SET state = ?, state_source = 'slurm', updated_ts = ? WHERE job_id = ?",
                   [state, time.time(), int(job_id)])
        if old and old[0] != state:
            db.table("events").insert({"ts": time.time(), "job_id": int(job_id), "kind": "state-settled",
                                 "detail_json": json.dumps({"inferred": old[0], "slurm": state})})


def record_event(db: Database, job_id: Optional[int], kind: str, detail: Dict[str, Any]) -> None:
    """Append an event (``hook-error``, ``oom``, ...); ``detail`` as sorted-key JSON (else ``str``). Raises
    sqlite3.Error (locked past the busy timeout, disk full)."""
    with db.atomic():
        db.table("events").insert({"ts": time.time(), "job_id": job_id, "kind": kind,
                             "detail_json": json.dumps(detail, sort_keys=True, default=str)})


def record_node_start(db: Database, start: JobStart) -> None:
    """The node Prolog's row for (job, node), inserted or replaced. Raises sqlite3.Error (locked past the busy
    timeout, disk full)."""
    _upsert(db, "job_runs", asdict(start), ("job_id", "node"))


def record_node_end(db: Database, end: JobEnd) -> None:
    """The node Epilog's end columns for (job, node). Raises sqlite3.Error (locked past the busy timeout, disk
    full)."""
    _upsert(db, "job_runs", {"job_id": end.job_id, "node": end.node, "end_ts": end.end_ts, "state": end.state,
                             "exit_code": end.exit_code, "signal": end.signal}, ("job_id", "node"))


def record_hook_run(db: Database, run: HookRun) -> None:
    """Append one hook invocation row (detail as sorted-key JSON). Raises sqlite3.Error (locked past the busy
    timeout, disk full)."""
    with db.atomic():
        db.table("hook_runs").insert({"job_id": run.job_id, "node": run.node, "hook": run.hook, "ts": run.ts,
                                "duration_ms": run.duration_ms, "ok": int(run.ok),
                                "detail_json": json.dumps(run.detail, sort_keys=True, default=str)})


_Row = TypeVar("_Row", JobRow, JobRunRow)


def _rows(db: Database, table: str, cls: Type[_Row], where: Optional[str] = None,
          args: Optional[List[object]] = None) -> Iterator[_Row]:
    if not db.table(table).exists():
        return iter(())
    names = {f.name for f in fields(cls)}
    return (cls(**{k: v for k, v in r.items() if k in names})
            for r in db.table(table).rows_where(where, args or []))


def load_jobs(db: Database) -> List[JobRow]:
    """Every job row of a controller database, by job id."""
    return sorted(_rows(db, "jobs", JobRow), key=lambda r: r.job_id)


def load_job_runs(db: Database) -> List[JobRunRow]:
    """Every (job, node) row of a node database."""
    return list(_rows(db, "job_runs", JobRunRow))


def load_events(db: Database, job_id: Optional[int] = None) -> List[Dict[str, Any]]:
    """Event rows (of ``job_id``; None: all), oldest first; ``detail_json`` as stored text."""
    if not db.table("events").exists():
        return []
    where, args = ("job_id = ?", [job_id]) if job_id is not None else (None, [])
    return list(db.table("events").rows_where(where, args, order_by="id"))


def load_open_job_runs(db: Database, node: str, since_ts: float = 0.0) -> List[JobRunRow]:
    """Running jobs: (job, ``node``) rows opened at or after ``since_ts`` (0: any) that no Epilog closed."""
    return list(_rows(db, "job_runs", JobRunRow, "node = ? AND end_ts IS NULL AND start_ts >= ?",
                      [node, since_ts]))
