"""The watchdog's rows in a node database: events (``watchdog_events``) and the running jobs it guards.

Written by the node sampler's watchdog (node/watchdog.py); read by coloc-report, the AdminComment writer and
the OOM rerun (``stopped_by_watchdog``: a job the watchdog stopped gets no rerun).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from sqlite_utils import Database

TABLE = "watchdog_events"


@dataclass(frozen=True)
class WatchdogEvent:
    """A job found over its grant or outside MPS on a shared GPU.

    Attributes:
        ts: detection wall time (Unix s).
        reason: ``over-grant`` (its processes on the GPU used more than grant + tolerance) or ``outside-mps``
            (a CUDA process of an MPS job that NVML does not list as an MPS client).
        share: the job's share mode on this node (``mps`` or ``timeslice``).
        grant_mib: its grant on that GPU (MiB; 0 on a GPU it holds no shard of); used_mib: NVML's figure for
            its processes there (MiB); tolerance_mib: the configured tolerance.
        action: ``stop`` or ``record`` (``watchdog_action``); message: the line written to the job's stderr.
        outcome: what the stop did (``killed``, ``scancel``, ``stderr``...), filled in after the event.
    """

    ts: float
    job_id: int
    node: str
    gpu_index: int
    reason: str
    share: str
    grant_mib: float
    used_mib: float
    tolerance_mib: float
    pids: Tuple[int, ...]
    action: str
    message: str
    outcome: Dict[str, Any] = field(default_factory=dict)
    id: Optional[int] = None


def record_event(db: Database, ev: WatchdogEvent) -> int:
    """Insert ``ev`` (its ``id`` not read); its row id.

    Raises:
        sqlite3.Error: locked past the busy timeout, disk full.
        RuntimeError: the insert gave no row id.
    """
    with db.atomic():
        row_id = db.table(TABLE).insert({
            "ts": ev.ts, "job_id": ev.job_id, "node": ev.node, "gpu_index": ev.gpu_index, "reason": ev.reason,
            "share": ev.share, "grant_mib": ev.grant_mib, "used_mib": ev.used_mib,
            "tolerance_mib": ev.tolerance_mib,
            "pids_json": json.dumps(list(ev.pids)), "action": ev.action, "message": ev.message,
            "outcome_json": json.dumps(ev.outcome, sort_keys=True, default=str)}).last_pk
    if row_id is None:  # sqlite-utils sets last_pk after every insert into a rowid table
        raise RuntimeError(f"insert into {TABLE} gave no row id")
    return int(row_id)


def set_outcome(db: Database, event_id: int, outcome: Dict[str, Any]) -> None:
    """Replace the outcome of event ``event_id`` (stored as sorted-key JSON).

    Raises:
        sqlite3.Error: locked past the busy timeout, disk full.
    """
    with db.atomic():
        db.table(TABLE).update(event_id, {"outcome_json": json.dumps(outcome, sort_keys=True, default=str)})


def load_events(db: Database, job_id: Optional[int] = None) -> List[WatchdogEvent]:
    """Watchdog events (of ``job_id``; None: all), oldest first; [] on a database older than the table."""
    if not db.table(TABLE).exists():
        return []
    where, args = ("job_id = ?", [job_id]) if job_id is not None else (None, [])
    out = []
    for r in db.table(TABLE).rows_where(where, args, order_by="id"):
        out.append(WatchdogEvent(
            ts=r["ts"], job_id=r["job_id"], node=r["node"], gpu_index=r["gpu_index"], reason=r["reason"],
            share=r["share"], grant_mib=r["grant_mib"], used_mib=r["used_mib"],
            tolerance_mib=r["tolerance_mib"],
            pids=tuple(json.loads(r["pids_json"] or "[]")), action=r["action"], message=r["message"] or "",
            outcome=json.loads(r["outcome_json"] or "{}"), id=r["id"]))
    return out


def stopped_by_watchdog(db: Database, job_id: int) -> bool:
    """True when the watchdog stopped (not merely recorded) ``job_id`` on this node: no OOM rerun for it."""
    return any(ev.action == "stop" for ev in load_events(db, job_id))


@dataclass(frozen=True)
class RunningRun:
    """A job the node Prolog recorded and no Epilog ended yet: GPUs (NVML indices), shards, uid."""

    job_id: int
    gpus: Tuple[int, ...]
    shards: Optional[int]
    uid: Optional[int]


def running_runs(db: Database, node: str) -> List[RunningRun]:
    """Jobs of ``node`` with a start and no end in ``job_runs`` (the Prolog writes the start first)."""
    if not db.table("job_runs").exists():
        return []
    out = []
    for r in db.execute("SELECT job_id, gpus, shards, uid FROM job_runs WHERE node = ? AND end_ts IS NULL",
                        [node]).fetchall():
        gpus = tuple(int(x) for x in str(r[1] or "").split(",") if x.strip().isdigit())
        out.append(RunningRun(int(r[0]), gpus, r[2], r[3]))
    return out


def job_uid(db: Database, job_id: int) -> Optional[int]:
    """The uid the node Prolog recorded for ``job_id`` (Slurm's environment; newest row with one), or None."""
    if not db.table("job_runs").exists():
        return None
    row = db.execute("SELECT uid FROM job_runs WHERE job_id = ? AND uid IS NOT NULL ORDER BY rowid DESC "
                     "LIMIT 1",
                     [int(job_id)]).fetchone()
    return int(row[0]) if row else None


def running_jobs_of_uid(db: Database, uid: int) -> List[int]:
    """Sorted ids of ``uid``'s jobs the node Prolog recorded that have not ended on this node."""
    if not db.table("job_runs").exists():
        return []
    return sorted({int(r[0])
                   for r in db.execute("SELECT job_id FROM job_runs WHERE uid = ? AND end_ts IS NULL",
                                                   [int(uid)]).fetchall()})
