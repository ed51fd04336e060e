"""Per-job summaries of a node database (``job_summaries``, written by the Epilog; ``job_figures``, a JSON
object, hooks/figures.py), and what earlier runs of a script needed: the estimator's history (read-only).
History functions taking a node list read the node databases of its nodes (Slurm host list, ``gpu[01-02]``)
and never raise: an unreadable node database is logged and skipped. Times are Unix s."""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from sqlite_utils import Database

from slurm_coloc.config import Config
from slurm_coloc.errors import SlurmError, StoreError
from slurm_coloc.slurm.parse import expand_hostlist
from slurm_coloc.store.oom import gpu_samples_between, has_watchdog_event, history_peaks_mib
from slurm_coloc.store.report_queries import job_peak_mem_mib as _node_peak
from slurm_coloc.store.report_queries import open_for_report as open_readonly  # users read root's WAL files

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobSummary:
    """What a job used on one node, written by the Epilog (docs/node.md gives the attribution rule).
    ``peak_mem_mib``: max over sample instants of the summed NVML memory of the job's processes (MiB);
    smact_mean/p95, smocc_mean/p95, tensor_mean, dram_mean: GPM activity of the job's GPUs while it ran (%);
    ``energy_j``: GPU energy attributed to the job (J); gpu_s: GPU-seconds attributed to it;
    ``smact_idle_pct``: % of the active samples (a process of the job on the GPU) with SM activity below
    ``diag_idle_smact_pct``; train_cpu_cores, workers_cpu_cores: mean CPU cores of the job's CUDA process(es)
    and of their descendants (DataLoader workers; node/cpu.py); cpu_workers: mean number of those;
    job_cpu_cores: mean cores of its whole cgroup; cpus: its CPUs on the node; cpu_samples: rows used (None:
    none)."""

    job_id: int
    node: str
    gpus: str
    start_ts: Optional[float]
    end_ts: Optional[float]
    peak_mem_mib: Optional[float]
    smact_mean: Optional[float]
    smact_p95: Optional[float]
    smocc_mean: Optional[float]
    smocc_p95: Optional[float]
    energy_j: Optional[float]
    gpu_s: Optional[float]
    n_samples: int
    tensor_mean: Optional[float] = None
    dram_mean: Optional[float] = None
    smact_idle_pct: Optional[float] = None
    active_samples: Optional[int] = None
    train_cpu_cores: Optional[float] = None
    workers_cpu_cores: Optional[float] = None
    cpu_workers: Optional[float] = None
    job_cpu_cores: Optional[float] = None
    cpus: Optional[int] = None
    cpu_samples: Optional[int] = None


def record_summary(db: Database, summary: JobSummary) -> None:
    """Insert or replace the (job, node) summary, stamped now. Raises sqlite3.Error (locked past the busy
    timeout, disk full)."""
    with db.atomic():
        db.table("job_summaries").upsert({**asdict(summary), "ts": time.time()}, pk=("job_id", "node"))


def load_summaries(db: Database, job_id: Optional[int] = None) -> List[JobSummary]:
    """Summaries of a node database (of ``job_id``; None: all), by job id; [] without the table."""
    if not db.table("job_summaries").exists():
        return []
    where, args = ("job_id = ?", [job_id]) if job_id is not None else (None, [])
    names = set(JobSummary.__dataclass_fields__)
    return [JobSummary(**{k: v for k, v in r.items() if k in names})
            for r in db.table("job_summaries").rows_where(where, args, order_by="job_id")]


def record_figures(db: Database, job_id: int, node: str, figures: Dict[str, Any]) -> None:
    """Insert or replace the (job, node) summary figures (sorted-key JSON; hooks/figures.py), stamped now.
    Raises sqlite3.Error (locked past the busy timeout, disk full), TypeError (``figures`` holds a value JSON
    cannot encode)."""
    with db.atomic():
        db.table("job_figures").upsert({"job_id": int(job_id), "node": node, "ts": time.time(),
                                        "figures_json": json.dumps(figures, sort_keys=True)},
                                        pk=("job_id", "node"))


def load_figures(db: Database, job_id: int) -> Optional[Tuple[float, Dict[str, Any]]]:
    """``(ts, figures)`` of the job's latest figures here; None: none, no table, or not a JSON object."""
    if not db.table("job_figures").exists():
        return None
    for row in db.table("job_figures").rows_where("job_id = ?", [int(job_id)], order_by="ts DESC", limit=1):
        try:
            data = json.loads(row["figures_json"] or "")
        except ValueError:
            return None
        return (float(row["ts"] or 0.0), data) if isinstance(data, dict) else None
    return None


MAX_HISTORY_JOBS = 20  # the most recent completed runs whose measured peaks are read


def script_history_mib(cfg: Config, script_sha256: str, uid: Optional[int] = None) -> List[int]:
    """MiB values earlier runs of user ``uid``'s (None: the caller's) script with this SHA-256 needed. Trust:
    keyed on what root recorded, ``jobs.script_sha256`` (root's hash of the batch script Slurm stored; ""
    gives []) and ``jobs.uid`` / ``oom_events.uid`` (Slurm's), never the job's comment; so no user's jobs feed
    another's estimate, and a forged comment feeds nothing. Returns: OOM fences
    (``store.oom.history_peaks_mib``: the job needed more), oldest first, then the measured peaks
    (``job_summaries.peak_mem_mib`` of the job's nodes) of the last ``MAX_HISTORY_JOBS`` COMPLETED runs,
    newest first; [] when the controller database does not exist yet. Raises StoreError (the controller
    database exists but cannot be read (node files are skipped quietly))."""
    uid = os.getuid() if uid is None else int(uid)
    if not script_sha256 or not cfg.ctld_db_path.exists():
        return []
    db = open_readonly(cfg.ctld_db_path)
    try:
        values = history_peaks_mib(db, script_sha256, uid)
        done = db.execute("SELECT job_id, node_list FROM jobs WHERE script_sha256 = ? AND uid = ? "
                          "AND state = 'COMPLETED' ORDER BY job_id DESC LIMIT ?",
                          [script_sha256, uid, MAX_HISTORY_JOBS]).fetchall()
    except Exception as exc:  # sqlite3 errors while reading a damaged file
        raise StoreError(f"cannot read history from {cfg.ctld_db_path}: {exc}") from None
    for job_id, node_list in done:
        peak = measured_peak_mib(cfg, int(job_id), node_list or "")
        if peak:
            values.append(peak)
    return values


def node_names(node_list: str) -> List[str]:
    """The nodes of a Slurm host list (``gpu[01-02],n5`` -> gpu01 gpu02 n5); [] when unreadable (logged)."""
    try:
        return expand_hostlist(node_list)
    except SlurmError as exc:
        log.warning("cannot read node list %r: %s", node_list[:80], exc.one_line())
        return []


def _node_db_paths(cfg: Config, node_list: str) -> Iterator[Path]:
    """The database files of the nodes of ``node_list`` that exist."""
    for node in node_names(node_list or ""):
        path = cfg.node_db_path(node)
        if path.exists():
            yield path


def measured_peak_mib(cfg: Config, job_id: int, node_list: str) -> Optional[int]:
    """The largest per-node summary peak (MiB) the node Epilogs recorded for ``job_id``; None if none did."""
    best: Optional[float] = None
    for path in _node_db_paths(cfg, node_list):
        try:
            rows = load_summaries(open_readonly(path), job_id)
        except Exception as exc:  # history is best effort
            log.warning("cannot read the summary of job %s from %s: %s", job_id, path, exc)
            continue
        for row in rows:
            if row.peak_mem_mib and (best is None or row.peak_mem_mib > best):
                best = row.peak_mem_mib
    return None if best is None else int(round(best))


def job_peak_mem_mib(cfg: Config, job_id: int, node_list: str) -> Optional[int]:
    """The sampler's peak GPU memory of ``job_id``, MiB summed over its processes per instant, max over nodes.
    None when no node recorded samples for it."""
    best: Optional[float] = None
    for path in _node_db_paths(cfg, node_list):
        try:
            peak = _node_peak(open_readonly(path), job_id)
        except Exception as exc:  # evidence is optional
            log.warning("cannot read samples of job %s from %s: %s", job_id, path, exc)
            continue
        if peak is not None and (best is None or peak > best):
            best = peak
    return None if best is None else int(round(best))


def sampler_watched(cfg: Config, node_list: str, start_ts: Optional[float], end_ts: Optional[float]) -> bool:
    """Whether a sampler recorded GPU samples on a node of ``node_list`` in ``[start_ts, end_ts]`` (Unix s).
    None or 0 times: False. Then a job with no process samples of its own held no GPU memory in that time."""
    if not start_ts or not end_ts:
        return False
    for path in _node_db_paths(cfg, node_list):
        try:
            if gpu_samples_between(open_readonly(path), start_ts, end_ts):
                return True
        except Exception as exc:  # evidence is optional
            log.warning("cannot read gpu samples from %s: %s", path, exc)
    return False


def stopped_by_watchdog(cfg: Config, job_id: int, node_list: str) -> bool:
    """Whether the sampler's watchdog stopped ``job_id`` on a node of ``node_list`` (unreadable: no event)."""
    for path in _node_db_paths(cfg, node_list):
        try:
            if has_watchdog_event(open_readonly(path), job_id):
                return True
        except Exception as exc:  # logged; treated as no event
            log.warning("cannot read watchdog events from %s: %s", path, exc)
    return False
