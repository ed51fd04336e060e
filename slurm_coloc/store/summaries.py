"""Per-job summaries of a node database: what a job used on the node (``job_summaries``, written by the
Epilog) and its summary figures (``job_figures``, a JSON object; hooks/figures.py). Times are Unix s.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Tuple

from sqlite_utils import Database


@dataclass(frozen=True)
class JobSummary:
    """What a job used on one node, written by the Epilog (docs/node.md gives the attribution rule).

    Attributes:
        peak_mem_mib: max over sample instants of the summed NVML memory of the job's processes (MiB).
        smact_mean/p95, smocc_mean/p95, tensor_mean, dram_mean: GPM activity of the job's GPUs while it ran
        (%).
        energy_j: GPU energy attributed to the job (J); gpu_s: GPU-seconds attributed to it.
        smact_idle_pct: % of the active samples (a process of the job on the GPU) with SM activity below
            ``diag_idle_smact_pct``.
        train_cpu_cores, workers_cpu_cores: mean CPU cores of the job's CUDA process(es) and of their
            descendants (DataLoader workers; node/cpu.py); cpu_workers: mean number of those; job_cpu_cores:
            mean cores of its whole cgroup; cpus: its CPUs on the node; cpu_samples: rows used (None: none).
    """

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
    """Insert or replace the (job, node) summary, stamped now.

    Raises:
        sqlite3.Error: locked past the busy timeout, disk full.
    """
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

    Raises:
        sqlite3.Error: locked past the busy timeout, disk full.
        TypeError: ``figures`` holds a value JSON cannot encode.
    """
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
