"""benchmarks/placement_best_split.py: the exhaustive two-GPU split search over the sharing model."""
from __future__ import annotations

import itertools

import pytest

from benchmarks import placement_best_split as split
from benchmarks import placement_sim as sim


def _job(i: int, smact: float, startup_s: float, work_s: float, shards: int = 4) -> sim.Job:
    return sim.Job(index=i, workload=f"j{i}", submit_s=0.0, shards=shards, smact=smact, startup_s=startup_s,
                   work_s=work_s)


def test_one_job_alone_runs_at_its_speed_alone():
    runs, end = split.gpu_runs([_job(0, 0.9, 3.0, 10.0)], 1.0)
    assert runs == [pytest.approx(1.0)] and end == pytest.approx(1.0 + 13.0)


def test_two_jobs_share_by_the_capacity_once_both_compute():
    # both compute from 1 s; load 1.6 on capacity 1.0: each at 1/1.6 until the short one ends after
    # 5 * 1.6 = 8 s, then the long one alone for its last 5 s
    runs, end = split.gpu_runs([_job(0, 0.8, 0.0, 5.0), _job(1, 0.8, 0.0, 10.0)], 1.0)
    assert end == pytest.approx(1.0 + 8.0 + 5.0)
    assert runs == [pytest.approx(8.0 / 5.0), pytest.approx(13.0 / 10.0)]
    with pytest.raises(ValueError):
        split.gpu_runs([_job(0, 0.8, 0.0, 5.0)], 0.0)


def test_search_finds_the_best_split_and_respects_memory_and_the_bound():
    jobs = [_job(0, 0.9, 2.0, 20.0, 30), _job(1, 0.6, 2.0, 12.0, 30), _job(2, 0.5, 1.0, 8.0, 30),
            _job(3, 0.4, 3.0, 6.0, 10), _job(4, 0.7, 1.0, 9.0, 20)]
    best = split.best_splits(jobs, 1.0, 80, (None, 1.5))
    brute = []
    for sides in itertools.product((0, 1), repeat=len(jobs)):
        parts = [[j for j, s in zip(jobs, sides) if s == g] for g in (0, 1)]
        if any(sum(j.shards for j in p) > 80 for p in parts):
            continue
        res = [split.gpu_runs(p, 1.0) for p in parts]
        brute.append((max(r[1] for r in res), max(x for r in res for x in r[0])))
    assert best[None]["makespan_s"] == pytest.approx(min(m for m, _ in brute))
    assert best[1.5]["makespan_s"] == pytest.approx(min(m for m, w in brute if w <= 1.5))
    assert best[1.5]["worst_run_slowdown"] <= 1.5 <= max(w for _, w in brute)
    assert best[1.5]["makespan_s"] >= best[None]["makespan_s"]
    chosen = best[None]["gpu"]
    assert all(sum(j.shards for j, s in zip(jobs, chosen) if s == g) <= 80 for g in (0, 1))
    with pytest.raises(ValueError):
        split.best_splits([_job(i, 0.1, 0.0, 1.0) for i in range(21)], 1.0)


def test_a_job_with_a_factor_slows_more_while_sharing():
    # capacity 1, load 1.0: the model runs both at full speed; a factor of 2 on job 0 halves its speed only
    jobs = [_job(0, 0.5, 0.0, 5.0), _job(1, 0.5, 0.0, 5.0)]
    runs, end = split.gpu_runs(jobs, 1.0)
    assert runs == [pytest.approx(1.0), pytest.approx(1.0)] and end == pytest.approx(6.0)
    runs, end = split.gpu_runs(jobs, 1.0, factors={0: 2.0})
    # job 0 at 1/2 until job 1 ends at 5 s (2.5 s of work done), then alone: 2.5 s more
    assert runs == [pytest.approx(7.5 / 5.0), pytest.approx(1.0)] and end == pytest.approx(1.0 + 7.5)


@pytest.mark.slow
def test_on_the_piles_a_tighter_bound_costs_makespan_and_every_split_beats_blind():
    rows = split.split_rows()
    assert {(r["pile"], r["world"]) for r in rows} == {(p, w) for p in {r["pile"] for r in rows}
                                                      for w in ("model", "factors")} and len(rows) == 6
    for r in rows:
        best = r["best"]
        assert best[None] is not None and best[2.2] is not None, r["pile"]
        assert best[None]["makespan_s"] <= best[2.2]["makespan_s"]
        assert best[2.2]["worst_run_slowdown"] <= 2.2
        if best[2.0] is not None:
            assert best[2.2]["makespan_s"] <= best[2.0]["makespan_s"]
            assert best[2.0]["worst_run_slowdown"] <= 2.0
        elif r["world"] == "model":
            raise AssertionError(f"no split within bound 2 in the model: {r['pile']}")
        # every split beats blind, which runs the pile on one GPU (memory permitting)
        assert best[None]["makespan_s"] < r["blind_s"]
