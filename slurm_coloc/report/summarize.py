"""Reading the databases into report rows (pure data; no rich, no click).

The controller DB (``ctld.db``) and every node DB (``nodes/*.db``) are opened read-only and merged;
a missing, locked or corrupt file is reported in ``Report.problems`` and skipped, never fatal.
Per-job usage figures (peak memory, SM activity/occupancy, energy) come from the node Epilog's job summaries
(``store/summaries.py``) and the sampler's tables (``store/samples.py``); what was not recorded stays None
and ``JobView.notes`` says so.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from sqlite_utils import Database

from slurm_coloc.config import Config
from slurm_coloc.errors import StoreError
from slurm_coloc.store import jobs as store_jobs
from slurm_coloc.store import oom as store_oom
from slurm_coloc.store import report_queries as rq
from slurm_coloc.store import summaries as store_summaries
from slurm_coloc.store import watchdog as store_watchdog
from slurm_coloc.units import format_mib

MIB_PER_GIB = 1024


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
    ``alone_runtime_s``, ``rate_vs_alone``: collocation figures (``report/alone.py``).
    was not recorded. Diagnosis inputs (report/diagnose.py): ``tensor_mean``/``dram_mean`` GPM tensor and DRAM
    activity (%), ``smact_idle_pct`` share of the job's active samples with the GPU idle, ``active_samples``;
    ``train_cpu_cores``/``workers_cpu_cores`` mean CPU cores of its CUDA process(es) and of their descendants
    (DataLoader workers), ``cpu_workers`` how many of those, ``job_cpu_cores`` its cgroup's, ``cpus`` the
    job's CPUs on the node, ``cpu_samples`` rows behind them (node/cpu.py);
    ``batch_size``/``precision`` from the recorded spec; ``findings`` ``[{name, evidence, suggestion}]``, top
    first.
    """

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
    ``oom_by_job``: OOM rows by job id; ``retry_of``: retry job id -> original job id.
    """

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
    """Read every database under ``cfg.state_dir`` into job views (controller rows first, then node-only
    jobs).

    Only identity, request and outcome are filled here; ``add_usage`` adds the measured figures.

    Args:
        cfg: ``state_dir`` (``ctld.db`` and ``nodes/*.db`` under it).

    Returns:
        The ``Report``: job views in job id order, the open node databases, summaries, OOM records, and
        ``problems``. Never raises for a bad database: a missing, locked or corrupt file becomes a
        ``problems`` line.
    """
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
    """``{"batch_size", "precision"}`` from a job's recorded spec JSON (``ModelSpec.to_json``), validated by
    ``comment.values.CommentSpec`` (the spec came with the job's comment, which its user writes); {} when
    absent or invalid.

    Args:
        spec_json: the recorded spec as JSON text, or None.

    Returns:
        ``{"batch_size": int or None, "precision": str or None}``, or ``{}``. Never raises for bad text.
    """
    from slurm_coloc.comment.values import CommentSpec

    spec = CommentSpec.from_json_text(spec_json)
    if spec is None:
        return {}
    return {"batch_size": spec.batch_size, "precision": spec.precision}


def requested_mib(job: JobView, cfg: Config) -> Optional[float]:
    """GPU memory the allocation reserved (MiB): shards x 1024, or whole GPUs x gpu_mem_gib x 1024.

    Args:
        job: the job (``shards``, ``share_mode``, ``gpu_list``).
        cfg: ``gpu_mem_gib``, the memory of one GPU (GiB; one shard is 1 GiB).

    Returns:
        MiB, or None for a job holding neither shards nor whole GPUs.
    """
    if job.shards:
        return float(job.shards * MIB_PER_GIB)
    n_gpus = len(job.gpu_list)
    if job.share_mode == "gpu" and n_gpus:
        return float(n_gpus * cfg.gpu_mem_gib * MIB_PER_GIB)
    return None


def gpus_held(job: JobView, cfg: Config) -> Optional[float]:
    """GPUs the allocation holds: shards / gpu_mem_gib for a shard job, else the number of GPUs.

    Args:
        job: the job (``shards``, ``gpu_list``).
        cfg: ``gpu_mem_gib``, the memory of one GPU (GiB; one shard is 1 GiB).

    Returns:
        GPUs (fractional for shards, at most 1 per GPU listed), or None for a job with neither.
    """
    if job.shards:
        return min(1.0, job.shards / cfg.gpu_mem_gib) * max(1, len(job.gpu_list))
    return float(len(job.gpu_list)) if job.gpu_list else None


def _sum(xs: Sequence[Optional[float]]) -> Optional[float]:
    vals = [x for x in xs if x is not None]
    return sum(vals) if vals else None


def util_by_job(jobs: Sequence[JobView], report: Report, now: float) -> Dict[int, Optional[float]]:
    """Coarse NVML utilization mean (%) of each job's GPUs over its span, batched per node database.

    Args:
        jobs: the jobs (their GPUs and span; a running job's span ends at ``now``, epoch s).
        report: the loaded databases (``load_report``).

    Returns:
        job id -> mean utilization (%), None where no sample covers the job.
    """
    sums: Dict[int, List[float]] = {}
    for node, db in report.node_dbs.items():
        spans = [(j.job_id, g, j.start_ts, j.end_ts if j.end_ts is not None else now) for j in jobs
                 if j.start_ts is not None for n, g in j.gpu_list if n == node]
        for key, (num, den) in rq.job_util_sums(db, spans).items():
            acc = sums.setdefault(key, [0.0, 0.0])
            acc[0] += num
            acc[1] += den
    return {k: (num / den if den else None) for k, (num, den) in sums.items()}


def watchdog_reason(job: JobView, report: Report) -> Optional[str]:
    """Why the sampler's watchdog stopped (or recorded) ``job``, in words, from its nodes' ``watchdog_events``
    (``store/watchdog.py``): ``"stopped: over its grant (7,778 of 2,048 MiB) on n1 GPU 0"``; None: no
    event.

    Args:
        job: the job (its ``gpu_list`` and ``nodes`` say which node databases to read).
        report: the loaded databases (``load_report``).
    """
    nodes = {n for n, _ in job.gpu_list} | {n for n in job.nodes.split(",") if n}
    for node in sorted(nodes):
        db = report.node_dbs.get(node)
        events = store_watchdog.load_events(db, job.job_id) if db is not None else []
        if events:
            ev = events[0]
            verb = "stopped" if ev.action == "stop" else "flagged"
            what = (f"over its grant ({format_mib(ev.used_mib)} of {format_mib(ev.grant_mib)})"
                    if ev.reason == "over-grant" else "a CUDA process outside its MPS server")
            return f"{verb}: {what} on {ev.node} GPU {ev.gpu_index}"
    return None


def add_usage(job: JobView, report: Report, cfg: Config, util: Optional[Dict[int, Optional[float]]] = None
              ) -> JobView:
    """Return ``job`` with measured figures filled in from summaries and samples, plus OOM and notes.

    Args:
        job: the job as recorded (request, estimate, span, GPUs).
        report: the loaded databases (``load_report``): summaries, node databases, OOM events, reruns.
        cfg: ``headroom_mib``, ``gpu_mem_gib`` (the request and GPUs held).
        util: precomputed ``util_by_job`` (job id -> mean utilization %), else the job's samples are read
            here, one job at a time.

    Returns:
        A copy of ``job`` with peak memory (MiB), estimate error (MiB, %), unused request (MiB), utilization
        and SM figures (%), energy (kWh), GPU-hours held and used, OOM/rerun fields, the watchdog's reason and
        notes naming what was not recorded; a figure not recorded is None.
    """
    notes: List[str] = []
    summaries = [s for s in report.summaries.get(job.job_id, []) if s.n_samples]  # 0: the sampler saw nothing
    fig, diag = _summary_figures(summaries)
    by_node: Dict[str, List[int]] = {}
    for node, idx in job.gpu_list:
        by_node.setdefault(node, []).append(idx)
    if util is not None and summaries:
        fig["util_mean"] = util.get(job.job_id)
        if fig["util_mean"] is None:
            notes.append("coarse utilization not recorded")
    elif job.start_ts is not None and by_node:
        _sample_figures(job, report, cfg, by_node, bool(summaries), fig, notes)
    elif not by_node:
        notes.append("no GPU recorded for this job")
    if fig["smact_mean"] is None and (summaries or by_node) \
            and "no samples recorded for this job" not in notes:
        notes.append("SM activity/occupancy not recorded (NVML GPM needs Hopper or newer)")
    if fig["peak"] is None and by_node:
        notes.append("peak memory not recorded")
    return _with_figures(job, report, cfg, fig, _sum([s.gpu_s for s in summaries]), notes, diag)


_FIGURES = ("peak", "util_mean", "smact_mean", "smact_p95", "smocc_mean", "smocc_p95", "energy_j")


def _summary_figures(summaries: List[store_summaries.JobSummary]) -> Tuple[Dict[str, Optional[float]],
                                                                         Dict[str, object]]:
    """The job's figures from its Epilog summaries (``_FIGURES``: peak MiB, percentages, energy J; the SM
    figures from the summary with the most samples) and that summary's diagnostics (``JobView`` fields)."""
    fig: Dict[str, Optional[float]] = dict.fromkeys(_FIGURES)
    fig["peak"] = max((s.peak_mem_mib for s in summaries if s.peak_mem_mib is not None), default=None)
    fig["energy_j"] = _sum([s.energy_j for s in summaries])
    if not summaries:
        return fig, {}
    first = max(summaries, key=lambda s: s.n_samples)
    fig.update(smact_mean=first.smact_mean, smact_p95=first.smact_p95, smocc_mean=first.smocc_mean,
               smocc_p95=first.smocc_p95)
    diag = {"tensor_mean": first.tensor_mean, "dram_mean": first.dram_mean,
            "smact_idle_pct": first.smact_idle_pct, "active_samples": first.active_samples,
            **{k: getattr(first, k) for k in CPU_FIELDS}}
    return fig, diag


def _sample_figures(job: JobView, report: Report, cfg: Config, by_node: Dict[str, List[int]],
                    summarized: bool,
                    fig: Dict[str, Optional[float]], notes: List[str]) -> None:
    """Fill ``fig`` from the GPU samples of the job's span on its GPUs (``by_node``: node -> GPU indexes): the
    utilization always, the peak when no summary gave one, and, without any summary (``summarized``), the SM
    figures and the job's share of the GPUs' energy. Adds a note saying which."""
    t1 = job.end_ts if job.end_ts is not None else job.start_ts + 1e9  # type: ignore[operator]
    stats = []
    for node, idxs in by_node.items():
        db = report.node_dbs.get(node)
        if db is not None:
            stats.extend(rq.gpu_window_stats(db, job.start_ts, t1, idxs))
            if fig["peak"] is None:
                fig["peak"] = rq.job_peak_mem_mib(db, job.job_id)
    if not stats:
        notes.append("no samples recorded for this job")
        return
    w = sum(s.covered_s for s in stats) or 1.0
    fig["util_mean"] = _sum([(s.util_mean or 0) * s.covered_s / w for s in stats if s.util_mean is not None])
    if summarized:
        return
    fig["smact_mean"] = _sum([(s.smact_mean or 0) * s.covered_s / w for s in stats
                              if s.smact_mean is not None])
    fig["smocc_mean"] = _sum([(s.smocc_mean or 0) * s.covered_s / w for s in stats
                              if s.smocc_mean is not None])
    fig["smact_p95"] = max((s.smact_p95 for s in stats if s.smact_p95 is not None), default=None)
    fig["smocc_p95"] = max((s.smocc_p95 for s in stats if s.smocc_p95 is not None), default=None)
    held = gpus_held(job, cfg)
    share = (held / max(1, len(job.gpu_list))) if held else 1.0
    e = _sum([s.energy_j for s in stats])
    fig["energy_j"] = None if e is None else e * share
    notes.append("no Epilog summary: usage read from the GPU samples of its span (energy by share)")


def _with_figures(job: JobView, report: Report, cfg: Config, fig: Dict[str, Optional[float]],
                  used_s: Optional[float], notes: List[str], diag: Dict[str, object]) -> JobView:
    """``job`` with the figures, the estimate's error against the peak (MiB, %), the unused grant (MiB), GPU
    hours held and used, the OOM/rerun fields, the watchdog's reason and the notes."""
    peak, energy_j = fig["peak"], fig["energy_j"]
    req = requested_mib(job, cfg)
    err = err_pct = unused = None
    if peak is not None and job.estimate_mib is not None:
        err = float(job.estimate_mib) - peak
        err_pct = 100.0 * err / peak if peak > 0 else None
    if peak is not None and req is not None:
        unused = max(0.0, req - peak)
    held = gpus_held(job, cfg)
    gpu_hours = None if held is None or job.runtime_s is None else held * job.runtime_s / 3600.0
    o = report.oom_by_job.get(job.job_id)
    retry_outcome = None
    if o is not None:
        retry_outcome = o.retry_state or (f"retry {o.retry_status}" if o.retry_status else None)
    return replace(
        job, requested_mib=req, peak_mem_mib=peak, estimate_error_mib=err, estimate_error_pct=err_pct,
        unused_mib=unused, util_mean=fig["util_mean"], smact_mean=fig["smact_mean"],
        smact_p95=fig["smact_p95"],
        smocc_mean=fig["smocc_mean"], smocc_p95=fig["smocc_p95"],
        energy_kwh=None if energy_j is None else energy_j / 3.6e6, gpu_hours=gpu_hours,
        gpu_hours_used=None if used_s is None else used_s / 3600.0, oom=o is not None,
        retry_of=report.retry_of.get(job.job_id) or (o.retry_of if o else None),
        retry_status=o.retry_status if o else None, retry_job_id=o.retry_job_id if o else None,
        retry_outcome=retry_outcome, watchdog=watchdog_reason(job, report), notes=notes,
        **diag)  # type: ignore[arg-type]
