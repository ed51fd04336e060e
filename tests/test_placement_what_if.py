"""benchmarks/placement_what_if.py's start-up table: the model (placement_sim over the 2x H100 profiles)
run with every job's start-up scaled, blind against the product."""
from __future__ import annotations

from benchmarks import placement_what_if as what_if


def test_longer_start_up_lengthens_both_makespans_and_raises_the_ratio():
    rows = what_if.startup_rows((0.0, 1.0, 1.5))
    piles = sorted({r["pile"] for r in rows})
    assert len(piles) == 3 and len(rows) == 9
    for pile in piles:
        by_scale = {r["scale"]: r for r in rows if r["pile"] == pile}
        blind = [by_scale[f]["blind_s"] for f in (0.0, 1.0, 1.5)]
        assert blind == sorted(blind) and blind[0] < blind[-1], (pile, blind)
        assert by_scale[0.0]["throughput_s"] < by_scale[1.5]["throughput_s"], pile
        # the start-up a held job pays on release weighs more on the shorter makespan
        assert by_scale[0.0]["ratio"] < by_scale[1.5]["ratio"], pile
        for r in by_scale.values():
            assert 0 < r["throughput_s"] < r["blind_s"]
            assert abs(r["ratio"] - r["throughput_s"] / r["blind_s"]) < 1e-9


def test_prestarting_held_jobs_never_lengthens_the_product_and_is_a_no_op_without_start_up():
    rows = what_if.startup_rows((0.0, 1.5))
    for r in rows:
        if r["scale"] == 0.0:
            assert abs(r["prestarted_s"] - r["throughput_s"]) < 0.2, r
        else:  # held jobs begin computing earlier
            assert r["prestarted_s"] < r["throughput_s"], r
    assert what_if.sim.place is what_if.ORIGINAL_PLACE  # the what-if puts the simulator back
