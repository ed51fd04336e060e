"""benchmarks/placement_factor_what_if.py and the simulator's per-job factors: the model with each job slowed
by its signature's measured factor, the product's placer and a factor-aware one."""
from __future__ import annotations

from benchmarks import placement_factor_what_if as fw
from benchmarks import placement_sim as sim
from benchmarks import placement_what_if as what_if
from slurm_coloc.placement import intensity, share


def test_factors_of_one_change_nothing_and_factors_above_one_slow_blind():
    cap = intensity.load_calibration().share_capacity
    base = sim.simulate("blind", what_if.heldout_jobs(True), 2, 80, cap, 2.0, (0.0, 0.0))
    ones = sim.simulate("blind", what_if.heldout_jobs(True), 2, 80, cap, 2.0, (0.0, 0.0),
                        factors={j.index: 1.0 for j in what_if.heldout_jobs(True)})
    slow = sim.simulate("blind", what_if.heldout_jobs(True), 2, 80, cap, 2.0, (0.0, 0.0),
                        factors={j.index: 1.3 for j in what_if.heldout_jobs(True)})
    assert ones["makespan_s"] == base["makespan_s"]
    assert slow["makespan_s"] > base["makespan_s"] + 5


def test_pile_factors_are_the_recorded_ratios_of_each_workload():
    jobs = what_if.heldout_jobs(True)
    factors = fw.pile_factors(jobs, "issue-sized held-out pile")
    assert set(factors) == {j.index for j in jobs}
    assert all(0.8 < f < 1.6 for f in factors.values())
    assert max(factors.values()) - min(factors.values()) > 0.2  # they differ by workload


def test_the_factor_aware_placer_keeps_runs_shorter_than_the_product_and_puts_the_judge_back():
    rows = fw.factor_rows()
    assert len(rows) == 6
    for r in rows:
        assert r["aware_worst"] <= r["product_worst"] + 1e-9, r
        assert 0 < r["product_s"] < r["blind_s"] and 0 < r["aware_s"] < r["blind_s"], r
    assert share._judge is fw.ORIGINAL_JUDGE
