"""Per-job figures of coloc-report beyond the job's record (pure data): usage, sample series and collocation.

Usage (``add_usage``) from the node Epilog's job summaries (``store/summaries.py``) and the sampler's tables
(``store/samples.py``): request and GPUs held, peak memory, estimate error, utilization, SM
activity/occupancy, energy, GPU-hours, the OOM record and the watchdog's reason; what was not recorded stays
None and ``JobView.notes`` says so. The figures come from ``report/facts.py``, which the node Epilog also uses
for the AdminComment. Series (``job_series``): a job's GPM rates and process memory over its span, folded into
at most ``MAX_SERIES_POINTS`` time buckets per GPU (``coloc-report advise``, the diagnosis where the Epilog
summary lacks a figure, ``report/plot.py``).

Collocation: whether a job shared its GPU (another job's run overlapped it on the same node and GPU index),
its runtime alone (the median runtime of the other COMPLETED runs of the same signature that had their GPU
alone; for a shared run without such runs, its own time alone learned from its GPU's co-run mixes,
``coruns.learn``, as coloc-placer learns it: ``learned_alone_s``; signature =
``placement.intensity.signature`` of the job's coloc comment: model, kwargs, input, batch, precision,
optimizer, or the script's SHA-256), and ``rate_vs_alone`` = alone runtime / this runtime (1.0: as fast as
alone; 0.5: half speed); ``alone_source`` says which. The rate assumes runs of one signature do the same work
(same epochs or steps). Per GPU: the share of sampled time it was saturated under the placement gate
(``placement_*_gate``, CARMA: SMACT >= 0.8 and (SMOCC >= 0.45 or DRAMA >= 0.4)).
"""
from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple

from sqlite_utils import Database

from slurm_coloc import coruns
from slurm_coloc.config import Config
from slurm_coloc.report import facts
from slurm_coloc.report.summarize import CPU_FIELDS, JobView, Report
from slurm_coloc.store import placement as store_placement
from slurm_coloc.store import report_queries as rq
from slurm_coloc.store import samples as store_samples
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
    epoch s), None where no sample covers it; batched per node database."""
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
    of 2,048 MiB) on n1 GPU 0'``; None: no event."""
    nodes = {n for n, _ in job.gpu_list} | {n for n in job.nodes.split(",") if n}
    return facts.watchdog_reason(report.node_dbs, job.job_id, nodes)


def add_usage(job: JobView, report: Report, cfg: Config, util: Optional[Dict[int, Optional[float]]] = None
              ) -> JobView:
    """A copy of ``job`` with measured figures from summaries and samples: peak memory (MiB), estimate error
    (MiB, %), unused request (MiB), utilization and SM figures (%), energy (kWh), GPU-hours held and used,
    OOM/rerun fields, the watchdog's reason, and notes naming what was not recorded (then None). ``util``:
    precomputed ``util_by_job``, else this job's samples are read here."""
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
    summary with the most samples."""
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
    """``job`` with the figures, estimate error, unused grant, GPU-hours, OOM/rerun fields, watchdog reason,
    notes."""
    peak, energy_j = fig["peak"], fig["energy_j"]
    req = requested_mib(job, cfg)
    err, err_pct = facts.estimate_error(peak, job.estimate_mib)
    unused = None if peak is None or req is None else max(0.0, req - peak)
    held = gpus_held(job, cfg)
    gpu_hours = None if held is None or job.runtime_s is None else held * job.runtime_s / 3600.0
    o = report.oom_by_job.get(job.job_id)
    retry_outcome = None if o is None else (
        o.retry_state or (f"retry {o.retry_status}" if o.retry_status else None))
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


# a longer job's samples are folded into this many buckets (mean of rates, max of memory)
MAX_SERIES_POINTS = 2000
SERIES_KEYS = ("smact_pct", "smocc_pct", "tensor_pct", "dram_bw_pct")


def job_series(report: Report, job: JobView, now: float) -> List[Dict[str, object]]:
    """The job's samples over its span (``now``, Unix s, ends a running one), sorted by ``ts`` across GPUs:
    ``{ts, node, gpu, smact_pct, smocc_pct, tensor_pct, dram_bw_pct}`` (%) and ``job_mem_mib`` (its processes'
    memory on that GPU, MiB; None with none); above ``MAX_SERIES_POINTS`` per GPU folded into time buckets."""
    if job.start_ts is None:
        return []
    t1 = job.end_ts if job.end_ts is not None else now
    out: List[Dict[str, object]] = []
    for node, gpu in job.gpu_list:
        db = report.node_dbs.get(node)
        if db is None:
            continue
        mem: Dict[Tuple[float, int], float] = {}
        for p in store_samples.load_job_proc_samples(db, job.job_id):
            if p.get("used_mem_mib") is not None:
                key = (float(p["ts"]), int(p["gpu_index"]))
                mem[key] = mem.get(key, 0.0) + float(p["used_mem_mib"])
        rows = [{"ts": float(r["ts"]), "node": node, "gpu": gpu, **{k: r.get(k) for k in SERIES_KEYS},
                 "job_mem_mib": mem.get((float(r["ts"]), gpu))}
                for r in store_samples.load_gpu_samples(db, job.start_ts, t1, [gpu])]
        out.extend(_fold_series(rows, job.start_ts, t1))
    return sorted(out, key=lambda r: float(r["ts"]))  # type: ignore[arg-type]


def _fold_series(rows: List[Dict[str, object]], t0: float, t1: float) -> List[Dict[str, object]]:
    if len(rows) <= MAX_SERIES_POINTS:
        return rows
    width = max((t1 - t0) / MAX_SERIES_POINTS, 1e-3)
    buckets: Dict[int, List[Dict[str, object]]] = {}
    for r in rows:
        buckets.setdefault(int((float(r["ts"]) - t0) / width), []).append(r)  # type: ignore[arg-type]
    folded = []
    for _, rs in sorted(buckets.items()):
        row: Dict[str, object] = {"ts": rs[0]["ts"], "node": rs[0]["node"], "gpu": rs[0]["gpu"]}
        for k in SERIES_KEYS:
            vals = [float(r[k]) for r in rs if r.get(k) is not None]  # type: ignore[arg-type]
            row[k] = sum(vals) / len(vals) if vals else None
        mems = [float(r["job_mem_mib"])  # type: ignore[arg-type]
                for r in rs if r.get("job_mem_mib") is not None]
        row["job_mem_mib"] = max(mems) if mems else None
        folded.append(row)
    return folded


class _Job(Protocol):
    """What these functions need of a job (``JobView`` has it); other fields are read with ``getattr``."""

    @property
    def job_id(self) -> int: ...


def shared_jobs(jobs: Sequence[_Job]) -> Dict[int, bool]:
    """Job id -> whether another job's span (Unix s; ``end_ts`` None: running) overlapped it on one of its
    GPUs (``gpu_list``: ``(node, GPU index)``), for every job with a start and a GPU."""
    by_gpu: Dict[Tuple[str, int], List[Tuple[float, float, int]]] = {}
    for j in jobs:
        start = getattr(j, "start_ts", None)
        if start is None:
            continue
        end = getattr(j, "end_ts", None)
        for key in getattr(j, "gpu_list", []):
            by_gpu.setdefault(key, []).append((start, end if end is not None else float("inf"), j.job_id))
    out: Dict[int, bool] = {}
    for spans in by_gpu.values():
        spans.sort()
        for i, (s, e, job) in enumerate(spans):
            out.setdefault(job, False)
            for s2, e2, job2 in spans[i + 1:]:
                if s2 >= e:
                    break
                if job2 != job and e2 > s:
                    out[job] = out[job2] = True
    return out


def learned_alone_s(jobs: Sequence[_Job], node_dbs: Mapping[str, Database], cfg: Config) -> Dict[int, float]:
    """job id -> time alone (s) learned from its shared run (``coruns.learn`` over the GPU's samples and every
    run that shared it), for the COMPLETED single-GPU jobs of ``jobs`` that shared their GPU. Never raises: a
    node database that cannot be read gives nothing."""
    ids = {j.job_id: j for j in jobs
           if getattr(j, "state", None) == "COMPLETED" and getattr(j, "signature", None)}
    capacity = coruns.capacity_reader(cfg.placement_calibration_path or None)
    out: Dict[int, float] = {}
    for node, db in node_dbs.items():
        try:
            gpus = store_placement.co_runs(db, ids)
        except Exception:  # a damaged database: no learned figure, never a failed report
            continue
        m = coruns.mixes(node, gpus,
                         lambda j: ((None, getattr(ids.get(j), "signature", None) or f"job:{j}"), 0.5))
        for run in m.learn(capacity):
            if run.shared and run.job_id in ids:
                out[run.job_id] = run.run_s
    return out


def alone_rates(jobs: Sequence[_Job],
                learned: Optional[Mapping[int, float]] = None) -> Dict[int, Dict[str, Any]]:
    """Job id -> ``{"shared_gpu", "alone_runtime_s", "rate_vs_alone", "alone_source"}`` (module docstring).

    ``jobs``: every recorded job, the history the alone runtimes come from; ``learned`` is used where the
    signature has no other run alone. ``shared_gpu`` None without a start or GPU; ``alone_runtime_s`` (s) None
    without history; ``rate_vs_alone`` to 3 decimals, None unless COMPLETED with history; ``alone_source``:
    ``alone``, ``learned`` or None."""
    shared = shared_jobs(jobs)
    alone_by_sig: Dict[str, List[Tuple[int, float]]] = {}
    for j in jobs:
        sig, rt = getattr(j, "signature", None), getattr(j, "runtime_s", None)
        if sig and rt and getattr(j, "state", None) == "COMPLETED" and shared.get(j.job_id) is False:
            alone_by_sig.setdefault(sig, []).append((j.job_id, rt))
    out: Dict[int, Dict[str, Any]] = {}
    for j in jobs:
        sig, rt = getattr(j, "signature", None), getattr(j, "runtime_s", None)
        others = [t for k, t in alone_by_sig.get(sig, []) if k != j.job_id] if sig else []
        alone = statistics.median(others) if others else None
        source = "alone" if alone else None
        if alone is None and learned and learned.get(j.job_id):
            alone, source = learned[j.job_id], "learned"
        rate = alone / rt if alone and rt and getattr(j, "state", None) == "COMPLETED" else None
        out[j.job_id] = {"shared_gpu": shared.get(j.job_id), "alone_runtime_s": alone,
                         "rate_vs_alone": round(rate, 3) if rate is not None else None,
                         "alone_source": source}
    return out


def saturated_share(saturated_s: Optional[float], sampled_s: Optional[float]) -> Optional[float]:
    """Percent of sampled time saturated, to one decimal (None without sampled time)."""
    return None if not sampled_s or saturated_s is None else round(100.0 * saturated_s / sampled_s, 1)
