"""What-ifs for the ``throughput`` placement policy on the 2x H100 piles (issue 32, third session): would another
order of held jobs, or a bound on each job's whole-run slowdown, shorten the makespan; and does another load
feature fit the measured co-runs better than summed SM activity alone?

Not a measurement: ``benchmarks/placement_sim.py``'s model (processor sharing, ``share.py``) driven by the
profiles alone measured on the H100s, with jobs submitted 0.5 s apart as the harness does.
- Orders: ``work`` (the product's ``share.order_candidates``: least GPU work first), ``tail`` (jobs whose run
  alone is at least the queue's GPU work / (2 x capacity) first, longest first; then least work first),
  ``longest`` (most GPU work first).
- Whole-run bound: a GPU qualifies while every job's predicted run (``share.predicted_ends`` with the new job)
  stays within ``margin x bound`` of its run alone, instead of the instantaneous ``load / capacity``.
- GPU choice by earliest predicted end: among the GPUs within the bound, the one where the job is predicted
  (``share.predicted_ends``) to end first, instead of the lowest predicted slowdown (sixth session; the code
  that ran on the devices is ``results/h100x2-placement-heldout-sized/sixth-session/host1-earliest-end/
  earliest-end.patch``). Bound 3: the product's rules with ``placement_max_slowdown`` 3.
- GPU choice by earliest predicted drain: among the GPUs within the bound, the one whose last tenant (the job
  included) is predicted to end first (Graham's list scheduling on each GPU's predicted finish; seventh
  session, model only).
- Job sets: the project's pile, the own pile and pile + stream (0.5 s apart), and the two held-out piles submitted
  all at once (``placement_plan_heldout.json``, ``placement_plan_heldout_sized.json``, profiles alone from their
  2x H100 exclusive passes).
- Start-up: every job's start-up alone (Slurm start to its first step) scaled by 0, 0.5, 1 and 1.5, blind against
  the product, on the own pile and the two held-out piles all submitted at once (eighth session: the device
  hosts' start-up differed by about 2x with the same decisions); and the product with a held job's start-up run
  while it waits (``prestarted_place``; a job would have to stop before its first CUDA call).
- Features: capacity fitted (``placement_share_fit.corun_rows``) with the load counted as summed SM activity,
  SM occupancy, DRAM activity or powers of SM activity, on each pile and tested on the other.

Usage: ``python3 -m benchmarks.placement_what_if`` (CPU, about a minute).
"""
from __future__ import annotations

import dataclasses
import json
import math
import statistics
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from benchmarks import placement_share_fit as fitmod
from benchmarks import placement_sim as sim
from slurm_coloc.placement import intensity, share
from slurm_coloc.placement.policies import Activity, Gate, Profile, Tenant

R = fitmod.HERE / "device" / "results"
PILE = [R / "h100-placement-passes" / f"{n}.json" for n in ("pile-exclusive-part1", "pile-exclusive-part2",
                                                              "pile-blind", "pile-aware")] + [
    R / "h100x2-placement-throughput" / f"{n}.json" for n in ("pile-blind", "pile-aware", "pile-throughput",
                                                              "final-policy/pile-throughput")]
MIX = [R / "h100x2-placement-mix-pile" / f"{n}.json" for n in ("mix-exclusive", "mix-blind", "mix-aware",
                                                                 "mix-throughput", "final-policy/mix-blind",
                                                                 "final-policy/mix-throughput")]
SPACING_S = 0.5
ORIGINAL_ORDER = share.order_candidates
ORIGINAL_JUDGE = share._judge


def mix_jobs(spacing_s: float = SPACING_S) -> List[sim.Job]:
    """The own pile's 14 jobs with their profiles alone from its 2x H100 exclusive pass, ``spacing_s`` apart."""
    return plan_jobs("placement_plan_mix.json", str(MIX[0].relative_to(R)), spacing_s)


def heldout_jobs(sized: bool) -> List[sim.Job]:
    """A held-out pile (the issue-sized one with ``sized``, else the light one), all submitted at once, with the
    profiles alone from its 2x H100 exclusive pass."""
    if sized:
        return plan_jobs("placement_plan_heldout_sized.json", "h100x2-placement-heldout-sized/mix-exclusive.json",
                         0.0)
    return plan_jobs("placement_plan_heldout.json", "h100x2-placement-heldout-pile/mix-exclusive.json", 0.0)


def pile_jobs(scenario: str) -> List[sim.Job]:
    """The project's pile (or pile + stream) with the H100 profiles alone, submitted ``SPACING_S`` apart."""
    prof = fitmod.profiles([json.loads(p.read_text()) for p in fitmod.DEFAULT_FILES])
    jobs = sim.load_jobs(scenario, prof)
    for k, j in enumerate(jobs):
        j.submit_s += SPACING_S * k
    return jobs


def plan_jobs(plan_name: str, exclusive: str, spacing_s: float) -> List[sim.Job]:
    """The 14 jobs of a ``placement_mix.py`` plan with their profiles alone from its exclusive pass file (under
    ``results/``), submitted ``spacing_s`` apart (0: all at once, as ``--submit parallel``)."""
    prof = fitmod.profiles([json.loads((R / exclusive).read_text())])
    plan = json.loads((fitmod.HERE / "device" / plan_name).read_text())["scenarios"]["mix"]
    return [sim.Job(r["index"], r["workload"], r["offset_s"] + spacing_s * k, math.ceil(r["mem_mib"] / 1024),
                    prof[r["workload"]]["smact"], prof[r["workload"]]["startup_s"],
                    prof[r["workload"]]["run_s"] - prof[r["workload"]]["startup_s"]) for k, r in enumerate(plan)]


def end_judge(last: bool) -> Callable[..., Any]:
    """``share._judge`` ranking a qualifying GPU first by a predicted end (``share.predicted_ends`` with the
    job placed now): the job's own (earliest end) or, with ``last``, the GPU's last one (earliest drain:
    Graham's list scheduling on each GPU's predicted finish); module docstring."""
    def judge(g: Any, ts: Sequence[Tenant], job: Profile, demand: Activity, capacity: float, bound: float,
              now: float) -> share.Judged:
        j = ORIGINAL_JUDGE(g, ts, job, demand, capacity, bound, now)
        if j.key is None or j.basis not in ("slowdown-model", "empty-gpu"):
            return j
        smact = job.smact if job.smact is not None else demand.smact
        ends = share.predicted_ends(list(ts) + [Tenant(job, now, smact)], capacity)
        picked = ends if last else ends[-1:]
        end = math.inf if any(e is None for e in picked) else max(e for e in picked if e is not None)
        return dataclasses.replace(j, key=(j.key[0], end) + tuple(j.key[1:]))
    return judge


def order_tail(jobs: Sequence[Tuple[int, float, Profile]], now: float, age_s: float) -> List[int]:
    """``tail``: the jobs that would end last if held back go first (module docstring)."""
    base = ORIGINAL_ORDER(jobs, now, age_s)
    prof = {i: p for i, _, p in jobs}
    drain = sum(share.gpu_work(p) or 0.0 for p in prof.values()) / (2 * intensity.load_calibration().share_capacity)
    first = sorted((i for i in base if (prof[i].run_s or 0.0) >= drain), key=lambda i: -(prof[i].run_s or 0.0))
    return first + [i for i in base if i not in first]


def order_longest(jobs: Sequence[Tuple[int, float, Profile]], now: float, age_s: float) -> List[int]:
    """``longest``: most GPU work first."""
    return [i for _, i in sorted((-(share.gpu_work(p) or 0.0), i) for i, _, p in jobs)]


def whole_run_judge(margin: float) -> Callable[..., Any]:
    """``share._judge`` with the whole-run bound (module docstring) for jobs measured alone."""
    def judge(g: Any, ts: Sequence[Tenant], job: Profile, demand: Activity, capacity: float, bound: float,
              now: float) -> share.Judged:
        if job.smact is None or job.work_s is None or (g.tenants == 0 and g.shards_used == 0):
            return ORIGINAL_JUDGE(g, ts, job, demand, capacity, bound, now)
        allt = list(ts) + [Tenant(job, now)]
        worst = 1.0
        for t, end in zip(allt, share.predicted_ends(allt, capacity)):
            alone = (t.profile.startup_s or 0.0) + (t.profile.work_s or 0.0)
            if end is None or alone <= 0 or end < now:
                worst = max(worst, share.bounded_slowdown(ts, capacity, job.smact, now, job.startup_s or 0.0))
            else:
                worst = max(worst, (end - t.start_ts) / alone)
        if worst > bound * margin:
            return share.Judged(None, "", None, f"{g.node}/gpu{g.index} run slowdown {worst:.2f}")
        load = share.load_at_start(ts, capacity, now, job.startup_s or 0.0) + job.smact
        return share.Judged((0, worst, g.tenants, -g.shards_free, g.node, g.index), "slowdown-model",
                            Activity(min(load, 9.99)), f"slowdown {worst:.2f}")
    return judge


def policy_table() -> None:
    """Makespan, mean JCT and slowdowns of each variant on the five job sets (model)."""
    cap = intensity.load_calibration().share_capacity
    files = {p.stem: json.loads(p.read_text()) for p in fitmod.DEFAULT_FILES}
    power = sim.energy_fit([files[n] for n in ("pile-exclusive-part1", "pile-exclusive-part2", "pile-blind",
                                               "pile-aware", "stream-exclusive", "stream-blind", "stream-aware")])
    variants: List[Tuple[str, Callable[..., Any], Callable[..., Any], float]] = [
        ("work (the product's)", ORIGINAL_ORDER, ORIGINAL_JUDGE, 2.0), ("tail", order_tail, ORIGINAL_JUDGE, 2.0),
        ("longest", order_longest, ORIGINAL_JUDGE, 2.0)] + [
        (f"whole-run bound x{m}", ORIGINAL_ORDER, whole_run_judge(m), 2.0) for m in (1.0, 0.9, 0.8)] + [
        ("GPU by earliest predicted end", ORIGINAL_ORDER, end_judge(False), 2.0),
        ("GPU by earliest predicted drain", ORIGINAL_ORDER, end_judge(True), 2.0),
        ("bound 3", ORIGINAL_ORDER, ORIGINAL_JUDGE, 3.0)]
    print(f"capacity {cap} (calibration.json), bound 2 unless named, 2 GPUs of 80 shards\n")
    print("| jobs | policy | makespan s | mean JCT s | worst run slowdown | peak slowdown |\n|---|---|---:|---:|---:|---:|")
    sets = (("project's pile", lambda: pile_jobs("pile")), ("own pile", mix_jobs),
            ("pile + stream", lambda: pile_jobs("mixed")),
            ("held-out pile, all at once", lambda: heldout_jobs(False)),
            ("held-out pile of the issue's size, all at once", lambda: heldout_jobs(True)))
    for name, make in sets:
        r = sim.simulate("blind", make(), 2, 80, cap, 2.0, power)
        print(f"| {name} | blind | {r['makespan_s']:.1f} | {r['mean_jct_s']:.1f} | {r['max_run_slowdown']:.2f} | - |")
        for label, order, judge, bound in variants:
            share.order_candidates, share._judge = order, judge
            try:
                r = sim.simulate("throughput", make(), 2, 80, cap, bound, power)
            finally:
                share.order_candidates, share._judge = ORIGINAL_ORDER, ORIGINAL_JUDGE
            print(f"| {name} | throughput, {label} | {r['makespan_s']:.1f} | {r['mean_jct_s']:.1f} | "
                  f"{r['max_run_slowdown']:.2f} | {r['peak_slowdown']:.2f} |")


def featured(files: Sequence[Dict[str, Any]], feat: Callable[[float, float, float], float]
             ) -> Dict[str, Dict[str, float]]:
    """``fitmod.profiles`` with ``smact`` replaced by ``feat(smact, smocc, drama)`` of the activity alone."""
    prof = fitmod.profiles(files)
    acts: Dict[str, List[Dict[str, float]]] = {}
    for f in files:
        for j in f.get("jobs", []) if f.get("policy") == "exclusive" else []:
            a = j.get("alone_activity") or {}
            if a.get("smact") is not None:
                acts.setdefault(j["workload"], []).append(a)
    for w, p in prof.items():
        p["smact"] = feat(*(statistics.fmean(a[k] for a in acts[w]) for k in ("smact", "smocc", "drama")))
    return prof


def error(files: Sequence[Dict[str, Any]], prof: Dict[str, Dict[str, float]], capacity: float) -> float:
    """Mean relative error of the predicted training slowdowns of the co-run passes."""
    rows = [r for f in files if f.get("policy") not in (None, "exclusive")
            for r in fitmod.corun_rows(f, prof, capacity, 60)]
    return statistics.fmean(abs(p - m) / m for _, p, m in rows)


def feature_table() -> None:
    """Capacity and error per load feature, fitted on each pile and tested on the other."""
    pile = [json.loads(p.read_text()) for p in PILE]
    mix = [json.loads(p.read_text()) for p in MIX]
    feats: Dict[str, Callable[[float, float, float], float]] = {
        "SM activity (the product's)": lambda s, o, d: s, "SM occupancy": lambda s, o, d: o,
        "DRAM activity": lambda s, o, d: d, "sqrt(SM activity)": lambda s, o, d: s ** 0.5,
        "SM activity^1.5": lambda s, o, d: s ** 1.5, "max(SM occupancy, DRAM)": lambda s, o, d: max(o, d)}
    grid = [0.3 + 0.02 * k for k in range(200)]
    print("\n| load feature | capacity, error on the project's pile | on the own pile | project's fit tested "
          "on own | own fit tested on project's |\n|---|---|---|---:|---:|")
    for name, feat in feats.items():
        pp, pm = featured(pile, feat), featured(mix, feat)
        eP, cP = min((error(pile, pp, c), c) for c in grid)
        eM, cM = min((error(mix, pm, c), c) for c in grid)
        print(f"| {name} | {cP:.2f}, {100 * eP:.1f} % | {cM:.2f}, {100 * eM:.1f} % | "
              f"{100 * error(mix, pm, cP):.1f} % | {100 * error(pile, pp, cM):.1f} % |")


STARTUP_SCALES = (0.0, 0.5, 1.0, 1.5)


def startup_rows(scales: Sequence[float] = STARTUP_SCALES) -> List[Dict[str, Any]]:
    """Blind and the product (bound 2) in the model with each job's start-up alone scaled (module docstring).

    Args:
        scales: factors applied to every job's ``startup_s`` (its work alone unchanged).

    Returns:
        One row per pile and factor: ``pile``, ``scale``, ``blind_s`` and ``throughput_s`` (makespans, s),
        ``ratio`` (throughput / blind) and ``prestarted_s`` (the product's makespan with ``prestarted_place``).

    Raises:
        What loading the plans and exclusive files raises (OSError, KeyError).
    """
    cap = intensity.load_calibration().share_capacity
    sets = (("own pile", lambda: mix_jobs(0.0)), ("held-out pile", lambda: heldout_jobs(False)),
            ("held-out pile of the issue's size", lambda: heldout_jobs(True)))
    rows = []
    for name, make in sets:
        for f in scales:
            span = {p: sim.simulate(p, scaled_startup(make(), f), 2, 80, cap, 2.0, (0.0, 0.0))["makespan_s"]
                    for p in ("blind", "throughput")}  # energy not reported: no power model
            jobs = scaled_startup(make(), f)
            sim.place = prestarted_place({j.index: j.startup_s for j in jobs})
            try:
                pre = sim.simulate("throughput", jobs, 2, 80, cap, 2.0, (0.0, 0.0))["makespan_s"]
            finally:
                sim.place = ORIGINAL_PLACE
            rows.append({"pile": name, "scale": f, "blind_s": span["blind"], "throughput_s": span["throughput"],
                         "ratio": span["throughput"] / span["blind"], "prestarted_s": pre})
    return rows


def scaled_startup(jobs: Sequence[sim.Job], factor: float) -> List[sim.Job]:
    """Copies of ``jobs`` with each start-up alone (s) multiplied by ``factor``."""
    return [dataclasses.replace(j, startup_s=j.startup_s * factor) for j in jobs]


ORIGINAL_PLACE = sim.place


def prestarted_place(full_startup_s: Dict[int, float]) -> Callable[..., Optional[int]]:
    """``sim.place`` as if a held job ran its start-up while it waited (a what-if: the job would have to stop
    before its first CUDA call): its start-up left is what remains of its full start-up (``full_startup_s``, s,
    by job index) since submission, 1 s after the round (``sim.simulate``'s start delay)."""
    def place(policy: str, j: sim.Job, jobs: Sequence[sim.Job], gpus: int, gib: int, capacity: float,
              bound: float, gate: Gate, hist: Sequence[Sequence[Tuple[float, float]]], t: float,
              cold: Optional[float] = None) -> Optional[int]:
        j.startup_s = max(0.0, j.submit_s + full_startup_s[j.index] - (t + 1.0))
        return ORIGINAL_PLACE(policy, j, jobs, gpus, gib, capacity, bound, gate, hist, t, cold)
    return place


def startup_table() -> None:
    """Print ``startup_rows`` as a table."""
    print("\n| jobs, all at once | start-up x | blind makespan s | throughput makespan s | ratio | "
          "throughput, held jobs pre-started, s |\n|---|---:|---:|---:|---:|---:|")
    for r in startup_rows():
        print(f"| {r['pile']} | {r['scale']:g} | {r['blind_s']:.1f} | {r['throughput_s']:.1f} | {r['ratio']:.2f} | "
              f"{r['prestarted_s']:.1f} |")


def main() -> int:
    policy_table()
    startup_table()
    feature_table()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
