"""Collocation figures of coloc-report (over the report's job views and sample aggregates).

Per job: whether it shared its GPU (another job's run overlapped it on the same node and GPU index), its
runtime alone (the median runtime of the other COMPLETED runs of the same signature that had their GPU alone;
for a shared run without such runs, its own time alone learned from its GPU's co-run mixes,
``coruns.learn``, as coloc-placer learns it: ``learned_alone_s``; signature =
``placement.intensity.signature`` of the job's coloc comment: model, kwargs, input, batch, precision,
optimizer, or the script's SHA-256), and ``rate_vs_alone`` = alone runtime / this runtime (1.0: as fast as
alone; 0.5: half speed); ``alone_source`` says which. The rate assumes runs of one signature do the same
work (same epochs or steps); a run that did less or more work shows as faster or slower.
Per GPU: the share of sampled time it was saturated under the placement gate (``placement_*_gate``, CARMA:
SMACT >= 0.8 and (SMOCC >= 0.45 or DRAMA >= 0.4)).
"""
from __future__ import annotations

import statistics
from typing import Any, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple

from sqlite_utils import Database

from slurm_coloc import coruns
from slurm_coloc.config import Config
from slurm_coloc.store import placement as store_placement


class _Job(Protocol):
    """What these functions need of a job (``JobView`` has it); other fields are read with ``getattr``."""

    @property
    def job_id(self) -> int: ...


def shared_jobs(jobs: Sequence[_Job]) -> Dict[int, bool]:
    """Job id -> whether another job's span (Unix s; ``end_ts`` None: running) overlapped it on one of its
    GPUs (``gpu_list``: ``(node, GPU index)``), for every job with a start and a GPU.
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
    Pure.

    ``jobs``: every recorded job, the history the alone runtimes come from; ``learned`` (``learned_alone_s``)
    is used where the signature has no other run alone. ``shared_gpu`` None without a start or GPU;
    ``alone_runtime_s`` (s) None without history; ``rate_vs_alone`` to 3 decimals, None unless COMPLETED with
    history; ``alone_source``: ``alone`` (other runs alone), ``learned`` (its shared run) or None.
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
        source = "alone" if alone else None
        if alone is None and learned and learned.get(j.job_id):
            alone, source = learned[j.job_id], "learned"
        rate = alone / rt if alone and rt and getattr(j, "state", None) == "COMPLETED" else None
        out[j.job_id] = {"shared_gpu": shared.get(j.job_id), "alone_runtime_s": alone,
                         "rate_vs_alone": round(rate, 3) if rate is not None else None,
                         "alone_source": source}
    return out


def gate_pct(cfg: Config) -> Tuple[float, float, float]:
    """The placement gate (``placement_*_gate`` fractions) in percent: (SMACT, SMOCC, DRAMA)."""
    return (100.0 * cfg.placement_smact_gate, 100.0 * cfg.placement_smocc_gate,
            100.0 * cfg.placement_drama_gate)


def saturated_share(saturated_s: Optional[float], sampled_s: Optional[float]) -> Optional[float]:
    """Percent of sampled time saturated, to one decimal (None without sampled time)."""
    return None if not sampled_s or saturated_s is None else round(100.0 * saturated_s / sampled_s, 1)
