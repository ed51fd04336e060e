"""The ``throughput`` placement policy (pure): pack GPUs as far as a per-job slowdown bound allows.

Model (processor sharing): jobs computing together on one GPU under MPS each progress at ``min(1, capacity /
L)`` of their speed alone, L = the sum of their SM activities alone (fractions, GPM SMACT sampled while each
ran alone); ``capacity`` is fitted on measured piles (``benchmarks/placement_share_fit.py`` over
``benchmarks/device/results/h100-placement-passes/``; value and error in ``calibration.json`` and
docs/benchmarks.md). Every job computing there slows by ``max(1, L / capacity)``, and a GPU takes jobs until
that reaches the bound (latency at bound 1.2, throughput at 3). A job's start-up (Slurm to its first step)
leaves the GPU to the others, so a tenant predicted to end before a new job computes does not count against
it. A tenant or candidate never measured alone counts with its predicted activity (``intensity.py``), the
candidate's floored at the calibration's ``unmeasured_smact_floor`` (the predictor's error is large), until
its shared runs teach it (``coruns.py``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from slurm_coloc.placement.policies import (
    Activity,
    Decision,
    Evidence,
    GpuState,
    Hold,
    Policy,
    Profile,
    Tenant,
    memory_only,
    no_room,
)

Key = Tuple[str, int]  # a GPU: (node, index)


def slowdown(load: float, capacity: float) -> float:
    """``max(1, load / capacity)`` (``load``: summed SM activity alone, fraction); inf when capacity <= 0."""
    return max(1.0, load / capacity) if capacity > 0 else float("inf")


def predicted_ends(tenants: Sequence[Tenant], capacity: float) -> List[Optional[float]]:
    """Each tenant's predicted end (Unix s; None: run time not known), the model played forward: tenant k
    computes from ``start_ts + startup_s`` for ``work_s`` alone, at ``capacity / L`` while the summed
    ``smact`` L of those computing exceeds ``capacity``; one that left (``end_ts``) is load until then.
    O(n^2)."""
    begin = [t.start_ts + (t.profile.startup_s or 0.0) for t in tenants]
    left = [t.profile.work_s if t.end_ts is None else None for t in tenants]
    ends: List[Optional[float]] = [t.end_ts for t in tenants]
    pending = {k for k, w in enumerate(left) if w is not None}
    clock = min(begin, default=0.0)
    while pending:
        active = [k for k, e in enumerate(ends) if begin[k] <= clock and (e is None or e > clock)]
        load = sum(tenants[k].smact for k in active)
        rate = min(1.0, capacity / load) if load > 0 else 1.0
        finishing = [(left[k] or 0.0) / rate for k in active if k in pending]
        events = [b - clock for b in begin if b > clock] + [
            t.end_ts - clock for t in tenants if t.end_ts is not None and t.end_ts > clock]
        step = min(finishing + events)
        for k in active:
            if k in pending:
                left[k] = (left[k] or 0.0) - step * rate
                if (left[k] or 0.0) <= 1e-9:
                    ends[k] = clock + step
                    pending.discard(k)
        clock += step
    return ends


DEPARTED_KEPT = 32
"""At most this many tenants that left are kept per GPU (the most recent): ``predicted_ends`` is O(n^2),
and a long-running tenant would otherwise keep every short job that passed beside it. Older ones are
forgotten, so the replay of a very long tenant's past can again run ahead."""


def track_departures(previous: Mapping[Key, Sequence[Tenant]], current: Mapping[Key, Sequence[Tenant]],
                     departed: Mapping[Key, Sequence[Tenant]], now: float) -> Dict[Key, List[Tenant]]:
    """Per GPU with a present tenant, the tenants that left it: ``departed``'s plus ``previous``' (by
    ``job_id``) missing from ``current`` (``end_ts`` = ``now``, Unix s), as ``kept_departures`` keeps them."""
    out: Dict[Key, List[Tenant]] = {}
    for key, present in current.items():
        if not present:
            continue
        here = {t.job_id for t in present if t.job_id is not None}
        gone = [replace(t, end_ts=now) for t in previous.get(key, ())
                if t.job_id is not None and t.job_id not in here and t.end_ts is None]
        kept = kept_departures(present, [*departed.get(key, ()), *gone])
        if kept:
            out[key] = kept
    return out


def kept_departures(present: Sequence[Tenant], departed: Sequence[Tenant]) -> List[Tenant]:
    """Of ``departed``, those that left after the earliest of ``present`` began computing (they shape its
    replay), the last ``DEPARTED_KEPT``, oldest departure first."""
    if not present:
        return []
    since = min(t.start_ts + (t.profile.startup_s or 0.0) for t in present)
    kept = [t for t in departed if t.end_ts is not None and t.end_ts > since]
    return sorted(kept, key=lambda t: t.end_ts or 0.0)[-DEPARTED_KEPT:]


END_SLACK = 0.1
"""A tenant counts as gone only when predicted to end this fraction of its work alone before the job
computes: the model runs ahead of the measured jobs (on the 2x H100 throughput passes, training took 1.16x
the model's time, median, given the company each job actually had; docs/benchmarks.md). In
``benchmarks/placement_sim.py`` (pile and pile + stream, H100 and H200 profiles, bound 2) the instantaneous
slowdown peaked at 2.2-2.9 without it and at 1.9-2.0 with 0.1, for 2-8 % more makespan
(docs/benchmarks.md)."""


def load_at_start(tenants: Sequence[Tenant], capacity: float, now: float, startup_s: float) -> float:
    """Summed SM activity alone (may exceed 1) of the tenants still computing when a job placed ``now`` (Unix
    s) begins after ``startup_s`` (s): one predicted to end before then with ``END_SLACK`` x its work alone to
    spare, or that has left, is not counted; one that overran or of unknown run time is."""
    total = 0.0
    for t, end in zip(tenants, predicted_ends(tenants, capacity)):
        if t.end_ts is not None:
            continue
        if end is not None and now < end and end + END_SLACK * (t.profile.work_s or 0.0) <= now + startup_s:
            continue
        total += t.smact
    return total


def bounded_slowdown(tenants: Sequence[Tenant], capacity: float, smact: float, now: float,
                     startup_s: float) -> float:
    """``slowdown`` once a job of SM activity alone ``smact`` placed ``now`` (Unix s) starts computing."""
    return slowdown(load_at_start(tenants, capacity, now, startup_s) + smact, capacity)


@dataclass(frozen=True)
class Judged:
    """One GPU as ``choose_gpu_bounded`` judges it (``key`` None: not qualified; ``why``: why not)."""

    key: Optional[Tuple]
    basis: str
    predicted: Optional[Activity]
    why: str


def _judge(g: GpuState, ts: Sequence[Tenant], job: Profile, demand: Activity, capacity: float,
           max_slowdown: float, now: float) -> Judged:
    measured = job.smact is not None
    smact = job.smact if job.smact is not None else demand.smact
    load = load_at_start(ts, capacity, now, job.startup_s or 0.0) + smact
    pred = slowdown(load, capacity)
    if g.tenants == 0 and g.shards_used == 0:
        return Judged((0, pred, 0, -g.shards_free, g.node, g.index), "empty-gpu", Activity(smact),
                      f"slowdown {pred:.2f}")
    if pred > max_slowdown:  # measured or predicted, live sampler or silent: never past the bound
        why = "" if measured else " (predicted activity)"
        return Judged(None, "", None, f"{g.node}/gpu{g.index} slowdown {pred:.2f} > {max_slowdown:g}{why}")
    basis = "slowdown-model" if measured else "slowdown-predicted"
    return Judged((0 if measured else 1, pred, g.tenants, -g.shards_free, g.node, g.index), basis,
                  Activity(min(load, 9.99)), f"slowdown {pred:.2f}")


def between_users(ts: Sequence[Tenant], job: Profile, uid: Optional[int],
                  floor: float) -> Tuple[List[Tenant], Profile]:
    """``ts`` and ``job`` as counted for user ``uid``: a learned activity (``Profile.learned``) is trusted for
    its own user only, so across users it counts at least ``floor`` (the candidate's beside another user's
    job; another user's tenant's always)."""
    others = any(t.uid != uid and t.end_ts is None for t in ts)

    def floored(p: Profile) -> Profile:
        return replace(p, smact=max(p.smact, floor)) if p.learned and p.smact is not None else p
    return ([replace(t, profile=floored(t.profile)) if t.uid != uid else t for t in ts],
            floored(job) if others else job)


def choose_gpu_bounded(gpus: Sequence[GpuState], tenants: Sequence[Sequence[Tenant]], shards: int,
                       job: Union[Profile, Callable[[str], Profile]],
                       demand: Activity, capacity: Union[float, Callable[[str], float]],
                       max_slowdown: float, now: float, uid: Optional[int] = None,
                       floor: float = 0.0) -> Decision:
    """A GPU for a job under the slowdown bound, by the sharing model alone: among GPUs with ``shards`` free,
    an empty one qualifies, another if the job's SM activity alone (measured, else ``demand.smact``, floored
    by the caller) plus ``load_at_start`` keeps ``slowdown <= max_slowdown``. Live sampler state plays no part
    (a silent sampler never packs past the bound; a live SMACT 1.00 never serialises jobs the model says still
    gain). Order: measured and empty GPUs first, then lowest predicted slowdown, fewest tenants, most free
    shards, node, index. ``job`` and ``capacity`` may be functions of the GPU's model name. ValueError: shards
    < 1, len(tenants) != len(gpus), capacity <= 0 or max_slowdown < 1."""
    cap_of = capacity if callable(capacity) else (lambda _model, c=float(capacity): c)
    if shards < 1 or len(tenants) != len(gpus) or max_slowdown < 1 or any(cap_of(g.model) <= 0 for g in gpus):
        raise ValueError("choose_gpu_bounded: need shards >= 1, one tenant list per GPU, capacity > 0, "
                         "bound >= 1")
    options: List[Tuple[Judged, GpuState]] = []
    blocked: List[str] = []
    for g, ts in zip(gpus, tenants):
        if g.shards_free < shards:
            continue
        ts_u, prof = between_users(ts, job(g.model) if callable(job) else job, uid, floor)
        judged = _judge(g, ts_u, prof, demand, cap_of(g.model), max_slowdown, now)
        if judged.key is None:
            blocked.append(judged.why)
        else:
            options.append((judged, g))
    if not options:
        if not any(g.shards_free >= shards for g in gpus):
            return no_room(gpus, shards)
        return Decision(None, None, "every GPU with room is at its bound: " + "; ".join(blocked[:4]),
                        hold=Hold.AT_BOUND)
    options.sort(key=lambda o: o[0].key or ())
    j, best = options[0]
    detail = f", {j.why}" if j.why and j.why != j.basis else ""
    return Decision(best.node, best.index, f"{best.node}/gpu{best.index} ({j.basis}{detail})", j.basis,
                    j.predicted)


def within_bound(gpus: Sequence[GpuState], tenants: Sequence[Sequence[Tenant]],
                 capacity: Callable[[str], float], smact: float, max_slowdown: float,
                 now: float) -> List[GpuState]:
    """The GPUs (in order) where a job counted at SM activity alone ``smact`` keeps the bound
    (``bounded_slowdown`` without start-up credit), among which memory-only placement picks, so a job without
    data never pushes measured tenants past it."""
    return [g for g, ts in zip(gpus, tenants)
            if bounded_slowdown(ts, capacity(g.model), smact, now, 0.0) <= max_slowdown]


def gpu_work(job: Profile) -> Optional[float]:
    """``smact * work_s`` (SM-activity-seconds; None when unknown): smallest first is Smith's
    shortest-processing-time rule on a GPU of fixed capacity."""
    return job.smact * job.work_s if job.smact is not None and job.work_s is not None else None


def order_candidates(jobs: Sequence[Tuple[int, float, Profile]], now: float, age_s: float) -> List[int]:
    """Held job ids in the order a round offers them a GPU: those waiting over ``age_s`` (s) first by submit
    time, then least ``gpu_work`` (SJF; unknown work counts as the known median), submit time, job id."""
    work = {i: gpu_work(p) for i, _, p in jobs}
    known = sorted(w for w in work.values() if w is not None)
    median = known[len(known) // 2] if known else 0.0
    aged = sorted((ts, i) for i, ts, _ in jobs if now - ts > age_s)
    rest = (sorted((w if (w := work[i]) is not None else median, ts, i) for i, ts, _ in jobs
                   if now - ts <= age_s))
    return [i for _, i in aged] + [i for _, _, i in rest]


class ThroughputPolicy(Policy):
    """The slowdown bound; a job without signature and FLOPs goes by memory among the GPUs a job of unknown
    activity leaves within it."""

    name = "throughput"
    sharing_model = True

    def decide(self, ev: Evidence) -> Decision:
        lim = ev.limits
        if not ev.has_data:
            room = within_bound(ev.gpus, ev.tenants, lim.capacity, lim.floor, lim.max_slowdown, ev.now)
            d = memory_only(room, ev.shards)
            # room, but not within the bound
            if not d.placed and any(g.shards_free >= ev.shards for g in ev.gpus):
                return Decision(None, None, f"every GPU with {ev.shards} free shards is at its bound for a "
                                            f"job of unknown activity (SMACT {lim.floor:.2f})",
                                hold=Hold.UNKNOWN_AT_BOUND)
            return d
        return choose_gpu_bounded(ev.gpus, ev.tenants, ev.shards, ev.profile, ev.counted, lim.capacity,
                                  lim.max_slowdown, ev.now, ev.uid, lim.floor)


THROUGHPUT = ThroughputPolicy()
