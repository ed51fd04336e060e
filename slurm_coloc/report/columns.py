"""The columns of each coloc-report view (the JSON/CSV keys), ``-o/--format`` selection and CSV cell values.

Pure. The column lists are the keys the row builders of ``report/views.py`` write (tests/test_report_output.py
checks that they agree), so an empty answer still has its CSV header and ``-o`` is checked before any read.
"""
from __future__ import annotations

import datetime
from dataclasses import fields
from typing import Dict, List, Sequence, Tuple

from slurm_coloc.errors import ColocError
from slurm_coloc.report.summarize import JobView

JOB_COLUMNS: Tuple[str, ...] = tuple(f.name for f in fields(JobView)) + ("runtime_s",)
USER_COLUMNS = ("user", "jobs", "gpu_hours", "energy_kwh", "smact_mean", "smocc_mean", "util_mean",
                "unused_gib_hours", "estimate_abs_error_pct_mean", "ooms", "wasteful_jobs",
                "jobs_without_samples")
GPU_COLUMNS = ("node", "gpu", "jobs", "busy_hours", "collocation_factor", "util_mean", "smact_mean",
               "smact_p95",
               "smocc_mean", "smocc_p95", "mem_used_mean_mib", "mem_used_max_mib", "saturated_hours",
               "saturated_pct", "mem_total_mib", "energy_kwh", "sampled_hours")
_FOLD = ("gpus", "busy_gpu_hours", "collocation_factor", "util_mean", "smact_mean", "smocc_mean",
         "energy_kwh")
NODE_COLUMNS = ("node",) + _FOLD
CLUSTER_COLUMNS = _FOLD + ("jobs", "users", "gpu_hours", "job_energy_kwh", "ooms", "oom_retries_completed",
                           "wasteful_jobs", "estimate_abs_error_pct_mean")
VIEW_COLUMNS: Dict[str, Tuple[str, ...]] = {"jobs": JOB_COLUMNS, "users": USER_COLUMNS, "gpus": GPU_COLUMNS,
                                            "nodes": NODE_COLUMNS, "cluster": CLUSTER_COLUMNS}


def select_columns(view: str, spec: str) -> List[str]:
    """The columns named by ``-o/--format`` as typed, in order (``jobid,user,shards,peak_mib``:
    comma-separated, case-insensitive; ``jobid`` and the like may leave out the underscore, and ``peak_mib``
    names ``peak_mem_mib``); ``view`` is the caller's view name, not user text.

    Raises:
        ColocError: an empty list or an unknown column (one line listing the valid ones).
    """
    valid = VIEW_COLUMNS[view]
    squashed = {c.replace("_", ""): c for c in valid}
    aliases = {"peak_mib": "peak_mem_mib", "est_mib": "estimate_mib", "req_mib": "requested_mib",
               "mode": "share_mode", "jobid": "job_id"}
    out: List[str] = []
    for word in (w.strip().lower() for w in spec.split(",")):
        if not word:
            continue
        col = word if word in valid else aliases.get(word) or squashed.get(word.replace("_", ""))
        if col is None or col not in valid:
            raise ColocError(f"-o/--format: no column {word!r} in the {view} view; valid: {','.join(valid)}")
        out.append(col)
    if not out:
        raise ColocError(f"-o/--format: no column given; valid: {','.join(valid)}")
    return out


def iso_time(ts: object) -> object:
    """An int or float (Unix s) -> ISO 8601 local time with its UTC offset (``2026-11-26T07:15:02+00:00``);
    other values as they are.
    """
    if isinstance(ts, (int, float)) and not isinstance(ts, bool):
        return datetime.datetime.fromtimestamp(float(ts)).astimezone().isoformat(timespec="seconds")
    return ts


def cell(key: str, value: object) -> object:
    """A CSV cell: times (``*_ts`` columns) in ISO 8601, lists joined by ``; ``, findings by their names."""
    if key.endswith("_ts"):
        return iso_time(value)
    if isinstance(value, list):
        return "; ".join(str(v.get("name", v)) if isinstance(v, dict) else str(v) for v in value)
    return value


def project(rows: Sequence[Dict[str, object]], cols: Sequence[str]) -> List[Dict[str, object]]:
    """Rows reduced to ``cols`` (in that order); a row without one gets None."""
    return [{c: r.get(c) for c in cols} for r in rows]
