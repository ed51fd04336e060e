"""The best two-GPU split of a pile with every job started on arrival, in the sharing model (issue 32, ninth
session): how far below blind any placement that starts each job at once could bring the makespan, with and
without the per-job slowdown bound, against the product's placements in the same model; and the same in the
world of per-signature factors (``placement_factor_what_if``), which reproduces the devices' blind and product
makespans more closely.

Not a measurement: ``benchmarks/placement_sim.py``'s model (``share.py``'s processor sharing: the jobs computing
on a GPU each progress at ``min(1, capacity / summed SM activity)`` of their speed alone, a job alone at its
speed alone; start-up alone before the first step; the calibrated capacity), driven by each pile's profiles
alone from its 2x H100 exclusive pass (``placement_what_if``'s job sets, all jobs submitted at once; the own
pile too, so every split starts from the same instant). Every split of the 14 jobs over two 80-shard GPUs that
fits in memory is simulated exactly (events, not time steps): ``2**13`` splits per pile.

A split starts every job 1 s after submission, as ``sim.simulate`` starts a placed job. Holding a job back
cannot raise a GPU's throughput in this model while its load is under the capacity, so the best split is a
reference for what placement can still gain, not a proven floor: a policy that holds a job and places it later
on the GPU that frees first can in principle end a little earlier.

Usage: ``PYTHONPATH=. python3 -m benchmarks.placement_best_split`` (CPU, a few seconds).
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from benchmarks import placement_sim as sim
from benchmarks.placement_factor_what_if import pile_worlds
from slurm_coloc.placement import intensity

START_DELAY_S = 1.0  # sim.simulate starts a placed job 1 s after its placement
BOUNDS: Tuple[Optional[float], ...] = (None, 2.2, 2.0)  # None: no bound; 2.2: the 2.0 + 10 %


def gpu_runs(jobs: Sequence[sim.Job], capacity: float, start_s: float = START_DELAY_S,
             factors: Optional[Mapping[int, float]] = None) -> Tuple[List[float], float]:
    """Every job of one GPU started at ``start_s``, run to the end by the model (module docstring).

    Args:
        jobs: the GPU's jobs (``startup_s``, ``work_s`` alone in s; ``smact``: SM activity alone, fraction).
        capacity: the GPU's sharing capacity (summed SM activity it serves at full speed).
        start_s: when every job starts (s).
        factors: job index -> its factor f (it progresses at ``min(1, capacity / (f * L))`` while sharing:
            ``placement_factor_what_if``'s world); None: 1 for every job.

    Returns:
        ``(run_slowdowns, end_s)``: each job's (end - start) / (start-up + work alone), in ``jobs``' order, and
        the last end (s); ``([], 0.0)`` for no jobs.

    Raises:
        ValueError: capacity <= 0 or a job with negative start-up or work.
    """
    if capacity <= 0 or any(j.startup_s < 0 or j.work_s < 0 for j in jobs):
        raise ValueError("capacity must be > 0 and start-up and work >= 0")
    ready = [start_s + j.startup_s for j in jobs]
    left = {i: j.work_s for i, j in enumerate(jobs)}
    end: Dict[int, float] = {}
    t = start_s
    while left:
        computing = [i for i in left if ready[i] <= t + 1e-9]
        upcoming = [ready[i] for i in left if ready[i] > t + 1e-9]
        if not computing:
            t = min(upcoming)
            continue
        load = sum(jobs[i].smact for i in computing)
        rate = {i: min(1.0, capacity / ((factors or {}).get(jobs[i].index, 1.0) * load))
                if len(computing) > 1 and load > 0 else 1.0 for i in computing}
        step = min(left[i] / rate[i] for i in computing)
        if upcoming:
            step = min(step, min(upcoming) - t)
        t += step
        for i in computing:
            left[i] -= rate[i] * step
            if left[i] <= 1e-9:
                end[i] = t
                del left[i]
    runs = [(end[i] - start_s) / j.alone_s if j.alone_s > 0 else 1.0 for i, j in enumerate(jobs)]
    return runs, max(end.values(), default=0.0)


def best_splits(jobs: Sequence[sim.Job], capacity: float, gib: int = 80,
                bounds: Sequence[Optional[float]] = BOUNDS,
                factors: Optional[Mapping[int, float]] = None) -> Dict[Optional[float], Dict[str, Any]]:
    """The split of ``jobs`` over two GPUs of ``gib`` shards with the shortest makespan, per bound on the worst
    run slowdown.

    Args:
        jobs: the pile (``shards`` each); capacity, factors: as in ``gpu_runs``; gib: shards per GPU.
        bounds: bounds on every job's run slowdown; None: unbounded.

    Returns:
        Per bound: ``makespan_s`` (from the common submission, s), ``worst_run_slowdown`` and ``gpu`` (0/1 per
        job, in ``jobs``' order), or None where no split fits memory and the bound.

    Raises:
        ValueError: more than 20 jobs (the search is exhaustive), or what ``gpu_runs`` raises.
    """
    n = len(jobs)
    if n > 20:
        raise ValueError(f"{n} jobs: the exhaustive search takes at most 20")
    best: Dict[Optional[float], Any] = {b: None for b in bounds}
    for mask in range(1 << max(0, n - 1)):  # job n-1 stays on GPU 1: each split once
        side = [mask >> i & 1 for i in range(n)]
        parts = [[j for j, s in zip(jobs, side) if s == g] for g in (0, 1)]
        if any(sum(j.shards for j in p) > gib for p in parts):
            continue
        results = [gpu_runs(p, capacity, START_DELAY_S, factors) for p in parts]
        makespan = max(r[1] for r in results)
        worst = max((x for r in results for x in r[0]), default=1.0)
        for b in bounds:
            if (b is None or worst <= b) and (best[b] is None or makespan < best[b]["makespan_s"]):
                best[b] = {"makespan_s": makespan, "worst_run_slowdown": worst, "gpu": side}
    return best


def split_rows(bounds: Sequence[Optional[float]] = BOUNDS) -> List[Dict[str, Any]]:
    """Blind, the product (bound 2) and the best splits on the three piles of our choosing, in the model and in
    the world of per-signature factors (``placement_factor_what_if.pile_factors``).

    Returns:
        One row per pile and world: ``pile``, ``world`` (``model`` / ``factors``), ``blind_s``, ``product_s``
        (``sim.simulate``'s makespans, s) and ``best`` (``best_splits``' result).

    Raises:
        What loading the plans and pass files raises (OSError, KeyError).
    """
    cap = intensity.load_calibration().share_capacity
    return [{"pile": w.pile, "world": w.world, "blind_s": w.blind["makespan_s"], "product_s": w.product["makespan_s"],
             "best": best_splits(w.make(), cap, 80, bounds, w.given)} for w in pile_worlds()]


def main() -> int:
    print("| jobs, all at once | world | blind s | product s (x blind) | best split, no bound | "
          "best, worst run <= 2.2 | best, worst run <= 2.0 |\n|---|---|---:|---:|---:|---:|---:|")
    for r in split_rows():
        cells = []
        for b in BOUNDS:
            best = r["best"][b]
            cells.append("none" if best is None else f"{best['makespan_s']:.1f} ({best['makespan_s'] / r['blind_s']:.2f}x"
                                                     f", worst {best['worst_run_slowdown']:.2f})")
        print(f"| {r['pile']} | {r['world']} | {r['blind_s']:.1f} | {r['product_s']:.1f} "
              f"({r['product_s'] / r['blind_s']:.2f}x) | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
