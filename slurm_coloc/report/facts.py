"""A job's measured facts from the node databases (no judgement): what it reserved and held, its peak memory,
utilization, SM activity/occupancy, energy and the watchdog's reason, from the node Epilog's job summaries
(``store/summaries.py``) and the sampler's tables (``store/samples.py``, ``store/oom.py``).

Light on purpose: it imports only ``store/`` and ``units``, so the node Epilog (root, bounded time) can
compute the AdminComment figures (hooks/figures.py) without loading the report pipeline (``summarize``,
``usage``, ``findings``, ``diagnose``, ``render``). ``report/usage.py`` ``add_usage`` fills a ``JobView`` from
the same functions, so coloc-report and the AdminComment agree.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from sqlite_utils import Database

from slurm_coloc.store import oom as store_oom
from slurm_coloc.store import report_queries as rq
from slurm_coloc.store import summaries as store_summaries
from slurm_coloc.units import format_mib

MIB_PER_GIB = 1024
FIGURES = ("peak", "util_mean", "smact_mean", "smact_p95", "smocc_mean", "smocc_p95", "energy_j")
"""The keys of a figures dict: peak MiB, percentages, energy J (None: not recorded)."""


def requested_mib(shards: Optional[int], share_mode: Optional[str], n_gpus: int,
                  gpu_mem_gib: float) -> Optional[float]:
    """GPU memory the allocation reserved (MiB): shards x 1024, or whole GPUs x ``gpu_mem_gib`` x 1024; None
    for a job holding neither (``n_gpus``: the GPUs recorded for it)."""
    if shards:
        return float(shards * MIB_PER_GIB)
    if share_mode == "gpu" and n_gpus:
        return float(n_gpus * gpu_mem_gib * MIB_PER_GIB)
    return None


def gpus_held(shards: Optional[int], n_gpus: int, gpu_mem_gib: float) -> Optional[float]:
    """GPUs the allocation holds: shards / ``gpu_mem_gib`` (at most 1 per GPU listed) for a shard job, else
    the number of GPUs; None for a job with neither."""
    if shards:
        return min(1.0, shards / gpu_mem_gib) * max(1, n_gpus)
    return float(n_gpus) if n_gpus else None


def watchdog_reason(node_dbs: Mapping[str, Database], job_id: int, nodes: Iterable[str]) -> Optional[str]:
    """Why the sampler's watchdog stopped (or recorded) the job, in words, from the ``watchdog_events`` of its
    ``nodes`` (``"stopped: over its grant (7,778 of 2,048 MiB) on n1 GPU 0"``); None: no event."""
    for node in sorted(set(nodes)):
        db = node_dbs.get(node)
        events = store_oom.load_events(db, job_id) if db is not None else []
        if events:
            ev = events[0]
            verb = "stopped" if ev.action == "stop" else "flagged"
            what = (f"over its grant ({format_mib(ev.used_mib)} of {format_mib(ev.grant_mib)})"
                    if ev.reason == "over-grant" else "a CUDA process outside its MPS server")
            return f"{verb}: {what} on {ev.node} GPU {ev.gpu_index}"
    return None


def sum_known(xs: Sequence[Optional[float]]) -> Optional[float]:
    """The sum of the known values of ``xs``; None when none is known."""
    vals = [x for x in xs if x is not None]
    return sum(vals) if vals else None


def summary_figures(summaries: List[store_summaries.JobSummary]
                    ) -> Tuple[Dict[str, Optional[float]], Optional[store_summaries.JobSummary]]:
    """The job's figures (``FIGURES``) from its Epilog summaries (those with samples): the peak of all, the
    energy summed, the SM figures from the summary with the most samples, which is returned too (its
    diagnostics; None without summaries)."""
    fig: Dict[str, Optional[float]] = dict.fromkeys(FIGURES)
    fig["peak"] = max((s.peak_mem_mib for s in summaries if s.peak_mem_mib is not None), default=None)
    fig["energy_j"] = sum_known([s.energy_j for s in summaries])
    if not summaries:
        return fig, None
    first = max(summaries, key=lambda s: s.n_samples)
    fig.update(smact_mean=first.smact_mean, smact_p95=first.smact_p95, smocc_mean=first.smocc_mean,
               smocc_p95=first.smocc_p95)
    return fig, first


def sample_figures(node_dbs: Mapping[str, Database], job_id: int, span: Tuple[float, float],
                   by_node: Dict[str, List[int]], summarized: bool, share: float,
                   fig: Dict[str, Optional[float]], notes: List[str]) -> None:
    """Fill ``fig`` from the GPU samples of the job's ``span`` (start, end; epoch s) on its GPUs (``by_node``:
    node -> GPU indexes): the utilization always, the peak when no summary gave one and, without any summary
    (``summarized`` false), the SM figures and ``share`` (GPUs held per GPU listed) of the GPUs' energy. Adds
    a note saying which."""
    stats = []
    for node, idxs in by_node.items():
        db = node_dbs.get(node)
        if db is not None:
            stats.extend(rq.gpu_window_stats(db, span[0], span[1], idxs))
            if fig["peak"] is None:
                fig["peak"] = rq.job_peak_mem_mib(db, job_id)
    if not stats:
        notes.append("no samples recorded for this job")
        return
    w = sum(s.covered_s for s in stats) or 1.0
    fig["util_mean"] = sum_known([(s.util_mean or 0) * s.covered_s / w for s in stats
                                  if s.util_mean is not None])
    if summarized:
        return
    fig["smact_mean"] = sum_known([(s.smact_mean or 0) * s.covered_s / w for s in stats
                                   if s.smact_mean is not None])
    fig["smocc_mean"] = sum_known([(s.smocc_mean or 0) * s.covered_s / w for s in stats
                                   if s.smocc_mean is not None])
    fig["smact_p95"] = max((s.smact_p95 for s in stats if s.smact_p95 is not None), default=None)
    fig["smocc_p95"] = max((s.smocc_p95 for s in stats if s.smocc_p95 is not None), default=None)
    e = sum_known([s.energy_j for s in stats])
    fig["energy_j"] = None if e is None else e * share
    notes.append("no Epilog summary: usage read from the GPU samples of its span (energy by share)")


def estimate_error(peak: Optional[float], estimate_mib: Optional[float]) -> Tuple[Optional[float],
                                                                                  Optional[float]]:
    """``(estimate - peak in MiB, that relative to the peak in %)``; None where either is unknown (the % also
    for a zero peak)."""
    if peak is None or estimate_mib is None:
        return None, None
    err = float(estimate_mib) - peak
    return err, (100.0 * err / peak if peak > 0 else None)
