"""What a factor per job signature could do to the makespan (issue 32, ninth session): the sharing model with each
job slowed by its signature's measured factor (``placement_signature_fit``), with the product's placer, which
does not know the factors, and with a placer that does.

Not a measurement: ``benchmarks/placement_sim.py``'s model over each pile's profiles alone (2x H100 exclusive
passes), all 14 jobs submitted at once.
- World ``model``: every job progresses at ``min(1, capacity / L)`` while sharing (the product's model).
- World ``factors``: job j progresses at ``min(1, capacity / (f_j * L))``, f_j = the mean measured / predicted
  training slowdown of its workload over every recorded co-run pass of its pile (in sample: the world is fitted
  to all the passes, which ``placement_signature_fit`` scores leave one pass out).
- Placer ``factor-aware``: the product's rules (``share._judge``) with the GPU's capacity divided by the largest
  factor among the candidate and the tenants still on the GPU, so the bound holds for the most sensitive of them
  (``max(1, f * L / capacity) <= bound``); the product's placer sees every factor as 1.

Usage: ``PYTHONPATH=. python3 -m benchmarks.placement_factor_what_if`` (CPU, about 30 s).
"""
from __future__ import annotations

import json
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

from benchmarks import placement_signature_fit as sigfit
from benchmarks import placement_sim as sim
from benchmarks import placement_what_if as what_if
from slurm_coloc.placement import intensity, share
from slurm_coloc.placement.policies import Profile, Tenant

ORIGINAL_JUDGE = share._judge
# (name shown, its entry in placement_signature_fit.PILES, its jobs all submitted at once)
PILE_SETS: Tuple[Tuple[str, str, Callable[[], List[sim.Job]]], ...] = (
    ("own pile", "own pile", lambda: what_if.mix_jobs(0.0)),
    ("held-out pile (light)", "light held-out pile", lambda: what_if.heldout_jobs(False)),
    ("held-out pile of the issue's size", "issue-sized held-out pile", lambda: what_if.heldout_jobs(True)))


def pile_factors(jobs: Sequence[sim.Job], exclusive_name: str) -> Dict[int, float]:
    """Job index -> its workload's mean measured / predicted co-run slowdown over the pile's recorded passes
    (``placement_signature_fit``; 1.0 for a workload with none).

    Args:
        jobs: the pile; exclusive_name: the pile's entry in ``placement_signature_fit.PILES``.

    Raises:
        KeyError: an unknown pile name; OSError: its exclusive pass cannot be read.
    """
    exclusive = dict(sigfit.PILES)[exclusive_name]
    cap = intensity.load_calibration().share_capacity
    prof = sigfit.fitmod.profiles([json.loads(exclusive.read_text())])
    ratios = sigfit.signature_ratios(sigfit.rows_of(sigfit.corun_passes(prof), prof, cap))
    return {j.index: ratios[j.workload][0] if j.workload in ratios else 1.0 for j in jobs}


def factor_judge(factor_of: Dict[Profile, float]) -> Callable[..., Any]:
    """``share._judge`` with the capacity divided by the largest factor of the candidate and the tenants still
    on the GPU (``factor_of``: profile -> factor; 1.0 for a profile not in it)."""
    def judge(g: Any, ts: Sequence[Tenant], job: Profile, demand: Any, capacity: float,
              max_slowdown: float, now: float) -> Any:
        f = max([factor_of.get(job, 1.0)] + [factor_of.get(t.profile, 1.0) for t in ts if t.end_ts is None])
        return ORIGINAL_JUDGE(g, ts, job, demand, capacity / f, max_slowdown, now)
    return judge


class PileWorld(NamedTuple):
    """One pile in one world, blind and the product simulated (``pile_worlds``)."""

    pile: str
    world: str  # "model" or "factors"
    make: Callable[[], List[sim.Job]]  # builds the pile's jobs
    factors: Dict[int, float]  # the pile's job index -> factor (``pile_factors``)
    given: Optional[Dict[int, float]]  # the world's factors: ``factors``, or None in the model
    blind: Dict[str, Any]  # ``sim.simulate``'s result for blind
    product: Dict[str, Any]  # and for the throughput policy


def pile_worlds() -> Iterator[PileWorld]:
    """Each pile of ``PILE_SETS`` in the model and in the world of its per-signature factors, all jobs at once
    on two 80-shard GPUs, bound 2, packaged capacity, with blind and the product simulated.

    Raises:
        What loading the plans and pass files raises (OSError, KeyError).
    """
    cap = intensity.load_calibration().share_capacity
    for name, fit_name, make in PILE_SETS:
        factors = pile_factors(make(), fit_name)
        for world in ("model", "factors"):
            given = factors if world == "factors" else None
            yield PileWorld(name, world, make, factors, given,
                            sim.simulate("blind", make(), 2, 80, cap, 2.0, (0.0, 0.0), factors=given),
                            sim.simulate("throughput", make(), 2, 80, cap, 2.0, (0.0, 0.0), factors=given))


def factor_rows() -> List[Dict[str, Any]]:
    """Blind, the product and the factor-aware placer in both worlds, on the three piles, all at once.

    Returns:
        One row per pile and world: ``pile``, ``world`` (``model`` / ``factors``), ``blind_s``, ``product_s``,
        ``aware_s`` (makespans, s) and ``product_worst``, ``aware_worst`` (worst run slowdown vs alone).

    Raises:
        What loading the plans and pass files raises (OSError, KeyError).
    """
    cap = intensity.load_calibration().share_capacity
    rows = []
    for w in pile_worlds():
        jobs = w.make()
        share._judge = factor_judge({Profile(j.smact, j.alone_s, j.startup_s): w.factors[j.index]
                                     for j in jobs})
        try:
            aware = sim.simulate("throughput", jobs, 2, 80, cap, 2.0, (0.0, 0.0), factors=w.given)
        finally:
            share._judge = ORIGINAL_JUDGE
        rows.append({"pile": w.pile, "world": w.world, "blind_s": w.blind["makespan_s"],
                     "product_s": w.product["makespan_s"], "aware_s": aware["makespan_s"],
                     "product_worst": w.product["max_run_slowdown"], "aware_worst": aware["max_run_slowdown"]})
    return rows


def main() -> int:
    print("| jobs, all at once | world | blind s | product s (x blind, worst run) | factor-aware s (x blind, worst run) |"
          "\n|---|---|---:|---:|---:|")
    for r in factor_rows():
        print(f"| {r['pile']} | {r['world']} | {r['blind_s']:.1f} | {r['product_s']:.1f} "
              f"({r['product_s'] / r['blind_s']:.2f}x, {r['product_worst']:.2f}) | {r['aware_s']:.1f} "
              f"({r['aware_s'] / r['blind_s']:.2f}x, {r['aware_worst']:.2f}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
