"""Per-job usage figures of coloc-report (pure data), filled into a ``JobView`` by ``add_usage`` from the node
Epilog's job summaries (``store/summaries.py``) and the sampler's tables (``store/samples.py``): request and
GPUs held, peak memory, estimate error, utilization, SM activity/occupancy, energy, GPU-hours, the OOM record
and the watchdog's reason; what was not recorded stays None and ``JobView.notes`` says so. The figures come
from ``report/facts.py``, which the node Epilog also uses for the AdminComment.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Dict, List, Optional, Sequence, Tuple

from slurm_coloc.config import Config
from slurm_coloc.report import facts
from slurm_coloc.report.summarize import CPU_FIELDS, JobView, Report
from slurm_coloc.store import report_queries as rq
from slurm_coloc.store import summaries as store_summaries

MIB_PER_GIB = facts.MIB_PER_GIB


def requested_mib(job: JobView, cfg: Config) -> Optional[float]:
    """GPU memory reserved (MiB): shards x 1024, or GPUs x ``gpu_mem_gib`` x 1024; None for neither."""
    return facts.requested_mib(job.shards, job.share_mode, len(job.gpu_list), cfg.gpu_mem_gib)


def gpus_held(job: JobView, cfg: Config) -> Optional[float]:
    """GPUs held: shards / ``gpu_mem_gib`` (one shard is 1 GiB), else the GPUs listed; None for neither."""
    return facts.gpus_held(job.shards, len(job.gpu_list), cfg.gpu_mem_gib)


def util_by_job(jobs: Sequence[JobView], report: Report, now: float) -> Dict[int, Optional[float]]:
    """Job id -> coarse NVML utilization mean (%) of its GPUs over its span (a running job's ends at ``now``,
    epoch s), None where no sample covers it; batched per node database.
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
    """Why the sampler's watchdog stopped (or recorded) ``job``, in words: ``'stopped: over its grant (7,778
    of 2,048 MiB) on n1 GPU 0'``; None: no event.
    """
    nodes = {n for n, _ in job.gpu_list} | {n for n in job.nodes.split(",") if n}
    return facts.watchdog_reason(report.node_dbs, job.job_id, nodes)


def add_usage(job: JobView, report: Report, cfg: Config, util: Optional[Dict[int, Optional[float]]] = None
              ) -> JobView:
    """A copy of ``job`` with measured figures from summaries and samples: peak memory (MiB), estimate error
    (MiB, %), unused request (MiB), utilization and SM figures (%), energy (kWh), GPU-hours held and used,
    OOM/rerun fields, the watchdog's reason, and notes naming what was not recorded (then None). ``util``:
    precomputed ``util_by_job``, else this job's samples are read here.
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
    return _with_figures(job, report, cfg, fig, facts.sum_known([s.gpu_s for s in summaries]), notes, diag)


def _summary_figures(summaries: List[store_summaries.JobSummary]) -> Tuple[Dict[str, Optional[float]],
                                                                         Dict[str, object]]:
    """The job's figures from its Epilog summaries (``facts.summary_figures``) and the diagnostics of the
    summary with the most samples.
    """
    fig, first = facts.summary_figures(summaries)
    if first is None:
        return fig, {}
    diag = {"tensor_mean": first.tensor_mean, "dram_mean": first.dram_mean,
            "smact_idle_pct": first.smact_idle_pct, "active_samples": first.active_samples,
            **{k: getattr(first, k) for k in CPU_FIELDS}}
    return fig, diag


def _sample_figures(job: JobView, report: Report, cfg: Config, by_node: Dict[str, List[int]],
                    summarized: bool,
                    fig: Dict[str, Optional[float]], notes: List[str]) -> None:
    """Fill ``fig`` from the GPU samples of the job's span on its GPUs (``by_node``: node -> GPU indexes)."""
    t1 = job.end_ts if job.end_ts is not None else job.start_ts + 1e9  # type: ignore[operator]
    held = gpus_held(job, cfg)
    share = (held / max(1, len(job.gpu_list))) if held else 1.0
    facts.sample_figures(report.node_dbs, job.job_id, (job.start_ts, t1),  # type: ignore[arg-type]
                         by_node, summarized, share, fig, notes)


def _with_figures(job: JobView, report: Report, cfg: Config, fig: Dict[str, Optional[float]],
                  used_s: Optional[float], notes: List[str], diag: Dict[str, object]) -> JobView:
    """``job`` with the figures, the estimate's error against the peak (MiB, %), the unused grant (MiB), GPU
    hours held and used, the OOM/rerun fields, the watchdog's reason and the notes."""
    peak, energy_j = fig["peak"], fig["energy_j"]
    req = requested_mib(job, cfg)
    err, err_pct = facts.estimate_error(peak, job.estimate_mib)
    unused = None
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
