"""The ``throughput`` placement policy: pack GPUs as far as a per-job slowdown bound allows. Pure.

Model (processor sharing, fitted on measured co-runs): while jobs compute together on one GPU under MPS, each
progresses at ``min(1, capacity / L)`` of its speed alone, where ``L`` is the sum of their SM activities *alone*
(fractions, GPM SMACT measured by the sampler while each ran alone) and ``capacity`` is fitted on measured piles
(``benchmarks/placement_share_fit.py`` over ``benchmarks/device/results/h100-placement2/``; the fitted value and
its error are in ``calibration.json`` and docs/benchmarks.md). So the slowdown of every job computing on the GPU
is ``max(1, L / capacity)``; a job's start-up (Slurm to its first step: imports, CUDA and model set-up) leaves
the GPU to the others. The model does not call a GPU full at SMACT 0.8 or 1.0: a GPU takes jobs until the
predicted slowdown reaches the bound, so a site trades latency (bound 1.2) for throughput (bound 3).

A job that starts now begins computing after its start-up, so a tenant predicted to end before then does not
count against it: its room is used in the same round in which it is freed, not after it has ended (no idle gap).
A tenant never measured alone counts with its predicted activity (``Tenant.predicted``: the calibrated predictor
of ``intensity.py``), so one such tenant neither blocks a GPU nor hands it to memory-only packing. A candidate never
measured alone is judged by the saturation gate (``policy.choose_gpu``: live state, or memory where the sampler is
silent).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple, Union

from slurm_coloc.placement.policy import Activity, Decision, Gate, GpuState, choose_gpu, fresh

POLICIES = ("throughput", "gate")


@dataclass(frozen=True)
class Profile:
    """A job signature's measured behaviour alone: ``smact`` (fraction; None: never measured), whole run and
    start-up (s, from Slurm start to the first busy sample; None: not known)."""

    smact: Optional[float]
    run_s: Optional[float] = None
    startup_s: Optional[float] = None

    @property
    def work_s(self) -> Optional[float]:
        """Computing time alone (s): run minus start-up (None without a run time)."""
        if self.run_s is None:
            return None
        return max(0.0, self.run_s - (self.startup_s or 0.0))


@dataclass(frozen=True)
class Tenant:
    """A job on a GPU as the model sees it: its profile, when it started (Unix s, Slurm start or steering) and its
    predicted SM activity alone (fraction; used where the profile has no measured one)."""

    profile: Profile
    start_ts: float
    predicted: float = 0.5

    @property
    def smact(self) -> float:
        """Measured SM activity alone, else the predicted one."""
        return self.profile.smact if self.profile.smact is not None else self.predicted


def slowdown(load: float, capacity: float) -> float:
    """Predicted slowdown of each job computing on a GPU whose summed SM activity alone is ``load`` (>= 1)."""
    return max(1.0, load / capacity) if capacity > 0 else float("inf")


def predicted_end(t: Tenant, sigma: float) -> Optional[float]:
    """When tenant ``t`` is predicted to end (Unix s): start + start-up + work alone x ``sigma``; None unknown."""
    w = t.profile.work_s
    if w is None:
        return None
    return t.start_ts + (t.profile.startup_s or 0.0) + w * sigma


def load_at_start(tenants: Sequence[Tenant], capacity: float, now: float, startup_s: float) -> float:
    """Summed SM activity alone (``Tenant.smact``) of the tenants still computing when a job placed ``now`` with
    ``startup_s`` of start-up begins: a tenant predicted to end in ``(now, now + startup_s]`` is left out; one past
    its predicted end (it overran) or of unknown run time counts."""
    sigma = slowdown(sum(t.smact for t in tenants), capacity)
    total = 0.0
    for t in tenants:
        end = predicted_end(t, sigma)
        if end is not None and now < end <= now + startup_s:
            continue
        total += t.smact
    return total


def choose_gpu_bounded(gpus: Sequence[GpuState], tenants: Sequence[Sequence[Tenant]], shards: int, job: Profile,
                       demand: Activity, gate: Gate, capacity: Union[float, Callable[[str], float]],
                       max_slowdown: float, now: float, max_age_s: float = 60.0) -> Decision:
    """Pick a GPU for a job under the slowdown bound.

    Per GPU with ``shards`` free: no tenant -> qualifies (``empty-gpu``); the job measured alone -> qualifies when
    ``slowdown(load_at_start + job.smact) <= max_slowdown`` (``slowdown-model``; tenants never measured count with
    their predicted activity); a job never measured -> the gate decides for each GPU alone (``policy.choose_gpu``:
    ``utilization``, or ``memory-only`` where the live state is stale). Among those that
    qualify, modelled and empty GPUs before gate-judged ones, gate-judged before memory-only ones; then the
    lowest predicted slowdown (spreads across GPUs and nodes), fewest tenants, most free shards, node, index.

    Args:
        gpus, tenants: every GPU the job may use and, index for index, the jobs holding it.
        shards: the job's shard request (>= 1); job: its profile; demand: its predicted activity (for the gate).
        capacity: the model's fitted capacity (summed SMACT alone), or a function of the GPU's model name
            (``GpuState.model``) giving it (``intensity.Calibration.capacity_for``); max_slowdown: the bound (>= 1).
        now: Unix s; max_age_s: live state older than this is stale (gate only).

    Returns:
        A ``Decision`` (``predicted``'s SMACT = the GPU's load with the job for the model); not placed with a
        reason when no GPU qualifies.

    Raises:
        ValueError: shards < 1, len(tenants) != len(gpus), capacity <= 0 or max_slowdown < 1.
    """
    cap_of = capacity if callable(capacity) else (lambda _model, c=float(capacity): c)
    if shards < 1 or len(tenants) != len(gpus) or max_slowdown < 1 or any(cap_of(g.model) <= 0 for g in gpus):
        raise ValueError("choose_gpu_bounded: need shards >= 1, one tenant list per GPU, capacity > 0, bound >= 1")
    options: List[Tuple[Tuple, GpuState, str, Optional[Activity], str]] = []
    blocked: List[str] = []
    most = max((g.shards_free for g in gpus), default=0)
    for g, ts in zip(gpus, tenants):
        if g.shards_free < shards:
            continue
        capacity = cap_of(g.model)
        if g.tenants == 0 and g.shards_used == 0:
            pred = slowdown(job.smact or 0.0, capacity)
            options.append(((0, pred, 0, -g.shards_free, g.node, g.index), g, "empty-gpu",
                            Activity(job.smact or 0.0), f"slowdown {pred:.2f}"))
        elif job.smact is not None:
            load = load_at_start(ts, capacity, now, job.startup_s or 0.0)
            pred = slowdown(load + job.smact, capacity)
            if pred > max_slowdown:
                blocked.append(f"{g.node}/gpu{g.index} slowdown {pred:.2f} > {max_slowdown:g}")
                continue
            options.append(((0, pred, g.tenants, -g.shards_free, g.node, g.index), g, "slowdown-model",
                            Activity(min(load + job.smact, 9.99)), f"slowdown {pred:.2f}"))
        else:
            d = choose_gpu([g], shards, demand, gate, "spread", max_age_s)
            if not d.placed:
                blocked.append(d.reason.replace("every GPU with room is saturated: ", ""))
                continue
            rank = 2 if d.basis == "memory-only" else 1
            load_g = d.predicted.smact if d.predicted is not None else 0.0
            why = d.reason.split("(", 1)[-1].rstrip(")")
            options.append(((rank, load_g, g.tenants, -g.shards_free, g.node, g.index), g, d.basis, d.predicted,
                            why[len(d.basis) + 2:] if why.startswith(d.basis + ", ") else why))
    if not options:
        if not any(g.shards_free >= shards for g in gpus):
            return Decision(None, None, f"no GPU has {shards} free shards (most free: {most})")
        return Decision(None, None, "every GPU with room is at its bound: " + "; ".join(blocked[:4]))
    options.sort(key=lambda o: o[0])
    _, best, basis, predicted, why = options[0]
    detail = f", {why}" if why and why != basis else ""
    return Decision(best.node, best.index, f"{best.node}/gpu{best.index} ({basis}{detail})", basis, predicted)


def memory_only(gpus: Sequence[GpuState], shards: int) -> Decision:
    """A GPU by memory alone: the one with fewest tenants among those with ``shards`` free, then most free shards
    (spreads), node, index; not placed when none has room."""
    fits = sorted((g for g in gpus if g.shards_free >= shards),
                  key=lambda g: (g.tenants, -g.shards_free, g.node, g.index))
    if not fits:
        most = max((g.shards_free for g in gpus), default=0)
        return Decision(None, None, f"no GPU has {shards} free shards (most free: {most})")
    g = fits[0]
    return Decision(g.node, g.index, f"{g.node}/gpu{g.index} (memory-only)", "memory-only", None)


def silent_gpus(gpus: Sequence[GpuState], max_age_s: float) -> List[Tuple[str, int]]:
    """``(node, index)`` of GPUs whose sampler gave no fresh state (missing or older than ``max_age_s``)."""
    return [g.key for g in gpus if not fresh(g, max_age_s)]
