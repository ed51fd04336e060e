"""``benchmarks/placement_sim`` cold (``--cold``): a fresh site's placer counts every job at the floor, so a
floor under the jobs' true activity packs them past the bound, and a floor at it places as history does."""
from __future__ import annotations

from benchmarks import placement_sim as sim


def _jobs(smact: float, n: int = 8) -> list:
    return [sim.Job(i, "w", 0.0, 4, smact, 2.0, 30.0) for i in range(n)]


def test_a_floor_below_the_truth_passes_the_bound_and_one_at_it_places_as_history_does() -> None:
    runs = {floor: sim.simulate("throughput", _jobs(0.9), 1, 80, 0.75, 2.0, (0.0, 0.0), cold=floor)
            for floor in (0.2, 0.9)}
    warm = sim.simulate("throughput", _jobs(0.9), 1, 80, 0.75, 2.0, (0.0, 0.0))
    # counted at 0.2, jobs truly at 0.9 are packed past the bound; counted at their truth, as warm
    assert runs[0.2]["max_run_slowdown"] > 2.2 >= runs[0.9]["max_run_slowdown"]
    assert abs(runs[0.9]["makespan_s"] - warm["makespan_s"]) <= 0.15 * warm["makespan_s"]
