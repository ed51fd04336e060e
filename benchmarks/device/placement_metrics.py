"""Metrics and targets of the placement benchmark's passes (pure, stdlib only: runs on the device and here).

A pass file (``placement_passes.py``) holds per job ``index``, ``submit_ts``, ``start_ts`` (first run),
``end_ts`` (end of its last run, an OOM rerun included), ``state`` (of its last run) and ``oom_reruns``.
Definitions (those of ``slurm_coloc.replay.metrics``):
  JCT = end - submit; makespan = last end - first submit; wait = start - submit (s)
  alone = the job's run time (end - start) in the exclusive FIFO pass of its scenario, where it had the GPU alone
  slowdown = JCT / alone (queueing included); run slowdown = (end - start) / alone (how much slower the job ran
  than alone once started: the issue's "no job slower than 3x its time alone", since waiting is unavoidable in a
  pile: FIFO or not, the last of 14 jobs cannot finish before the others' work is done)
  p95 = nearest rank over completed jobs; lost = jobs not COMPLETED; OOMs = OOM reruns
The exclusive pass of the 14-job pile may run in parts (one device call each): ``stitch`` joins them into the one
FIFO pass they stand for (part k starts when part k-1's last job ended).
"""
from __future__ import annotations

import statistics
from typing import Any, Dict, List, Mapping, Optional, Sequence

RUN1_SMALL_CNN_ALONE = 31518.0  # run 1 (docs/benchmarks.md): small CNN alone under Slurm, samples/s
RUN1_SMALL_CNN_AGG7 = 220540.0  # run 1: 7 small CNNs collocated through coloc-sbatch, aggregate samples/s (7.00x)


def p95(values: Sequence[float]) -> Optional[float]:
    """95th percentile by nearest rank (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, -(-95 * len(ordered) // 100) - 1)]


def done(job: Mapping[str, Any]) -> bool:
    """Whether the job COMPLETED with its times known."""
    return job.get("state") == "COMPLETED" and bool(job.get("submit_ts")) and bool(job.get("end_ts"))


def alone_times(exclusive_jobs: Sequence[Mapping[str, Any]]) -> Dict[int, float]:
    """Index -> run time (s) of the jobs that COMPLETED in an exclusive pass without an OOM rerun."""
    return {int(j["index"]): float(j["end_ts"]) - float(j["start_ts"]) for j in exclusive_jobs
            if done(j) and j.get("start_ts") and not j.get("oom_reruns")}


def pass_metrics(jobs: Sequence[Mapping[str, Any]], alone: Mapping[int, float], smact_pct: Optional[float] = None,
                 energy_j: Optional[float] = None) -> Dict[str, Any]:
    """The pass's figures (module docstring); slowdowns only over jobs with an alone time."""
    ok = [j for j in jobs if done(j)]
    jct = [float(j["end_ts"]) - float(j["submit_ts"]) for j in ok]
    submits = [float(j["submit_ts"]) for j in jobs if j.get("submit_ts")]
    slow = [(float(j["end_ts"]) - float(j["submit_ts"])) / alone[int(j["index"])] for j in ok
            if alone.get(int(j["index"]))]
    run_slow = [(float(j["end_ts"]) - float(j["start_ts"])) / alone[int(j["index"])] for j in ok
                if alone.get(int(j["index"])) and j.get("start_ts")]
    waits = [float(j["start_ts"]) - float(j["submit_ts"]) for j in jobs if j.get("start_ts") and j.get("submit_ts")]
    return {"jobs": len(jobs), "completed": len(ok), "lost": len(jobs) - len(ok),
            "ooms": sum(int(j.get("oom_reruns") or 0) for j in jobs),
            "makespan_s": (max(float(j["end_ts"]) for j in ok) - min(submits)) if ok and submits else None,
            "mean_jct_s": statistics.fmean(jct) if jct else None, "p95_jct_s": p95(jct),
            "mean_wait_s": statistics.fmean(waits) if waits else None,
            "mean_slowdown": statistics.fmean(slow) if slow else None, "p95_slowdown": p95(slow),
            "max_slowdown": max(slow) if slow else None,
            "max_run_slowdown": max(run_slow) if run_slow else None,
            "mean_smact_pct": smact_pct, "energy_j": energy_j}


def stitch(parts: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """One exclusive FIFO pass from its parts (ordered): every job counts as submitted with part 1's first job;
    part k's times are shifted so that its first submission falls on part k-1's (shifted) last end. Energy adds
    up; SM activity is the makespan-weighted mean. A pass of one part comes back unchanged (copied).

    Raises:
        ValueError: no parts, or a part without a submitted job.
    """
    if not parts:
        raise ValueError("no exclusive parts to stitch")
    t0: Optional[float] = None
    prev_end: Optional[float] = None
    jobs: List[Dict[str, Any]] = []
    energy: Optional[float] = 0.0
    smact_w, smact_t = 0.0, 0.0
    for p in parts:
        pj = p.get("jobs") or []
        submits = [float(j["submit_ts"]) for j in pj if j.get("submit_ts")]
        if not submits:
            raise ValueError(f"exclusive part {p.get('part')} has no submitted job")
        first = min(submits)
        shift = 0.0 if prev_end is None else prev_end - first
        t0 = first if t0 is None else t0
        ends = []
        for j in pj:
            s = dict(j)
            for k in ("start_ts", "end_ts"):
                if s.get(k):
                    s[k] = float(s[k]) + shift
            if s.get("submit_ts"):
                s["submit_ts"] = t0
            if s.get("end_ts"):
                ends.append(s["end_ts"])
            jobs.append(s)
        prev_end = max(ends) if ends else first + shift
        span = prev_end - (first + shift)
        energy = None if energy is None or p.get("energy_j") is None else energy + float(p["energy_j"])
        if p.get("smact_pct") is not None and span > 0:
            smact_w += float(p["smact_pct"]) * span
            smact_t += span
    out = {k: v for k, v in parts[0].items() if k not in ("jobs", "part", "energy_j", "smact_pct")}
    out.update(jobs=sorted(jobs, key=lambda j: int(j["index"])), energy_j=energy,
               smact_pct=(smact_w / smact_t) if smact_t else None, parts=[p.get("part") for p in parts])
    return out


def le(a: Optional[float], b: Optional[float], factor: float = 1.0) -> Optional[bool]:
    """``a <= factor * b``, None when either is missing."""
    return None if a is None or b is None else a <= factor * b


def targets(by_policy: Mapping[str, Mapping[str, Any]]) -> Dict[str, Optional[bool]]:
    """The issue's targets for one scenario from each policy's ``pass_metrics`` (None where a pass is missing)."""
    ex, bl, aw = (by_policy.get(p) for p in ("exclusive", "blind", "aware"))

    def g(m: Optional[Mapping[str, Any]], k: str) -> Optional[float]:
        return None if m is None else m.get(k)
    complete = None if aw is None else aw.get("lost") == 0
    return {"aware mean JCT <= 0.8x exclusive": le(g(aw, "mean_jct_s"), g(ex, "mean_jct_s"), 0.8),
            "aware mean JCT <= blind": le(g(aw, "mean_jct_s"), g(bl, "mean_jct_s")),
            "aware makespan <= 0.75x exclusive": le(g(aw, "makespan_s"), g(ex, "makespan_s"), 0.75),
            "aware: no job ran > 3x alone": le(g(aw, "max_run_slowdown"), 3.0),
            "aware: 0 OOM, none lost": None if aw is None else bool(complete and aw.get("ooms") == 0),
            "exclusive and blind complete": None if ex is None or bl is None else
            ex.get("lost") == 0 and bl.get("lost") == 0}


def targets_throughput(by_policy: Mapping[str, Mapping[str, Any]], bound: float = 2.0) -> Dict[str, Optional[bool]]:
    """Issue 32's targets for the ``throughput`` pass: makespan <= 0.6x blind's; mean JCT <= 0.5x exclusive FIFO's;
    no job ran slower than ``bound`` + 10 % of its time alone; 0 OOM and none lost; energy per job <= blind's."""
    ex, bl, tp = (by_policy.get(p) for p in ("exclusive", "blind", "throughput"))
    if tp is None:
        return {}

    def g(m: Optional[Mapping[str, Any]], k: str) -> Optional[float]:
        return None if m is None else m.get(k)

    def per_job(m: Optional[Mapping[str, Any]]) -> Optional[float]:
        e, n = g(m, "energy_j"), g(m, "completed")
        return None if e is None or not n else e / n
    return {"throughput makespan <= 0.6x blind": le(g(tp, "makespan_s"), g(bl, "makespan_s"), 0.6),
            "throughput mean JCT <= 0.5x exclusive": le(g(tp, "mean_jct_s"), g(ex, "mean_jct_s"), 0.5),
            f"throughput: no job ran > {bound:g}x + 10% alone": le(g(tp, "max_run_slowdown"), bound * 1.1),
            "throughput: 0 OOM, none lost": bool(tp.get("lost") == 0 and tp.get("ooms") == 0),
            "throughput energy per job <= blind": le(per_job(tp), per_job(bl))}


def fifo_from_alone(exclusive_jobs: Sequence[Mapping[str, Any]], gpus: int, gap_s: float) -> List[Dict[str, Any]]:
    """Exclusive FIFO on ``gpus`` GPUs built from measured runs alone: jobs in index order, each on the GPU that
    frees first, ``gap_s`` after the previous job there ended (Slurm's scheduling and the Epilog), all submitted at
    0; jobs without a run alone are left out. Pure."""
    free = [0.0] * gpus
    out = []
    for j in sorted((j for j in exclusive_jobs if done(j) and j.get("start_ts")), key=lambda j: int(j["index"])):
        g = min(range(gpus), key=lambda k: (free[k], k))
        start = free[g] + (gap_s if free[g] > 0 else 0.0)
        end = start + float(j["end_ts"]) - float(j["start_ts"])
        free[g] = end
        out.append({**j, "submit_ts": 1e-9, "start_ts": start or 1e-9, "end_ts": end, "gpu": f"fifo:{g}"})
    return out


def fifo_gap_s(exclusive_jobs: Sequence[Mapping[str, Any]]) -> float:
    """Median time between one job's end and the next one's start in a (stitched) exclusive pass (s; 0 if < 2)."""
    js = sorted((j for j in exclusive_jobs if done(j) and j.get("start_ts")), key=lambda j: float(j["start_ts"]))
    gaps = [float(b["start_ts"]) - float(a["end_ts"]) for a, b in zip(js, js[1:])]
    return max(0.0, statistics.median(gaps)) if gaps else 0.0


def small7_check(aggregate_samples_per_s: Optional[float]) -> Dict[str, Any]:
    """The 7-small-jobs check: aggregate of 7 small CNNs collocated with the placer alive vs run 1's (no placer)
    on the same harness: gain = aggregate / run 1's rate alone; kept = aggregate / run 1's aggregate (>= 0.95)."""
    if not aggregate_samples_per_s:
        return {"aggregate_samples_per_s": None, "gain": None, "kept": None, "kept_ge_95pct": None}
    kept = aggregate_samples_per_s / RUN1_SMALL_CNN_AGG7
    return {"aggregate_samples_per_s": aggregate_samples_per_s,
            "gain": aggregate_samples_per_s / RUN1_SMALL_CNN_ALONE, "kept": kept, "kept_ge_95pct": kept >= 0.95}


COLUMNS = ("completed", "makespan_s", "mean_jct_s", "p95_jct_s", "p95_slowdown", "max_run_slowdown",
           "mean_smact_pct", "energy_j", "ooms")


def fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.2f}"
    return "-" if v is None else str(v)


def markdown(scenario: str, by_policy: Mapping[str, Mapping[str, Any]]) -> str:
    """A markdown table of one scenario's policies and its target checks."""
    lines = [f"| {scenario} | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for pol in ("exclusive", "blind", "aware", "throughput"):
        if pol in by_policy:
            label = "gate (aware)" if pol == "aware" else pol
            lines.append(f"| {label} | " + " | ".join(fmt(by_policy[pol].get(c)) for c in COLUMNS) + " |")
    lines.append("")
    for name, ok in {**targets(by_policy), **targets_throughput(by_policy)}.items():
        lines.append(f"- {name}: {'met' if ok else 'NOT met' if ok is False else 'n/a (pass missing)'}")
    return "\n".join(lines)
