"""OOM deaths and their one retry (``oom_events`` of ``ctld.db``), and the watchdog's rows in a node database
(``watchdog_events`` and the running jobs it guards). ``oom_events``: written by EpilogSlurmctld
(hooks/oom.py); read by coloc-report and coloc-sbatch (``history_peaks_mib``). One row per job that died of
GPU OOM; the primary key on the job id is the "exactly once" guard: ``claim_retry`` inserts the row before
sbatch runs, so a second EpilogSlurmctld run (or a race) finds it and does nothing. ``watchdog_events``:
written by the sampler's watchdog (node/watchdog.py); read by coloc-report, the AdminComment writer and the
OOM rerun (a job the watchdog stopped gets no rerun). Times are Unix s; a missing table reads as empty."""
from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Optional, Tuple

from sqlite_utils import Database

TABLE = "oom_events"


@dataclass(frozen=True)
class OomRecord:
    """A job that died of GPU OOM, as the hook recorded it. ``fence_mib``: the memory it was allowed (shards *
    1024 MiB), the fence it hit; None without shards; ``evidence``: what decided it (``messages``, ``state``,
    ``exit_code``, ``stderr_path``, ...), JSON-able; ``retry_of``: the original job id when this job was
    itself a retry (never retried again); ``retry_status``: ``submitting`` | ``submitted`` | ``failed`` |
    ``not-retried``; ``retry_reason``: one line (``shared GPU: rerun on a whole GPU``, ``already a retry of
    12``...)."""

    job_id: int
    ts: float
    user_name: str = ""
    uid: Optional[int] = None
    script_sha256: Optional[str] = None
    share_mode: str = ""
    shards: Optional[int] = None
    fence_mib: Optional[int] = None
    end_ts: Optional[float] = None
    evidence: Optional[Dict[str, Any]] = None
    retry_of: Optional[int] = None
    retry_status: str = "not-retried"
    retry_reason: str = ""
    retry_job_id: Optional[int] = None
    retry_submit_ts: Optional[float] = None
    retry_error: Optional[str] = None
    retry_state: Optional[str] = None
    retry_start_ts: Optional[float] = None
    retry_end_ts: Optional[float] = None


def _row(rec: OomRecord) -> Dict[str, Any]:
    row = {f.name: getattr(rec, f.name) for f in fields(rec) if f.name != "evidence"}
    row["evidence_json"] = json.dumps(rec.evidence or {}, sort_keys=True, default=str)
    return row


def _record(row: Dict[str, Any]) -> OomRecord:
    names = {f.name for f in fields(OomRecord)}
    data = {k: v for k, v in row.items() if k in names}
    try:
        data["evidence"] = json.loads(row.get("evidence_json") or "{}")
    except ValueError:
        data["evidence"] = {}
    return OomRecord(**data)


def claim_retry(db: Database, rec: OomRecord) -> bool:
    """Insert the OOM row; True if this call created it, False if the job already has one (never twice).
    ``rec.retry_status``: ``submitting`` when a retry will follow, else the final status. Raises sqlite3.Error
    (locked past the busy timeout, disk full (a duplicate job id is False, not an error))."""
    try:
        with db.atomic():
            db.table(TABLE).insert(_row(rec), pk="job_id")
    except sqlite3.IntegrityError:
        return False
    return True


def record_retry_submitted(db: Database, job_id: int, retry_job_id: int,
                           submit_ts: Optional[float] = None) -> None:
    """sbatch accepted ``job_id``'s retry as ``retry_job_id``; ``submit_ts`` None: now. Raises sqlite3.Error
    (locked past the busy timeout, disk full)."""
    with db.atomic():
        db.table(TABLE).update(job_id, {"retry_status": "submitted", "retry_job_id": int(retry_job_id),
                                  "retry_submit_ts": submit_ts or time.time()})


def record_retry_failed(db: Database, job_id: int, error: str) -> None:
    """sbatch refused (or could not run) ``job_id``'s retry; ``error`` stored up to 2000 characters. Raises
    sqlite3.Error (locked past the busy timeout, disk full)."""
    with db.atomic():
        db.table(TABLE).update(job_id, {"retry_status": "failed", "retry_error": error[:2000]})


def record_retry_outcome(db: Database, retry_job_id: int, state: Optional[str], start_ts: Optional[float],
                         end_ts: Optional[float]) -> bool:
    """How retry ``retry_job_id`` ended (its EpilogSlurmctld); False, nothing written: not a known retry.
    Raises sqlite3.Error (locked past the busy timeout, disk full)."""
    rows = list(db.table(TABLE).rows_where("retry_job_id = ?",
                                           [int(retry_job_id)])) if db.table(TABLE).exists() else []
    if not rows:
        return False
    with db.atomic():
        db.table(TABLE).update(rows[0]["job_id"], {"retry_state": state, "retry_start_ts": start_ts,
                                             "retry_end_ts": end_ts})
    return True


def original_of(db: Database, job_id: int) -> Optional[int]:
    """The job whose OOM retry ``job_id`` is, or None if ``job_id`` is not a retry we submitted."""
    if not db.table(TABLE).exists():
        return None
    row = db.execute(f"SELECT job_id FROM {TABLE} WHERE retry_job_id = ?", [int(job_id)]).fetchone()
    return int(row[0]) if row else None


def load_oom_event(db: Database, job_id: int) -> Optional[OomRecord]:
    """The OOM row of ``job_id`` (the job that died, not its rerun), or None."""
    if not db.table(TABLE).exists():
        return None
    rows = list(db.table(TABLE).rows_where("job_id = ?", [int(job_id)]))
    return _record(rows[0]) if rows else None


def load_oom_events(db: Database) -> List[OomRecord]:
    """Every OOM row, oldest first (coloc-report)."""
    if not db.table(TABLE).exists():
        return []
    return [_record(r) for r in db.table(TABLE).rows_where(order_by="ts, job_id")]


def history_peaks_mib(db: Database, script_sha256: str, uid: int) -> List[int]:
    """MiB that earlier runs of user ``uid``'s script with this SHA-256 were shown to need, oldest first. Each
    value is the fence an OOM'd attempt hit (``fence_mib`` = shards * 1024 MiB): a lower bound for the
    estimator's history (``estimate_peak(history_mib=...)``: ``max * 1.05 + 64`` MiB, so the next submission
    asks for more than the fence). Unknown fences are left out; NVML peaks of completed runs come from the
    sampler's tables. Trust: ``script_sha256`` is root's hash of Slurm's copy of the batch script
    (``jobs.script_sha256``, PrologSlurmctld; "" gives []), never the job's comment; ``uid`` is Slurm's."""
    if not script_sha256 or not db.table(TABLE).exists():
        return []
    rows = db.execute(f"SELECT fence_mib FROM {TABLE} WHERE script_sha256 = ? AND uid = ? AND fence_mib > 0 "
                      "ORDER BY ts", [script_sha256, int(uid)]).fetchall()
    return [int(r[0]) for r in rows]


def reruns_since(db: Database, uid: int, since_ts: float) -> int:
    """OOM reruns (``retry_status`` submitting/submitted) user ``uid`` got at or after ``since_ts``."""
    if not db.table(TABLE).exists():
        return 0
    row = db.execute(f"SELECT count(*) FROM {TABLE} WHERE uid = ? AND ts >= ? AND retry_status IN "
                     "('submitting', 'submitted')", [int(uid), float(since_ts)]).fetchone()
    return int(row[0]) if row else 0


def unsettled_reruns(db: Database) -> List[int]:
    """Job ids of submitted reruns whose end is not recorded yet (``retry_state`` NULL)."""
    if not db.table(TABLE).exists():
        return []
    rows = db.execute(f"SELECT retry_job_id FROM {TABLE} WHERE retry_status = 'submitted' "
                      "AND retry_job_id IS NOT NULL AND retry_state IS NULL").fetchall()
    return [int(r[0]) for r in rows]


def script_sha256_of(db: Database, job_id: int) -> Optional[str]:
    """``job_id``'s ``script_sha256`` (PrologSlurmctld: root's hash of Slurm's copy), or None."""
    if not db.table("jobs").exists():
        return None
    row = db.execute("SELECT script_sha256 FROM jobs WHERE job_id = ?", [int(job_id)]).fetchone()
    return row[0] if row and row[0] else None


def gpu_samples_between(node_db: Database, t0: float, t1: float) -> bool:
    """Whether a node database holds any ``gpu_samples`` row with ``t0 <= ts <= t1``."""
    if not node_db.table("gpu_samples").exists():
        return False
    return node_db.execute("SELECT 1 FROM gpu_samples WHERE ts >= ? AND ts <= ? LIMIT 1",
                           [float(t0), float(t1)]).fetchone() is not None


def has_watchdog_event(node_db: Database, job_id: int) -> bool:
    """Whether a node database has a ``watchdog_events`` row for ``job_id`` (the watchdog stopped it). False
    where the table or its ``job_id`` column does not exist (older databases)."""
    table = node_db.table("watchdog_events")
    if not table.exists() or "job_id" not in table.columns_dict:
        return False
    return node_db.execute("SELECT 1 FROM watchdog_events WHERE job_id = ? LIMIT 1",
                           [int(job_id)]).fetchone() is not None


WATCHDOG_TABLE = "watchdog_events"


@dataclass(frozen=True)
class WatchdogEvent:
    """A job found over its grant or outside MPS on a shared GPU. ``ts``: detection wall time (Unix s);
    ``reason``: ``over-grant`` (its processes on the GPU used more than grant + tolerance) or ``outside-mps``
    (a CUDA process of an MPS job that NVML does not list as an MPS client); ``share``: the job's share mode
    on this node (``mps`` or ``timeslice``); ``grant_mib``: its grant on that GPU (MiB; 0 on a GPU it holds no
    shard of); used_mib: NVML's figure for its processes there (MiB); tolerance_mib: the configured tolerance;
    ``action``: ``stop`` or ``record`` (``watchdog_action``); message: the line written to the job's stderr;
    ``outcome``: what the stop did (``killed``, ``scancel``, ``stderr``...), filled in after the event."""

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
    """Insert ``ev`` (its ``id`` not read); its row id. Raises sqlite3.Error (locked past the busy timeout,
    disk full), RuntimeError (the insert gave no row id)."""
    with db.atomic():
        row_id = db.table(WATCHDOG_TABLE).insert({
            "ts": ev.ts, "job_id": ev.job_id, "node": ev.node, "gpu_index": ev.gpu_index, "reason": ev.reason,
            "share": ev.share, "grant_mib": ev.grant_mib, "used_mib": ev.used_mib,
            "tolerance_mib": ev.tolerance_mib,
            "pids_json": json.dumps(list(ev.pids)), "action": ev.action, "message": ev.message,
            "outcome_json": json.dumps(ev.outcome, sort_keys=True, default=str)}).last_pk
    if row_id is None:  # sqlite-utils sets last_pk after every insert into a rowid table
        raise RuntimeError(f"insert into {WATCHDOG_TABLE} gave no row id")
    return int(row_id)


def set_outcome(db: Database, event_id: int, outcome: Dict[str, Any]) -> None:
    """Replace the outcome of event ``event_id`` (stored as sorted-key JSON). Raises sqlite3.Error (locked
    past the busy timeout, disk full)."""
    with db.atomic():
        db.table(WATCHDOG_TABLE).update(event_id,
                                        {"outcome_json": json.dumps(outcome, sort_keys=True, default=str)})


def load_events(db: Database, job_id: Optional[int] = None) -> List[WatchdogEvent]:
    """Watchdog events (of ``job_id``; None: all), oldest first; [] on a database older than the table."""
    if not db.table(WATCHDOG_TABLE).exists():
        return []
    where, args = ("job_id = ?", [job_id]) if job_id is not None else (None, [])
    return [WatchdogEvent(
        ts=r["ts"], job_id=r["job_id"], node=r["node"], gpu_index=r["gpu_index"], reason=r["reason"],
        share=r["share"], grant_mib=r["grant_mib"], used_mib=r["used_mib"], tolerance_mib=r["tolerance_mib"],
        pids=tuple(json.loads(r["pids_json"] or "[]")), action=r["action"], message=r["message"] or "",
        outcome=json.loads(r["outcome_json"] or "{}"), id=r["id"])
        for r in db.table(WATCHDOG_TABLE).rows_where(where, args, order_by="id")]


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
    rows = db.execute("SELECT job_id, gpus, shards, uid FROM job_runs WHERE node = ? AND end_ts IS NULL",
                      [node]).fetchall()
    return [RunningRun(int(r[0]), tuple(int(x) for x in str(r[1] or "").split(",") if x.strip().isdigit()),
                       r[2], r[3]) for r in rows]


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
