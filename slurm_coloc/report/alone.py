"""Collocation figures of coloc-report (pure, over the report's job views and sample aggregates).

Per job: whether it shared its GPU (another job's run overlapped it on the same node and GPU index), its
runtime alone from history (median runtime of the other COMPLETED runs of the same signature that had their
GPU alone; signature = ``placement.intensity.signature`` of the job's coloc comment: model, kwargs, input,
batch, precision, optimizer, or the script's SHA-256), and ``rate_vs_alone`` = alone runtime / this runtime
(1.0: as fast as alone; 0.5: half speed). The rate assumes runs of one signature do the same work (same epochs
or steps); a run that did less or more work shows as faster or slower.
Per GPU: the share of sampled time it was saturated under the placement gate (``placement_*_gate``, CARMA:
SMACT >= 0.8 and (SMOCC >= 0.45 or DRAMA >= 0.4)).
"""
from __future__ import annotations

import statistics
from typing import Any, Dict, List, Optional, Protocol, Sequence, Tuple

from slurm_coloc.config import Config


class _Job(Protocol):
    """What these functions need of a job (``JobView`` has it); other fields are read with ``getattr``."""

    @property
    def job_id(self) -> int: ...


def shared_jobs(jobs: Sequence[_Job]) -> Dict[int, bool]:
    """job id -> whether another job's span overlapped it on one of its GPUs (jobs with a start and a GPU
    only).

    Args:
        jobs: ``JobView``-like objects (``job_id``, ``start_ts`` and ``end_ts`` in Unix s, ``end_ts`` None:
            running, ``gpu_list``: ``(node, GPU index)`` pairs).

    Returns:
        job id -> shared, for every job with a start and a GPU.
    """
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


def alone_rates(jobs: Sequence[_Job]) -> Dict[int, Dict[str, Any]]:
    """job id -> ``{"shared_gpu", "alone_runtime_s", "rate_vs_alone"}`` (module docstring). Pure.

    Args:
        jobs: ``JobView``s with ``signature``, ``state``, ``runtime_s`` (s) and what ``shared_jobs`` reads;
            every recorded job, as the history the alone runtimes come from.

    Returns:
        For every job: ``shared_gpu`` (bool, None without a start or GPU), ``alone_runtime_s`` (s, None
        without history), ``rate_vs_alone`` (ratio to 3 decimals, None unless COMPLETED with history).
    """
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
        rate = alone / rt if alone and rt and getattr(j, "state", None) == "COMPLETED" else None
        out[j.job_id] = {"shared_gpu": shared.get(j.job_id), "alone_runtime_s": alone,
                         "rate_vs_alone": round(rate, 3) if rate is not None else None}
    return out


def gate_pct(cfg: Config) -> Tuple[float, float, float]:
    """The placement gate in percent: (SMACT, SMOCC, DRAMA).

    Args:
        cfg: ``placement_smact_gate``, ``placement_smocc_gate``, ``placement_drama_gate`` (fractions).

    Returns:
        (SMACT %, SMOCC %, DRAMA %).
    """
    return (100.0 * cfg.placement_smact_gate, 100.0 * cfg.placement_smocc_gate,
            100.0 * cfg.placement_drama_gate)


def saturated_share(saturated_s: Optional[float], sampled_s: Optional[float]) -> Optional[float]:
    """Percent of sampled time saturated (None without sampled time).

    Args:
        saturated_s: seconds saturated, or None.
        sampled_s: seconds sampled, or None.

    Returns:
        %, to one decimal, or None.
    """
    return None if not sampled_s or saturated_s is None else round(100.0 * saturated_s / sampled_s, 1)
