"""Reading the databases into report rows (pure data; no rich, no click).

The controller DB (``ctld.db``) and every node DB (``nodes/*.db``) are opened read-only and merged;
a missing, locked or corrupt file is reported in ``Report.problems`` and skipped, never fatal.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from slurm_coloc.config import Config
from slurm_coloc.errors import StoreError
from slurm_coloc.store import jobs as store_jobs
from slurm_coloc.store.db import open_readonly


@dataclass(frozen=True)
class JobView:
    """One job as coloc-report shows it. Times in Unix seconds, memory in MiB, runtime in seconds."""

    job_id: int
    user: Optional[str]
    name: Optional[str]
    nodes: str
    gpus: str
    shards: Optional[int]
    share_mode: Optional[str]
    estimate_mib: Optional[int]
    estimate_method: Optional[str]
    state: Optional[str]
    exit_code: Optional[int]
    signal: Optional[int]
    start_ts: Optional[float]
    end_ts: Optional[float]

    @property
    def runtime_s(self) -> Optional[float]:
        """End minus start, or None while either is unknown."""
        if self.start_ts is None or self.end_ts is None:
            return None
        return max(0.0, self.end_ts - self.start_ts)

    def to_json(self) -> Dict[str, object]:
        """JSON-able dict including ``runtime_s``."""
        d = dict(self.__dict__)
        d["runtime_s"] = self.runtime_s
        return d


@dataclass
class Report:
    """Merged jobs plus the problems met while reading (one line each)."""

    jobs: List[JobView] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)


def _node_rows(cfg: Config, problems: List[str]) -> Dict[int, List[store_jobs.JobRunRow]]:
    by_job: Dict[int, List[store_jobs.JobRunRow]] = {}
    node_dir = cfg.node_db_dir
    for path in sorted(node_dir.glob("*.db")) if node_dir.is_dir() else []:
        try:
            for row in store_jobs.load_job_runs(open_readonly(path)):
                by_job.setdefault(row.job_id, []).append(row)
        except (StoreError, Exception) as exc:  # noqa: BLE001 - a bad node file is skipped, not fatal
            msg = exc.one_line() if isinstance(exc, StoreError) else f"{type(exc).__name__}: {exc}"
            problems.append(f"skipped node database {path.name}: {msg}")
    return by_job


def load_report(cfg: Config) -> Report:
    """Read every database under ``cfg.state_dir`` into job views (controller rows first, then node-only jobs)."""
    report = Report()
    ctld_rows: Dict[int, store_jobs.JobRow] = {}
    path: Path = cfg.ctld_db_path
    if path.exists():
        try:
            ctld_rows = {r.job_id: r for r in store_jobs.load_jobs(open_readonly(path))}
        except (StoreError, Exception) as exc:  # noqa: BLE001
            msg = exc.one_line() if isinstance(exc, StoreError) else f"{type(exc).__name__}: {exc}"
            report.problems.append(f"skipped controller database: {msg}")
    else:
        report.problems.append(f"no controller database at {path} (no job recorded yet)")
    node_rows = _node_rows(cfg, report.problems)
    for job_id in sorted(set(ctld_rows) | set(node_rows)):
        c = ctld_rows.get(job_id)
        runs = sorted(node_rows.get(job_id, []), key=lambda r: r.node)
        starts = [r.start_ts for r in runs if r.start_ts] + ([c.start_ts] if c and c.start_ts else [])
        ends = [r.end_ts for r in runs if r.end_ts] + ([c.end_ts] if c and c.end_ts else [])
        state = (c.state if c and c.state else None) or next((r.state for r in runs if r.state), None)
        exit_code = c.exit_code if c and c.exit_code is not None else next(
            (r.exit_code for r in runs if r.exit_code is not None), None)
        signal = c.signal if c and c.signal is not None else next(
            (r.signal for r in runs if r.signal is not None), None)
        report.jobs.append(JobView(
            job_id=job_id,
            user=(c.user_name if c else None) or next((r.user_name for r in runs if r.user_name), None),
            name=c.job_name if c else None,
            nodes=",".join(r.node for r in runs) or ((c.node_list or "") if c else ""),
            gpus=";".join(f"{r.node}:{r.gpus}" for r in runs if r.gpus),
            shards=(c.shards_req if c and c.shards_req is not None else next(
                (r.shards for r in runs if r.shards is not None), None)),
            share_mode=c.share_mode if c else None,
            estimate_mib=c.estimate_mib if c else None, estimate_method=c.estimate_method if c else None,
            state=state, exit_code=exit_code, signal=signal,
            start_ts=min(starts) if starts else None, end_ts=max(ends) if ends else None))
    return report
