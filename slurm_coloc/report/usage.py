"""Per-job usage figures of coloc-report (pure data): what a job reserved and held (``requested_mib``,
``gpus_held``) and what it used, filled into its ``JobView`` by ``add_usage`` from the node Epilog's job
summaries (``store/summaries.py``) and the sampler's tables (``store/samples.py``): peak memory, estimate
error, utilization, SM activity/occupancy, energy, GPU-hours, the OOM record and the watchdog's reason. What
was not recorded stays None and ``JobView.notes`` says so.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Dict, List, Optional, Sequence, Tuple

from slurm_coloc.config import Config
from slurm_coloc.report.summarize import CPU_FIELDS, JobView, Report
from slurm_coloc.store import report_queries as rq
from slurm_coloc.store import summaries as store_summaries
from slurm_coloc.store import watchdog as store_watchdog
from slurm_coloc.units import format_mib

MIB_PER_GIB = 1024


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
