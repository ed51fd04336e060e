"""Simulate the four placement policies on recorded jobs: exclusive FIFO, blind (Slurm's first fit by memory),
gate (coloc-placer's CARMA gate) and throughput (coloc-placer's slowdown bound), on 1 or more GPUs.

Not a measurement: a model driven by measured inputs, to compare the policies on the same jobs and to check the
model against the passes measured on the H100 (``--gpus 1``). Inputs (``benchmarks/device/results/h100-placement-passes/``,
2026-11-24): each workload's profile alone from the exclusive passes (start-up = Slurm start to ``t_ready``, the
GPU idle; compute = the rest of its run; SM activity alone while computing, the sampler), the jobs and their memory
requests from ``benchmarks/device/placement_plan.json``. Sharing: jobs computing together on a GPU progress at
``min(1, capacity / L)`` of their speed alone, L = their summed SM activity alone (``slurm_coloc/placement/share.py``;
capacity from ``calibration.json``, fitted by ``benchmarks/placement_share_fit.py``: 22.6 % mean relative error on
58 co-run jobs). The GPU's SM activity reads ``min(1, sum of a_k x rate_k)``. Energy: per GPU, ``idle_w + dyn_w x
SM activity`` integrated over the makespan, the two watts fitted (least squares) on the measured passes' energy
and mean SM activity. Memory: shards = ceil(request / 1 GiB) of ``--gib`` per GPU; every policy respects it, so
no OOM can arise in the model (OOMs are a measured figure only). Placer: a round every 0.5 s, Slurm starts a
steered job 1 s later; the gate policy uses the bench's settings (window 4 s, recent 12 s), the throughput policy
the packaged calibration and ``--bound``; both call the product's decision functions (``gate.choose_gpu``,
``share.choose_gpu_bounded``).

The throughput policy offers held jobs GPUs in ``share.order_candidates`` order (``--order fifo``: submit order).
``--h200``: the H200's profiles alone (``h200_profiles``) and sharing capacity, for ``--gib 140``.

Usage: ``python3 -m benchmarks.placement_sim [--gpus 2] [--gib 80] [--bound 2.0] [--scenario pile|stream|mixed]
[--order work|fifo] [--h200] [--json F]``
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from benchmarks import placement_share_fit as fitmod
from slurm_coloc.coruns import UNSATURATED
from slurm_coloc.placement import intensity, policies, share
from slurm_coloc.placement.policies import Activity, Evidence, Gate, GpuState, Limits, Profile, Tenant
from slurm_coloc.placement.rounds import live_corrected

HERE = Path(__file__).resolve().parent
PLAN = HERE / "device" / "placement_plan.json"
SLURM_POLICIES = ("exclusive", "blind")  # Slurm's own; the others: the placer's registry (policies.POLICIES)


def all_policies() -> Tuple[str, ...]:
    """Slurm's two policies and every registered placement policy."""
    return (*SLURM_POLICIES, *policies.names())


MEASURED = {"exclusive": ["pile-exclusive-part1", "pile-exclusive-part2"], "blind": ["pile-blind"],
            "gate": ["pile-aware"]}


@dataclass
class Job:
    index: int
    workload: str
    submit_s: float
    shards: int
    smact: float
    startup_s: float
    work_s: float
    placed: float = -1.0
    start: float = -1.0
    end: float = -1.0
    gpu: int = -1
    left: float = 0.0
    history: List[float] = field(default_factory=list)

    @property
    def alone_s(self) -> float:
        return self.startup_s + self.work_s


def load_jobs(scenario: str, prof: Dict[str, Dict[str, float]]) -> List[Job]:
    """The plan's jobs of ``scenario`` with their measured profiles (``mixed``: the pile followed by the stream's
    jobs, one every 6 s from 20 s on)."""
    plan = json.loads(PLAN.read_text())["scenarios"]
    rows = list(plan["pile" if scenario == "mixed" else scenario])
    if scenario == "mixed":
        rows += [{**r, "offset_s": 20.0 + r["offset_s"], "index": 100 + r["index"]} for r in plan["stream"]]
    out = []
    for r in rows:
        p = prof[r["workload"]]
        out.append(Job(r["index"], r["workload"], float(r["offset_s"]), math.ceil(r["mem_mib"] / 1024), p["smact"],
                       p["startup_s"], p["run_s"] - p["startup_s"]))
    return out


def energy_fit(files: Sequence[Dict[str, Any]]) -> Tuple[float, float]:
    """(idle_w, dyn_w) with mean power = idle_w + dyn_w x mean SM activity, least squares over measured passes of
    one GPU (power = energy / wall time of the pass)."""
    pts = [(f["smact_pct"] / 100, f["energy_j"] / f["metrics"]["makespan_s"]) for f in files
           if f.get("energy_j") and f.get("smact_pct") and (f.get("metrics") or {}).get("makespan_s")]
    mx, my = statistics.fmean(x for x, _ in pts), statistics.fmean(y for _, y in pts)
    slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
    return my - slope * mx, slope


def simulate(policy: str, jobs: List[Job], gpus: int, gib: int, capacity: float, bound: float,
             power: Tuple[float, float], dt: float = 0.1, order: str = "work",
             factors: Optional[Dict[int, float]] = None, cold: Optional[float] = None) -> Dict[str, Any]:
    """Run one policy to the end; returns the metrics (``placement_metrics`` definitions) and where each job ran.
    ``order``: the throughput policy's order of held jobs in a round (``work``: the product's
    ``share.order_candidates``; ``fifo``: submit time, the order before it). ``factors``: job index -> how much
    more than the model that job slows when sharing (a world in which job j progresses at
    ``min(1, capacity / (factor_j * L))``; ``placement_factor_what_if``); None: 1 for every job. ``cold``: a
    fresh site, every job never measured: the placer counts each at this floor of SM activity (no prediction above
    it), corrected by the GPU's live reading once settled (``rounds.live_corrected``); progress still follows the
    jobs' true activity. None: every profile known (history)."""
    for j in jobs:
        j.placed = j.start = j.end = -1.0
        j.gpu, j.left = -1, j.work_s
    gate = Gate()
    smact_hist: List[List[Tuple[float, float]]] = [[] for _ in range(gpus)]
    t, energy, steps, peak = 0.0, 0.0, 0, 1.0
    while any(j.end < 0 for j in jobs) and t < 5000:
        # progress
        for g in range(gpus):
            comp = [j for j in jobs if j.gpu == g and j.start >= 0 > j.end and t >= j.start + j.startup_s]
            load = sum(j.smact for j in comp)
            # a job computing alone runs at its speed alone (its profile was measured so), co-runs by the model
            rate = min(1.0, capacity / load) if load > 0 and len(comp) > 1 else 1.0
            peak = max(peak, 1.0 / rate)
            reading = min(1.0, load * rate)
            smact_hist[g].append((t, reading))
            energy += (power[0] + power[1] * reading) * dt
            for j in comp:
                f = (factors or {}).get(j.index, 1.0)
                j.left -= (min(1.0, capacity / (f * load)) if f != 1.0 and len(comp) > 1 and load > 0 else rate) * dt
                if j.left <= 0:
                    j.end = t + dt
        for j in jobs:
            if j.start < 0 <= j.placed and t >= j.placed + 1.0:
                j.start = t
        # placement
        steps += 1
        waiting = sorted((j for j in jobs if j.placed < 0 and j.submit_s <= t), key=lambda j: (j.submit_s, j.index))
        if policy not in SLURM_POLICIES and policies.get(policy).sharing_model and order == "work":
            byid = {j.index: j for j in waiting}
            waiting = [byid[i] for i in share.order_candidates(
                [(j.index, j.submit_s, Profile(j.smact, j.alone_s, j.startup_s)) for j in waiting], t, 1800.0)]
        if policy in ("exclusive", "blind") or steps % 5 == 0:
            for j in waiting:
                g = place(policy, j, jobs, gpus, gib, capacity, bound, gate, smact_hist, t, cold)
                if g is None:
                    if policy == "exclusive":
                        break  # Slurm's FIFO: the oldest waits, so do the others
                    continue  # blind: Slurm backfills; the placer decides for every held job in each round
                j.gpu, j.placed = g, t
                if policy in ("exclusive", "blind"):
                    j.placed = t - 1.0 + 0.5  # Slurm starts it at its next scheduling pass (~0.5 s)
        t += dt
    done = [j for j in jobs if j.end >= 0]
    jct = [j.end - j.submit_s for j in done]
    run_slow = [(j.end - j.start) / j.alone_s for j in done]
    slow = [(j.end - j.submit_s) / j.alone_s for j in done]
    makespan = max(j.end for j in done) - min(j.submit_s for j in jobs)
    return {"policy": policy, "gpus": gpus, "makespan_s": makespan, "mean_jct_s": statistics.fmean(jct),
            "p95_jct_s": p95(jct), "p95_slowdown": p95(slow), "p95_run_slowdown": p95(run_slow),
            "max_run_slowdown": max(run_slow), "peak_slowdown": peak, "energy_j": energy,
            "energy_per_job_j": energy / len(done),
            "ooms": 0, "placement": {j.index: j.gpu for j in jobs}}


def p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, -(-95 * len(ordered) // 100) - 1)]


def place(policy: str, j: Job, jobs: Sequence[Job], gpus: int, gib: int, capacity: float, bound: float,
          gate: Gate, hist: Sequence[Sequence[Tuple[float, float]]], t: float,
          cold: Optional[float] = None) -> Optional[int]:
    """The GPU ``policy`` gives job ``j`` now, or None (it waits); ``cold`` as in ``simulate``."""
    holding = [[o for o in jobs if o.gpu == g and o.placed >= 0 and o.end < 0] for g in range(gpus)]
    used = [sum(o.shards for o in h) for h in holding]
    if policy == "exclusive":
        return next((g for g in range(gpus) if not holding[g]), None)
    if policy == "blind":
        return next((g for g in range(gpus) if used[g] + j.shards <= gib), None)
    states = []
    for g in range(gpus):
        window = [v for ts, v in hist[g] if ts >= t - 4.0]
        live = statistics.fmean(window) if window else 0.0
        recent = sum(o.smact for o in holding[g] if o.placed >= t - 12.0)
        act = Activity(live, live * 0.3, live * 0.3)  # the gate's second clause: SMOCC/DRAMA per SMACT as fitted
        states.append(GpuState("n1", g, gib, used[g], len(holding[g]), act, 0.0,
                               Activity(recent, recent * 0.3, recent * 0.3)))
    seen = j.smact if cold is None else cold
    demand = Activity(seen, seen * 0.3, seen * 0.3)
    pol = policies.get(policy)
    tenants: List[List[Tenant]] = [[] for _ in range(gpus)]

    def profile(o: Job) -> Profile:
        return Profile(o.smact if cold is None else None, o.alone_s, o.startup_s)

    if pol.sharing_model:
        tenants = [[Tenant(profile(o), o.start if o.start >= 0 else o.placed + 1.0, predicted=cold or 0.5,
                           job_id=o.index) for o in holding[g]] for g in range(gpus)]
        if cold is not None:
            for g in range(gpus):
                live = states[g].live
                if live is not None and live.smact > 0:
                    tenants[g] = live_corrected(tenants[g], live.smact, t - 4.0, UNSATURATED)
        # those that left while a present tenant ran, as the placer keeps them (share.track_departures)
        for g in range(gpus):
            tenants[g] += share.kept_departures(tenants[g], [
                Tenant(profile(o), o.start, predicted=cold or 0.5, job_id=o.index, end_ts=o.end)
                for o in jobs if o.gpu == g and o.end >= 0])
    prof = profile(j)
    d = pol.decide(Evidence(states, tenants, j.shards, demand, demand, lambda _model: prof, True, None, t,
                            Limits(gate, "spread", 60.0, bound, lambda _model: capacity, cold or 0.0)))
    return d.index if d.placed else None


def measured_rows(files: Dict[str, Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """The H100 passes' own metrics (one GPU), for the model check."""
    out = {}
    for pol, names in MEASURED.items():
        fs = [files[n] for n in names if n in files]
        if pol == "exclusive" and len(fs) == 2:
            from benchmarks.device import placement_metrics as pm
            st = pm.stitch(fs)
            alone = pm.alone_times(st["jobs"])
            m = pm.pass_metrics(st["jobs"], alone, None, sum(f["energy_j"] for f in fs))
        elif fs:
            m = fs[0]["metrics"]
        else:
            continue
        out[pol] = m
    return out


def table(rows: Sequence[Dict[str, Any]], title: str) -> str:
    head = (f"{title}\n| policy | makespan s | mean JCT s | p95 JCT s | p95 slowdown | p95 run slowdown | worst run "
            "slowdown | peak slowdown | energy kJ | energy/job kJ | OOM |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    lines = [head]
    for r in rows:
        def f(k: str, scale: float = 1.0, d: int = 1, r: Dict[str, Any] = r) -> str:
            v = r.get(k)
            return "-" if v is None else f"{v / scale:.{d}f}"
        lines.append(f"| {r['label']} | {f('makespan_s', d=0)} | {f('mean_jct_s')} | {f('p95_jct_s', d=0)} | "
                     f"{f('p95_slowdown', d=2)} | {f('p95_run_slowdown', d=2)} | {f('max_run_slowdown', d=2)} | "
                     f"{f('peak_slowdown', d=2)} | "
                     f"{f('energy_j', 1000)} | {f('energy_per_job_j', 1000, 2)} | {r.get('ooms', '-')} |")
    return "\n".join(lines)


H200 = HERE / "device" / "results" / "h200x2-placement-throughput"


def h200_profiles(h100: Dict[str, Dict[str, float]]) -> Dict[str, Dict[str, float]]:
    """Workload profiles alone on the H200 (``h200x2-placement-throughput/pile-exclusive.json``: 8 of the pile's 13
    workloads, the pass was cut); the others from their H100 profile, start-up, run time and SM activity scaled by
    the median H200/H100 ratio of the 8 (activity capped at 1)."""
    own = fitmod.profiles([json.loads((H200 / "pile-exclusive.json").read_text())])
    common = [w for w in own if w in h100]
    ratio = {k: statistics.median(own[w][k] / h100[w][k] for w in common) for k in ("smact", "startup_s", "run_s")}
    out = {w: dict(p) for w, p in own.items()}
    for w, p in h100.items():
        if w not in out:
            out[w] = {**p, "smact": min(1.0, p["smact"] * ratio["smact"]), "startup_s": p["startup_s"] *
                      ratio["startup_s"], "run_s": p["run_s"] * ratio["run_s"]}
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--gib", type=int, default=80, help="shards (GiB) per GPU (the H100 harness: 80)")
    ap.add_argument("--bound", type=float, nargs="+", default=[2.0], help="placement_max_slowdown value(s)")
    ap.add_argument("--scenario", choices=("pile", "stream", "mixed"), default="pile")
    ap.add_argument("--order", choices=("work", "fifo"), default="work",
                    help="throughput policy: held jobs offered least GPU work first (the placer's) or by submit time")
    ap.add_argument("--h200", action="store_true", help="the H200's profiles (h200_profiles) and sharing capacity "
                    "(calibration.json, share_capacity_by_gpu); --gib 140 for its shards")
    ap.add_argument("--cold", type=float, nargs="*", default=[],
                    help="also run the sharing-model policies cold: every job never measured, counted at each of "
                         "these SM activity floors (the shipped default 0.53)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    files = {p.stem: json.loads(p.read_text()) for p in fitmod.DEFAULT_FILES}
    prof = fitmod.profiles(list(files.values()))
    cal = intensity.load_calibration()
    capacity = cal.capacity_for("NVIDIA H200") if a.h200 else cal.share_capacity
    if a.h200:
        prof = h200_profiles(prof)
    power = energy_fit([files[n] for n in ("pile-exclusive-part1", "pile-exclusive-part2", "pile-blind",
                                           "pile-aware", "stream-exclusive", "stream-blind", "stream-aware")])
    print(f"capacity {capacity} (calibration.json), power {power[0]:.0f} W + {power[1]:.0f} W x SM "
          f"activity (fitted on 7 H100 passes)")
    out: Dict[str, Any] = {"capacity": capacity, "power_w": power, "runs": []}
    rows = []
    if a.scenario == "pile" and a.gpus == 1 and not a.h200:
        for pol, m in measured_rows(files).items():
            rows.append({**m, "label": f"{pol} (measured, H100)", "p95_run_slowdown": None})
    if a.scenario == "pile" and a.gpus == 2 and a.h200:  # 2026-11-26, slowdowns over jobs 0-7 only
        for pol in ("blind", "aware", "throughput"):
            m = json.loads((H200 / f"pile-{pol}.json").read_text())["metrics"]
            rows.append({**m, "label": f"{pol} (measured, 2x H200, old policy)", "p95_run_slowdown": None})
    for pol in all_policies():
        bounded = pol not in SLURM_POLICIES and policies.get(pol).sharing_model
        for b in (a.bound if bounded else [a.bound[0]]):
            r = simulate(pol, load_jobs(a.scenario, prof), a.gpus, a.gib, capacity, b, power, order=a.order)
            r["label"] = pol + (f" (bound {b:g})" if bounded else "") + " (model)"
            rows.append(r)
            out["runs"].append(r)
            for floor in (a.cold if bounded else []):
                r = simulate(pol, load_jobs(a.scenario, prof), a.gpus, a.gib, capacity, b, power, order=a.order,
                             cold=floor)
                r["label"] = f"{pol} (bound {b:g}) cold, floor {floor:g} (model)"
                rows.append(r)
                out["runs"].append(r)
    print(table(rows, f"{a.scenario}, {a.gpus} GPU(s) of {a.gib} GiB"))
    for r in out["runs"]:
        per = {}
        for i, g in r["placement"].items():
            per.setdefault(g, []).append(i)
        print(f"{r['label']}: " + "; ".join(f"GPU {g}: jobs {sorted(v)}" for g, v in sorted(per.items())))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
