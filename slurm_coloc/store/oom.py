"""OOM deaths and their one retry, controller side (``oom_events`` table of ``ctld.db``).

Written by EpilogSlurmctld (``hooks/oom.py``); read by coloc-report and by coloc-sbatch
(``history_peaks_mib``, the estimator's history). One row per job that died of GPU OOM. The primary key on the
job id is the "exactly once" guard: ``claim_retry`` inserts the row before sbatch runs, so a second
EpilogSlurmctld run for the same job (or a race) finds it and does nothing. Times are Unix s; a missing table
reads as empty.
"""
from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, fields
from typing import Any, Dict, List, Optional

from sqlite_utils import Database

TABLE = "oom_events"


@dataclass(frozen=True)
class OomRecord:
    """A job that died of GPU OOM, as the hook recorded it.

    Attributes:
        fence_mib: the memory it was allowed (shards * 1024 MiB), the fence it hit; None without shards.
        evidence: what decided it (``messages``, ``state``, ``exit_code``, ``stderr_path``, ...), JSON-able.
        retry_of: the original job id when this job was itself a retry (never retried again).
        retry_status: ``submitting`` | ``submitted`` | ``failed`` | ``not-retried``.
        retry_reason: one line (``shared GPU: rerun on a whole GPU``, ``already a retry of 12``...).
    """

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

    ``rec.retry_status``: ``submitting`` when a retry will follow, else the final status.

    Raises:
        sqlite3.Error: locked past the busy timeout, disk full (a duplicate job id is False, not an error).
    """
    try:
        with db.atomic():
            db.table(TABLE).insert(_row(rec), pk="job_id")
    except sqlite3.IntegrityError:
        return False
    return True


def record_retry_submitted(db: Database, job_id: int, retry_job_id: int,
                           submit_ts: Optional[float] = None) -> None:
    """sbatch accepted ``job_id``'s retry as ``retry_job_id``; ``submit_ts`` None: now.

    Raises:
        sqlite3.Error: locked past the busy timeout, disk full.
    """
    with db.atomic():
        db.table(TABLE).update(job_id, {"retry_status": "submitted", "retry_job_id": int(retry_job_id),
                                  "retry_submit_ts": submit_ts or time.time()})


def record_retry_failed(db: Database, job_id: int, error: str) -> None:
    """sbatch refused (or could not run) ``job_id``'s retry; ``error`` stored up to 2000 characters.

    Raises:
        sqlite3.Error: locked past the busy timeout, disk full.
    """
    with db.atomic():
        db.table(TABLE).update(job_id, {"retry_status": "failed", "retry_error": error[:2000]})


def record_retry_outcome(db: Database, retry_job_id: int, state: Optional[str], start_ts: Optional[float],
                         end_ts: Optional[float]) -> bool:
    """How retry ``retry_job_id`` ended (its EpilogSlurmctld); False, nothing written: not a known retry.

    Raises:
        sqlite3.Error: locked past the busy timeout, disk full.
    """
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
    """MiB that earlier runs of user ``uid``'s script with this SHA-256 were shown to need, oldest first.

    Each value is the fence an OOM'd attempt hit (``fence_mib`` = shards * 1024 MiB): a lower bound for the
    estimator's history (``estimate_peak(history_mib=...)``: ``max * 1.05 + 64`` MiB, so the next submission
    asks for more than the fence). Unknown fences are left out; NVML peaks of completed runs come from the
    sampler's tables. Trust: ``script_sha256`` is root's hash of Slurm's copy of the batch script
    (``jobs.script_sha256``, PrologSlurmctld; "" gives []), never the job's comment; ``uid`` is Slurm's.
    """
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
    """Whether a node database has a ``watchdog_events`` row for ``job_id`` (the watchdog stopped it).

    False where the table or its ``job_id`` column does not exist (older databases).
    """
    table = node_db.table("watchdog_events")
    if not table.exists() or "job_id" not in table.columns_dict:
        return False
    return node_db.execute("SELECT 1 FROM watchdog_events WHERE job_id = ? LIMIT 1",
                           [int(job_id)]).fetchone() is not None
