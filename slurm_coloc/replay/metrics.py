"""Replay outcome from Slurm's job records and the sampler's GPU samples; pure but for ``sm_activity*``,
which read the samples of the replay's nodes from the node databases under ``cfg.state_dir``.

Definitions: makespan = last end - first submit (s); job completion time (JCT) of a task = end of its last run
(an OOM rerun included) - its submit time; a task is lost when no run of it COMPLETED; mean SM activity = mean
of the GPM SM-activity samples of every GPU over the replay window (coloc-sampler, %); energy = growth of
NVML's total-energy counter over the window, summed over GPUs (J); p95 = 95th percentile (nearest rank) over
completed tasks; slowdown of a task = its JCT / its time alone (the trace's scaled exclusive runtime,
``Task.work_s``).
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from slurm_coloc.comment import retry_tag_of
from slurm_coloc.config import Config
from slurm_coloc.slurm.parse import expand_hostlist

log = logging.getLogger("slurm_coloc.replay")


@dataclass(frozen=True)
class RunRecord:
    """One Slurm job of the replay: ``task`` index, times in Unix s (0 = unset), final ``state``."""

    job_id: int
    task: int
    submit_ts: float
    start_ts: float
    end_ts: float
    state: str
    retry_of: Optional[int] = None


@dataclass(frozen=True)
class ReplayMetrics:
    """What one replay measured (units in the names)."""

    mode: str
    tasks: int
    completed: int
    lost: int
    oom_retries: int
    makespan_s: Optional[float]
    mean_jct_s: Optional[float]
    mean_wait_s: Optional[float]
    mean_smact_pct: Optional[float]
    energy_j: Optional[float]
    p95_jct_s: Optional[float] = None
    p95_slowdown: Optional[float] = None
    max_slowdown: Optional[float] = None
    max_run_slowdown: Optional[float] = None
    smact_pct_per_gpu: Optional[Dict[str, Optional[float]]] = None

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


def retry_parent(comment: str) -> Optional[int]:
    """The original job id an OOM rerun's comment names (``oom-retry-of-<id>``), else None."""
    return retry_tag_of(comment)


def task_outcomes(runs: Sequence[RunRecord]) -> Dict[int, Dict[str, Any]]:
    """Task index -> ``{"submit_ts", "start_ts", "end_ts"`` (Unix s, 0.0 unset; start of the first run),
    ``"completed"`` (a run COMPLETED), ``"retries"`` (OOM reruns)``}``.
    """
    out: Dict[int, Dict[str, Any]] = {}
    for r in runs:
        t = out.setdefault(
            r.task,
            {"submit_ts": r.submit_ts, "end_ts": 0.0, "start_ts": 0.0, "completed": False, "retries": 0},
        )
        t["submit_ts"] = min(t["submit_ts"], r.submit_ts) if r.submit_ts else t["submit_ts"]
        t["end_ts"] = max(t["end_ts"], r.end_ts or 0.0)
        if r.retry_of is None and r.start_ts:
            t["start_ts"] = r.start_ts
        t["completed"] = t["completed"] or r.state == "COMPLETED"
        t["retries"] += 1 if r.retry_of is not None else 0
    return out


def mean_smact(samples: Sequence[Mapping[str, Any]]) -> Optional[float]:
    """Mean ``smact_pct`` (%) over samples that have one (None when GPM gave none)."""
    vals = [float(s["smact_pct"]) for s in samples if s.get("smact_pct") is not None]
    return statistics.fmean(vals) if vals else None


def mean_smact_per_gpu(samples: Sequence[Mapping[str, Any]]) -> Dict[str, Optional[float]]:
    """``node:gpu_index`` -> mean ``smact_pct`` (%; None without SM activity), sorted; idle GPUs show ~0."""
    by: Dict[str, List[Mapping[str, Any]]] = {}
    for s in samples:
        by.setdefault(f"{s.get('node', '')}:{s.get('gpu_index')}", []).append(s)
    return {k: mean_smact(v) for k, v in sorted(by.items())}


def parse_index_nodes(nodes: str) -> List[str]:
    """``n[1-2]`` / ``n1,n2`` -> node names; SlurmError: not a valid host list."""
    return expand_hostlist(nodes)


def sm_activity_per_gpu(cfg: Config, records: Sequence[object], t0: float,
                        t1: float) -> Tuple[Optional[float], Dict[str, Optional[float]]]:
    """(mean GPM SM activity %, ``mean_smact_per_gpu``) over [t0, t1] (Unix s) of ``records``' nodes' GPUs;
    None without samples. SlurmError: a bad host list."""
    from slurm_coloc.store.db import open_readonly
    from slurm_coloc.store.samples import load_gpu_samples

    nodes = sorted({n for r in records for n in parse_index_nodes(getattr(r, "nodes", ""))})
    samples: List[dict] = []
    for node in nodes:
        try:
            db = open_readonly(cfg.node_db_path(node))
            samples += [{**row, "node": node} for row in load_gpu_samples(db, t0, t1, list(range(64)))]
        except Exception as exc:  # unreadable db: metric NULL
            log.info("no samples for %s: %s", node, exc)
    return mean_smact(samples), mean_smact_per_gpu(samples)


def sm_activity(cfg: Config, records: Sequence[object], t0: float, t1: float) -> Optional[float]:
    """The mean of ``sm_activity_per_gpu``."""
    return sm_activity_per_gpu(cfg, records, t0, t1)[0]


def energy_growth_j(
    start: Mapping[int, Optional[float]], end: Mapping[int, Optional[float]]
) -> Optional[float]:
    """Sum over GPUs of ``end - start`` energy counters (J); None: no GPU, differing GPUs, a missing reading.
    """
    if not start or set(start) != set(end):
        return None
    total = 0.0
    for g in start:
        s, e = start[g], end[g]
        if s is None or e is None:
            return None
        total += float(e) - float(s)
    return total


def p95(values: Sequence[float]) -> Optional[float]:
    """95th percentile by nearest rank, in the values' unit (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, -(-95 * len(ordered) // 100) - 1)]


def summarize(
    mode: str, n_tasks: int, runs: Sequence[RunRecord], smact: Optional[float], energy_j: Optional[float],
    alone_s: Optional[Mapping[int, float]] = None, smact_per_gpu: Optional[Dict[str, Optional[float]]] = None,
) -> ReplayMetrics:
    """Fold one replay's runs into ``ReplayMetrics`` (module docstring has the definitions); a figure with
    nothing to compute it from is None.

    ``n_tasks``: tasks submitted (one with no completed run is lost); ``smact`` in %, ``energy_j`` in J;
    ``alone_s``: task index -> its time alone (s), for the slowdowns (JCT / alone; run slowdown = (end - start
    of its first run) / alone), tasks without one left out.
    """
    tasks = task_outcomes(runs)
    done = [t for t in tasks.values() if t["completed"] and t["end_ts"]]
    submits = [t["submit_ts"] for t in tasks.values() if t["submit_ts"]]
    ends = [t["end_ts"] for t in done]
    waits = [t["start_ts"] - t["submit_ts"] for t in tasks.values() if t["start_ts"] and t["submit_ts"]]
    slow = [(t["end_ts"] - t["submit_ts"]) / alone_s[k] for k, t in tasks.items()
            if t["completed"] and t["end_ts"] and alone_s and alone_s.get(k)]
    run_slow = [(t["end_ts"] - t["start_ts"]) / alone_s[k] for k, t in tasks.items()
                if t["completed"] and t["end_ts"] and t["start_ts"] and alone_s and alone_s.get(k)]
    return ReplayMetrics(
        mode=mode,
        tasks=n_tasks,
        completed=len(done),
        lost=n_tasks - len(done),
        oom_retries=sum(t["retries"] for t in tasks.values()),
        makespan_s=(max(ends) - min(submits)) if ends and submits else None,
        mean_jct_s=statistics.fmean(t["end_ts"] - t["submit_ts"] for t in done) if done else None,
        mean_wait_s=statistics.fmean(waits) if waits else None,
        mean_smact_pct=smact,
        energy_j=energy_j,
        p95_jct_s=p95([t["end_ts"] - t["submit_ts"] for t in done]),
        p95_slowdown=p95(slow),
        max_slowdown=max(slow) if slow else None,
        max_run_slowdown=max(run_slow) if run_slow else None,
        smact_pct_per_gpu=smact_per_gpu,
    )


def compare(exclusive: Mapping[str, Any], coloc: Mapping[str, Any]) -> Dict[str, Optional[float]]:
    """``<key>_change_pct``: relative change coloc vs exclusive (%, negative = lower) of makespan, mean and
    p95 JCT, p95 and max slowdown, SM activity and energy, from two ``ReplayMetrics.as_dict()``; None where
    either side lacks the figure or exclusive's is 0.
    """
    out: Dict[str, Optional[float]] = {}
    for key in ("makespan_s", "mean_jct_s", "p95_jct_s", "p95_slowdown", "max_slowdown", "mean_smact_pct",
                "energy_j"):
        a, b = exclusive.get(key), coloc.get(key)
        out[f"{key}_change_pct"] = (100.0 * (b - a) / a) if a and b is not None else None
    return out


def runs_from_records(records: Sequence[Any], task_of_job: Mapping[int, int]) -> List[RunRecord]:
    """``RunRecord`` per Slurm record of a replay job (``task_of_job``: job id -> task index) or an OOM rerun
    of one (``oom-retry-of-<id>``), in record order; others ignored. Times in Unix s, 0 where unset.
    """
    out: List[RunRecord] = []
    for r in records:
        parent = retry_parent(r.comment)
        task = task_of_job.get(r.job_id, task_of_job.get(parent) if parent is not None else None)
        if task is None:
            continue
        out.append(
            RunRecord(
                job_id=r.job_id,
                task=task,
                submit_ts=float(r.submit_ts or 0),
                start_ts=float(r.start_ts or 0),
                end_ts=float(r.end_ts or 0),
                state=r.state,
                retry_of=parent if r.job_id not in task_of_job else None,
            )
        )
    return out
