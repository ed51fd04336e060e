"""A toy model of the 14-job pile on one GPU, to choose coloc-placer's ``placement_recent_s`` for the benchmark.

Not a measurement. Each job starts up for ``O`` s (GPU idle: imports, CUDA set-up; uniform 0.75-1.25 x O) and
then needs ``T`` s of GPU work alone; n jobs computing together progress at g(n)/n each, with
g(n) = 1 + 0.8 (1 - 1/n) (aggregate speed over one job alone: 1.4 for 2, 1.6 for 4, 1.74 for 14; the H100 runs
measured 1.33 for 2 ResNet-50s, 1.39 for 4 and 1.76 for the 14-job pile: docs/benchmarks.md, issue 18). A job
alone keeps SM activity d (uniform 0.25-0.6); the GPU reads min(0.9, sum of d x progress rate) over the computing
jobs (``main`` also runs heavier jobs, 0.4-0.8). Policies (one placer round per second, jobs in FIFO order, a
placed job starts 1 s later; the gate is SMACT alone: the model assumes SM occupancy or DRAM activity crosses
CARMA's second clause whenever SMACT crosses 0.8):
  blind    every job at once
  recent   coloc-placer: an empty GPU takes the next job; otherwise the job goes when live (mean over ``window``
           s) + the demand of jobs placed in the last ``recent`` s + its own demand stays under 0.8 SMACT
Prints makespan and mean JCT against exclusive FIFO (14 x (O + T + 1)) and the worst run time over time alone.
Usage: ``python3 benchmarks/placement_sim.py``
"""
from __future__ import annotations

import random
import statistics
from typing import Dict, List, Tuple


def speed(n: int) -> float:
    """g(n): aggregate progress of n jobs computing together, in jobs-alone (module docstring)."""
    return 1 + 0.8 * (1 - 1 / n) if n else 0.0


def simulate(policy: str, start_s: float, work_s: float, jobs: int = 14, seed: int = 1, window_s: float = 4.0,
             recent_s: float = 4.0, gate: float = 0.8, dt: float = 0.1,
             smact: Tuple[float, float] = (0.25, 0.6)) -> Tuple[float, float, float]:
    """(makespan s, mean JCT s, worst run time / time alone) of one simulated pile (all submitted at 0); each job's
    SM activity alone is uniform in ``smact``."""
    rnd = random.Random(seed)
    js: List[Dict[str, float]] = [{"o": start_s * rnd.uniform(0.75, 1.25), "d": rnd.uniform(*smact),
                                   "left": work_s, "placed": -1.0, "start": -1.0, "end": -1.0}
                                  for _ in range(jobs)]
    t, live = 0.0, []
    while any(j["end"] < 0 for j in js):
        computing = [j for j in js if j["start"] >= 0 > j["end"] and t >= j["start"] + j["o"]]
        rate = speed(len(computing)) / len(computing) if computing else 0.0
        live.append((t, min(0.9, sum(j["d"] * rate for j in computing))))
        if abs(t - round(t)) < dt / 2:
            for c in (j for j in js if j["placed"] < 0):
                tenants = [j for j in js if j["placed"] >= 0 > j["end"]]
                now = statistics.fmean(v for ts, v in live if ts >= t - window_s)
                recent = sum(j["d"] for j in tenants if j["placed"] >= t - recent_s)
                if not (policy == "blind" or not tenants or (now + recent + c["d"] < gate and now < gate)):
                    break  # FIFO: the oldest waits, so do the others
                c["placed"], c["start"] = t, t + 1.0
        for j in computing:
            j["left"] -= rate * dt
            if j["left"] <= 0:
                j["end"] = t
        t += dt
    ends = [j["end"] for j in js]
    worst = max((j["end"] - j["start"]) / (j["o"] + work_s) for j in js)
    return max(ends), statistics.fmean(ends), worst


def main() -> int:
    for smact in ((0.25, 0.6), (0.4, 0.8)):
        for start_s, work_s in ((15, 15), (25, 15), (30, 25)):
            excl_ms = 14 * (start_s + work_s + 1)
            excl_jct = statistics.fmean((k + 1) * (start_s + work_s + 1) for k in range(14))
            runs = [simulate("blind", start_s, work_s, seed=s, smact=smact) for s in range(5)]
            print(f"SMACT alone {smact[0]}-{smact[1]}, start-up {start_s} s, work {work_s} s: exclusive makespan "
                  f"{excl_ms:.0f} s, mean JCT {excl_jct:.0f} s; blind makespan "
                  f"{statistics.fmean(r[0] for r in runs):.0f} s, mean JCT {statistics.fmean(r[1] for r in runs):.0f}"
                  f" s, worst run {statistics.fmean(r[2] for r in runs):.1f}x")
            for recent_s in (2, 4, 6, 8, 12):
                runs = [simulate("recent", start_s, work_s, seed=s, recent_s=recent_s, smact=smact)
                        for s in range(5)]
                ms, jct, worst = (statistics.fmean(r[k] for r in runs) for k in range(3))
                print(f"  recent {recent_s:>2} s: makespan {ms:.0f} s ({ms / excl_ms:.2f}x excl.), mean JCT {jct:.0f} "
                      f"s ({jct / excl_jct:.2f}x), worst run {worst:.1f}x alone")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
