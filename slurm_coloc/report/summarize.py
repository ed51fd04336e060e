"""Reading the databases into report rows (pure data; no rich, no click).

The controller DB (``ctld.db``) and every node DB (``nodes/*.db``) are opened read-only and merged; a missing,
locked or corrupt file is reported in ``Report.problems`` and skipped, never fatal. Here each job gets its
identity, request and outcome (``JobView``); ``report/usage.py`` ``add_usage`` adds its usage figures.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Dict, List, Optional

from sqlite_utils import Database

from slurm_coloc.config import Config
from slurm_coloc.errors import StoreError
from slurm_coloc.store import jobs as store_jobs
from slurm_coloc.store import oom as store_oom
from slurm_coloc.store import report_queries as rq
from slurm_coloc.store import summaries as store_summaries


@dataclass(frozen=True)
class JobView:
    """One job as coloc-report shows it. Times in Unix seconds, memory in MiB, runtime in seconds.

    Usage attributes (None = not recorded): ``requested_mib`` GPU memory the allocation reserved (shards x
    1024, or whole GPUs x ``gpu_mem_gib``); ``peak_mem_mib`` measured peak NVML memory of the job's processes;
    ``estimate_error_mib`` = estimate - peak (positive: over-estimate); ``estimate_error_pct`` relative to
    peak; ``unused_mib`` = requested - peak; ``util_mean`` coarse NVML utilization of its GPUs (%);
    ``smact_*``/``smocc_*`` GPM SM activity/occupancy of its GPUs (%); ``energy_kwh`` energy attributed to it;
    ``gpu_hours`` GPUs held x runtime (a shard job holds shards/gpu_mem_gib of a GPU); ``gpu_hours_used`` the
    sampler's attributed GPU time; ``oom``/``retry_*`` the OOM record; ``waste`` reasons in words; ``notes``
    what was not recorded; ``signature`` what it trains (``placement.intensity.signature``); ``shared_gpu``,
    ``alone_runtime_s``, ``rate_vs_alone``, ``alone_source``: collocation figures (``report/usage.py``).

    Diagnosis inputs (report/diagnose.py): ``tensor_mean``/``dram_mean`` GPM tensor and DRAM activity (%),
    ``smact_idle_pct`` share of the job's active samples with the GPU idle, ``active_samples``;
    ``train_cpu_cores``/``workers_cpu_cores`` mean CPU cores of its CUDA process(es) and of their descendants
    (DataLoader workers), ``cpu_workers`` how many of those, ``job_cpu_cores`` its cgroup's, ``cpus`` the
    job's CPUs on the node, ``cpu_samples`` rows behind them (node/cpu.py); ``batch_size``/``precision`` from
    the recorded spec; ``findings`` ``[{name, evidence, suggestion}]``, top first."""

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
    requested_mib: Optional[float] = None
    peak_mem_mib: Optional[float] = None
    estimate_error_mib: Optional[float] = None
    estimate_error_pct: Optional[float] = None
    unused_mib: Optional[float] = None
    util_mean: Optional[float] = None
    smact_mean: Optional[float] = None
    smact_p95: Optional[float] = None
    smocc_mean: Optional[float] = None
    smocc_p95: Optional[float] = None
    energy_kwh: Optional[float] = None
    gpu_hours: Optional[float] = None
    gpu_hours_used: Optional[float] = None
    oom: bool = False
    retry_of: Optional[int] = None
    retry_status: Optional[str] = None
    retry_job_id: Optional[int] = None
    retry_outcome: Optional[str] = None
    watchdog: Optional[str] = None
    waste: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    signature: Optional[str] = None
    shared_gpu: Optional[bool] = None
    alone_runtime_s: Optional[float] = None
    rate_vs_alone: Optional[float] = None
    alone_source: Optional[str] = None
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
    batch_size: Optional[int] = None
    precision: Optional[str] = None
    findings: List[Dict[str, str]] = field(default_factory=list)

    @property
    def runtime_s(self) -> Optional[float]:
        """End minus start, or None while either is unknown."""
        if self.start_ts is None or self.end_ts is None:
            return None
        return max(0.0, self.end_ts - self.start_ts)

    @property
    def gpu_list(self) -> List[tuple]:
        """``[(node, gpu_index), ...]`` parsed from ``gpus`` (``n1:0,1;n2:0``)."""
        out: List[tuple] = []
        for part in self.gpus.split(";") if self.gpus else []:
            node, _, idx = part.partition(":")
            out.extend((node, int(i)) for i in idx.split(",") if i.strip().isdigit())
        return out

    def to_json(self) -> Dict[str, object]:
        """JSON-able dict including ``runtime_s``."""
        d = {f.name: getattr(self, f.name) for f in _FIELDS}
        d["waste"], d["notes"] = list(self.waste), list(self.notes)
        d["findings"] = [dict(f) for f in self.findings]
        d["runtime_s"] = self.runtime_s
        return d


_FIELDS = fields(JobView)
CPU_FIELDS = ("train_cpu_cores", "workers_cpu_cores", "cpu_workers", "job_cpu_cores", "cpus", "cpu_samples")


@dataclass
class Report:
    """Merged jobs plus the problems met while reading (one line each).

    ``node_dbs``: the node databases that could be read, by node name (open, read-only) for the GPU views.
    ``oom_by_job``: OOM rows by job id; ``retry_of``: retry job id -> original job id."""

    jobs: List[JobView] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)
    node_dbs: Dict[str, Database] = field(default_factory=dict)
    node_paths: Dict[str, str] = field(default_factory=dict)
    summaries: Dict[int, List[store_summaries.JobSummary]] = field(default_factory=dict)
    oom_by_job: Dict[int, store_oom.OomRecord] = field(default_factory=dict)
    retry_of: Dict[int, int] = field(default_factory=dict)


def _msg(exc: Exception) -> str:
    return exc.one_line() if isinstance(exc, StoreError) else " ".join(f"{type(exc).__name__}: {exc}".split())


def _node_rows(cfg: Config, report: Report) -> Dict[int, List[store_jobs.JobRunRow]]:
    by_job: Dict[int, List[store_jobs.JobRunRow]] = {}
    node_dir = cfg.node_db_dir
    for path in sorted(node_dir.glob("*.db")) if node_dir.is_dir() else []:
        try:
            db = rq.open_for_report(path)
            runs = store_jobs.load_job_runs(db)
            summaries = store_summaries.load_summaries(db)
            rq.has_samples(db)
        except Exception as exc:  # a bad node file is skipped, not fatal
            report.problems.append(f"skipped node database {path.name}: {_msg(exc)}")
            continue
        report.node_dbs[path.stem] = db
        report.node_paths[path.stem] = str(path)
        for row in runs:
            by_job.setdefault(row.job_id, []).append(row)
        for s in summaries:
            report.summaries.setdefault(s.job_id, []).append(s)
    if not node_dir.is_dir():
        report.problems.append(f"no node databases under {node_dir} (no job has run on a node yet)")
    return by_job


def load_report(cfg: Config) -> Report:
    """Every database under ``cfg.state_dir`` read into job views (job id order; controller rows first, then
    node-only jobs) with identity, request and outcome only (``add_usage`` adds the measured figures), the
    open node databases, summaries and OOM records. Never raises for a bad database: a missing, locked or
    corrupt file becomes a ``problems`` line."""
    report = Report()
    ctld_rows: Dict[int, store_jobs.JobRow] = {}
    path: Path = cfg.ctld_db_path
    if path.exists():
        try:
            cdb = rq.open_for_report(path)
            ctld_rows = {r.job_id: r for r in store_jobs.load_jobs(cdb)}
            for o in store_oom.load_oom_events(cdb):
                report.oom_by_job[o.job_id] = o
                if o.retry_job_id is not None:
                    report.retry_of[o.retry_job_id] = o.job_id
        except Exception as exc:
            report.problems.append(f"skipped controller database: {_msg(exc)}")
    else:
        report.problems.append(f"no controller database at {path} (no job recorded yet)")
    node_rows = _node_rows(cfg, report)
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
            start_ts=min(starts) if starts else None, end_ts=max(ends) if ends else None,
            signature=_signature(c.coloc_json if c else None),
            **spec_fields(c.spec_json if c else None)))
    return report


def _signature(coloc_json: Optional[str]) -> Optional[str]:
    """``placement.intensity.signature`` of a recorded coloc comment (JSON text, validated again by
    ``comment.JobComment``), None when absent or invalid."""
    from slurm_coloc.comment import JobComment

    return JobComment.from_json_text(coloc_json).signature()


def spec_fields(spec_json: Optional[str]) -> Dict[str, Any]:
    """``{"batch_size": int or None, "precision": str or None}`` from a job's recorded spec JSON, validated by
    ``comment.values.CommentSpec`` (the spec came with the job's comment, which its user writes); {} when
    absent or invalid."""
    from slurm_coloc.comment.values import CommentSpec

    spec = CommentSpec.from_json_text(spec_json)
    if spec is None:
        return {}
    return {"batch_size": spec.batch_size, "precision": spec.precision}
