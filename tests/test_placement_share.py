"""The ``throughput`` policy (``placement/share.py``) and the daemon's history/tenant plumbing for it.
Pure."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import List

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_coloc import config as config_mod
from slurm_coloc.comment import JobComment
from slurm_coloc.placement import share
from slurm_coloc.placement.daemon import Steered, gpu_tenants, profile, read_history
from slurm_coloc.placement.gate import choose_gpu, silent_gpus
from slurm_coloc.placement.policies import Activity, Gate, GpuState, Profile, Tenant, memory_only
from slurm_coloc.slurm.jobinfo import parse_squeue_json

jc = JobComment.from_fields  # a coloc JSON object as the placer reads it

CAP = 1.03  # the packaged calibration's share_capacity
NOW = 1000.0


def gpu(index: int, used: int = 0, tenants: int = 0, live: float = 0.0, age: float = 1.0,
        total: int = 80) -> GpuState:
    return GpuState("n1", index, total, used, tenants, Activity(live, live * 0.6, live * 0.6), age)


def tenant(smact: float, start: float = NOW - 5, run_s: float = 30.0,
           startup_s: float = 15.0) -> Tenant:
    return Tenant(Profile(smact, run_s, startup_s), start)


JOB = Profile(0.6, 30.0, 15.0)


def choose(gpus: List[GpuState], tenants: List[List[Tenant]], job: Profile = JOB,
           bound: float = 2.0,
           shards: int = 4) -> object:
    return share.choose_gpu_bounded(gpus, tenants, shards, job, Activity(job.smact or 0.5), CAP,
                                    bound, NOW)


def test_slowdown_model_and_tenants_that_end_during_the_start_up() -> None:
    assert share.slowdown(0.5, CAP) == 1.0 and share.slowdown(2.06, CAP) == pytest.approx(2.0)
    # started 20 s ago, 15 s start-up + 15 s work alone at slowdown 1 -> ends in 10 s, inside a 15-s start-up
    ending = tenant(0.4, start=NOW - 20)
    assert share.load_at_start([ending, tenant(0.5)], CAP, NOW, 15.0) == pytest.approx(0.5)
    assert share.load_at_start([ending, tenant(0.5)], CAP, NOW, 5.0) == pytest.approx(0.9)  # still there
    overrun = tenant(0.4, start=NOW - 100)  # past its predicted end: still holding, still counted
    assert share.load_at_start([overrun], CAP, NOW, 15.0) == pytest.approx(0.4)
    unknown_time = Tenant(Profile(0.3), NOW - 100)
    assert share.load_at_start([unknown_time], CAP, NOW, 15.0) == pytest.approx(0.3)
    never_measured = Tenant(Profile(None), NOW, predicted=0.35)  # counts with its prediction
    assert share.load_at_start([never_measured, unknown_time], CAP, NOW, 15.0) == pytest.approx(0.65)


def test_packs_past_smact_one_up_to_the_bound_where_the_gate_stops() -> None:
    g = gpu(0, used=8, tenants=2, live=0.95)
    two = [[tenant(0.6), tenant(0.6)]]
    d = choose([g], two)  # 1.8 / 1.03 = 1.75 <= 2
    assert d.placed and d.basis == "slowdown-model" and "slowdown 1.75" in d.reason  # type: ignore[attr-defined]
    assert not choose_gpu([g], 4, Activity(0.6, 0.36, 0.36), Gate()).placed  # the gate reads it full
    three = [[tenant(0.6), tenant(0.6), tenant(0.6)]]
    d = choose([gpu(0, used=12, tenants=3)], three)  # 2.4 / 1.03 = 2.33 > 2
    assert not d.placed and "at its bound" in d.reason and "2.33 > 2" in d.reason  # type: ignore[attr-defined]
    assert choose([gpu(0, used=12, tenants=3)], three, bound=3.0).placed  # a site that favours throughput
    assert not choose([g], two, bound=1.2).placed  # one that favours latency


def test_spreads_to_the_least_loaded_gpu_and_an_empty_gpu_takes_any_job() -> None:
    gpus = [gpu(0, used=4, tenants=1), gpu(1, used=4, tenants=1), gpu(2, used=4, tenants=1, total=80)]
    d = choose(gpus, [[tenant(0.9)], [tenant(0.2)], [tenant(0.5)]])
    assert d.index == 1  # type: ignore[attr-defined]
    d = choose([gpu(0, used=4, tenants=1), gpu(1)], [[tenant(0.1)], []])
    assert d.index == 1 and d.basis == "empty-gpu"  # type: ignore[attr-defined]
    heavy = Profile(0.99, 30.0, 15.0)
    d = share.choose_gpu_bounded([gpu(0, used=8, tenants=2)], [[tenant(0.9), tenant(0.9)]], 4, heavy,
                                 Activity(0.99), CAP, 2.0, NOW)
    assert not d.placed
    assert share.choose_gpu_bounded([gpu(0, used=78)], [[]], 4, heavy, Activity(0.99), CAP, 2.0,
                                    NOW).reason.startswith("no GPU has 4 free shards")


def test_a_job_never_measured_goes_by_its_prediction_whatever_the_sampler_says() -> None:
    # the gate serialised small jobs (two read SMACT 1.00, the third waited) and a silent sampler
    # packed 7 per GPU by memory (one ran 4.29x alone); both now go by the model with the prediction
    never = Profile(None)
    unknown = [[Tenant(never, NOW - 5, 0.5)]]
    for live, age in ((0.95, 1.0), (0.2, 1.0), (0.95, 600.0)):  # saturated, light, silent: one answer
        d = choose([gpu(0, used=4, tenants=1, live=live, age=age)], unknown, job=never)
        assert d.placed and d.basis == "slowdown-predicted"
    two = [[Tenant(never, NOW - 5, 0.5), Tenant(never, NOW - 5, 0.5),
            Tenant(never, NOW - 5, 0.5)]]
    for live, age in ((0.2, 1.0), (0.95, 600.0)):  # 2.0 / 1.03 = 1.94 > ... with the job's 0.5: 1.94
        d = choose([gpu(0, used=12, tenants=3, live=live, age=age)], two, job=never)
        assert d.placed and "slowdown 1.94" in d.reason  # type: ignore[attr-defined]
        four = [two[0] + [Tenant(never, NOW - 5, 0.5)]]
        d = choose([gpu(0, used=16, tenants=4, live=live, age=age)], four, job=never)
        assert not d.placed and "2.43 > 2 (predicted activity)" in d.reason  # type: ignore[attr-defined]
    assert silent_gpus([gpu(0, live=0.9, age=600.0), gpu(1, live=0.2)], 60.0) == [("n1", 0)]
    # empty and measured GPUs come before predicted ones
    d = choose([gpu(0, used=4, tenants=1), gpu(2)], [unknown[0], []], job=never)
    assert d.index == 2 and d.basis == "empty-gpu"  # type: ignore[attr-defined]


def test_tenants_never_measured_count_with_their_prediction_whatever_the_sampler_says() -> None:
    # the 2x H200 run of 2026-11-26: two never-measured tenants and a silent sampler sent every measured job
    # to memory-only packing (7 on one GPU, one ran 4.8x its time alone); now they count with their prediction
    tenants = [[Tenant(Profile(None), NOW - 5, 0.53),
                Tenant(Profile(None), NOW - 5, 0.53),
                tenant(0.72)]]
    for g in (gpu(0, used=12, tenants=3, live=0.95, age=600.0), gpu(0, used=12, tenants=3, live=0.3)):
        d = choose([g], tenants, job=Profile(0.81, 24.0, 9.0))  # 2.59 / 1.03 = 2.51 > 2
        assert not d.placed and "slowdown 2.51 > 2" in d.reason  # type: ignore[attr-defined]
        d = choose([g], tenants[:1] and [tenants[0][:2]], job=Profile(0.81, 24.0, 9.0))  # 1.87 -> 1.82
        assert d.placed and d.basis == "slowdown-model"  # type: ignore[attr-defined]


def test_memory_only_spreads_by_tenants() -> None:
    d = memory_only([gpu(0, used=4, tenants=1), gpu(1, used=30, tenants=0), gpu(2, used=79)], 4)
    assert d.index == 1 and d.basis == "memory-only"
    assert not memory_only([gpu(0, used=79)], 4).placed


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.floats(0.0, 1.0), max_size=6), min_size=1, max_size=4), st.floats(0.0, 1.0),
       st.floats(1.0, 4.0), st.integers(1, 40))
def test_model_placements_respect_memory_and_the_bound(loads: List[List[float]], smact: float, bound: float,
                                                       shards: int) -> None:
    gpus = [gpu(i, used=len(ls) * 10, tenants=len(ls)) for i, ls in enumerate(loads)]
    tenants = [[tenant(x, start=NOW) for x in ls] for ls in loads]
    d = share.choose_gpu_bounded(gpus, tenants, shards, Profile(smact, 30.0, 15.0), Activity(smact),
                                 CAP, bound, NOW)
    if d.placed:
        g = next(g for g in gpus if g.index == d.index)
        assert g.shards_free >= shards
        if d.basis == "slowdown-model":
            assert share.slowdown(sum(loads[g.index]) + smact, CAP) <= bound + 1e-9
    else:
        assert all(g.shards_free < shards
                   or (g.tenants and share.slowdown(sum(loads[g.index]) + smact, CAP) > bound)
                   for g in gpus)


def test_history_gives_run_and_start_up_times_and_bad_files_never_raise(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "hist.json"
    path.write_text(json.dumps({"signatures": {"aa": {"smact": 0.6, "smocc": 0.3, "drama": 0.2, "run_s": 30,
                                                      "startup_s": 12}}}))
    cfg = config_mod.Config(state_dir=str(tmp_path / "state"), placement_history_path=str(path))
    timing: dict = {}
    hist = read_history(cfg, timing)
    assert hist == {(None, "aa"): [Activity(0.6, 0.3, 0.2)]} and timing == {(None, "aa"): [(30.0, 12.0)]}
    coloc = {"sha256": "f" * 64}
    from slurm_coloc.placement.intensity import signature
    sig = signature(coloc)
    admin = {(None, sig): hist[(None, "aa")]}, {(None, sig): timing[(None, "aa")]}
    assert profile(jc(coloc), *admin) == Profile(0.6, 30.0, 12.0)  # the admin's file counts for everyone
    assert profile(jc(coloc), *admin, uid=2001) == Profile(0.6, 30.0, 12.0)
    per_user = ({**admin[0], (2002, sig): [Activity(0.95, 0.9, 0.9)]},
                {**admin[1], (2002, sig): [(90.0, 5.0)]})
    assert profile(jc(coloc), *per_user, uid=2002) == Profile(0.95, 90.0,
                                                          5.0)  # a user's own runs come first
    assert profile(jc(coloc), *per_user, uid=2001) == Profile(0.6, 30.0, 12.0)  # never another user's
    assert profile(jc({}), hist, timing) == Profile(None)
    seen: set = set()
    path.write_text("{not json")
    for _ in range(3):
        assert read_history(cfg, None, None, seen) == {}
    assert sum("cannot read placement_history_path" in r.message for r in caplog.records) == 1  # logged once
    path.write_text(json.dumps({"signatures": {"aa": {"smact": 0.6, "smocc": 0.3, "drama": 0.2}}}))
    stale = replace_cfg(cfg, placement_history_max_age_s=10.0)
    assert read_history(stale, None, time.time() + 3600, seen) == {}
    assert any("is stale" in r.message for r in caplog.records)


def replace_cfg(cfg: config_mod.Config, **kw: object) -> config_mod.Config:
    from dataclasses import replace
    return replace(cfg, **kw)  # type: ignore[arg-type]


def test_gpu_tenants_follow_slurm_holdings_and_steered_jobs() -> None:
    gpus = [gpu(0), gpu(1)]
    jobs = parse_squeue_json(json.dumps({"jobs": [
        {"job_id": 7, "job_state": "RUNNING", "nodes": "n1", "start_time": 990,
         "gres_detail": ["shard:g1:4(IDX:1)"]},
        {"job_id": 6, "job_state": "COMPLETED", "nodes": "n1", "gres_detail": ["shard:g0:4(IDX:0)"]}]}))
    steered = {8: Steered("n1", 0, 4, Activity(0.5), NOW - 2, Profile(0.5, 30.0, 10.0))}
    out = gpu_tenants(gpus, jobs, steered, lambda j, _model: (Profile(None), 0.7), NOW)
    assert out[0] == [Tenant(Profile(0.5, 30.0, 10.0), NOW - 2,
                             0.5, 8)]  # steered, not shown by Slurm yet
    assert out[1] == [Tenant(Profile(None), 990.0, 0.7, 7)]  # running: its data, Slurm's start


@pytest.mark.parametrize("text,needle", [("placement_max_slowdown: 0.5\n", "placement_max_slowdown"),
                                         ("placement_max_slowdown: 11\n", "placement_max_slowdown"),
                                         ("placement_policy: fastest\n", "placement_policy"),
                                         ("placement_history_max_age_s: 0\n", "placement_history_max_age_s")])
def test_placement_config_keys_are_range_checked(tmp_path: Path, text: str, needle: str) -> None:
    from slurm_coloc.errors import ConfigError

    path = tmp_path / "coloc.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        config_mod.load(str(path), environ={})
    path.write_text("placement_max_slowdown: 1.2\nplacement_policy: gate\n")
    cfg = config_mod.load(str(path), environ={})
    assert (cfg.placement_max_slowdown, cfg.placement_policy) == (1.2, "gate")
    assert (config_mod.Config().placement_policy == "throughput"
            and config_mod.Config().placement_max_slowdown == 2.0)


def test_capacity_per_gpu_model_from_the_calibration(tmp_path: Path) -> None:
    from slurm_coloc.placement import intensity
    from slurm_coloc.store import placement as store_placement
    from slurm_coloc.store.db import open_node_db, open_readonly

    cal = intensity.load_calibration()
    assert cal.capacity_for("NVIDIA H200") == pytest.approx(0.75)  # fitted on the 2x H200 run
    assert cal.capacity_for("NVIDIA H100 80GB HBM3") == pytest.approx(1.03)
    assert cal.capacity_for("") == pytest.approx(0.75)  # not named yet: the least of any model
    # two tenants of 0.6 + a job of 0.6 = 1.8: 1.75x on an H100, 2.4x on an H200 (over the bound there)
    h100 = replace_gpu(gpu(0, used=8, tenants=2), model="NVIDIA H100 80GB HBM3")
    h200 = replace_gpu(gpu(1, used=8, tenants=2), model="NVIDIA H200")
    two = [tenant(0.6), tenant(0.6)]
    d = share.choose_gpu_bounded([h200, h100], [two, two], 4, JOB, Activity(0.6), cal.capacity_for,
                                 2.0, NOW)
    assert d.index == 0 and "slowdown 1.75" in d.reason
    d = share.choose_gpu_bounded([h200], [two], 4, JOB, Activity(0.6), cal.capacity_for, 2.0, NOW)
    assert not d.placed and "slowdown 2.40 > 2" in d.reason
    bad = tmp_path / "cal.json"
    bad.write_text(json.dumps({**json.loads(intensity.DEFAULT_CALIBRATION.read_text()),
                               "share_capacity_by_gpu": {"H200": 0}}))
    with pytest.raises(Exception, match="share_capacity"):
        intensity.load_calibration(str(bad))
    # the model name comes from the sampler's gpus table with the live state
    db = open_node_db(tmp_path / "n1.db")
    db["gpus"].insert({"gpu_index": 0, "uuid": "u", "name": "NVIDIA H200", "mem_total_mib": 1.0,
                       "updated_ts": 1.0})
    db["gpu_samples"].insert({"ts": time.time(), "gpu_index": 0, "smact_pct": 50.0, "smocc_pct": 20.0,
                              "dram_bw_pct": 10.0, "mem_used_mib": 1.0, "n": 1, "res_s": 1.0})
    assert [g.name
            for g in store_placement.live_gpus(open_readonly(tmp_path / "n1.db"), 30.0)] == ["NVIDIA H200"]


def replace_gpu(g: GpuState, **kw: object) -> GpuState:
    from dataclasses import replace
    return replace(g, **kw)  # type: ignore[arg-type]


def test_gpu_states_carry_the_model_name_of_the_live_state() -> None:
    from slurm_coloc.placement.daemon import gpu_states
    from slurm_coloc.slurm import placement as sp
    from slurm_coloc.store.placement import LiveGpu

    nodes = [sp.NodeGpus("n1", "IDLE", {0: 80, 1: 80})]
    live = {"n1": [LiveGpu(0, NOW, 0.5, 0.2, 0.1, 1000.0, 10, "NVIDIA H200")]}
    states = {g.index: g for g in gpu_states(nodes, [], live, {}, NOW, 30.0)}
    assert states[0].model == "NVIDIA H200" and states[1].model == ""  # no sample: the default capacity


def test_predicted_ends_play_the_sharing_model_forward() -> None:
    # two of 0.6 computing from NOW on (15 s start-up at NOW - 15), 15 s of work alone each: L 1.2 > 1.03, so
    # both run at 1.03 / 1.2 and end together after 15 x 1.2 / 1.03 s
    both = [tenant(0.6, start=NOW - 15), tenant(0.6, start=NOW - 15)]
    ends = share.predicted_ends(both, CAP)
    assert ends[0] == pytest.approx(NOW + 15 * 1.2 / CAP) and ends[1] == ends[0]
    # one still starting (computes from NOW + 10): the first runs alone until then, then shares
    ends = share.predicted_ends([tenant(0.6, start=NOW - 15), tenant(0.6, start=NOW - 5)], CAP)
    assert ends[0] == pytest.approx(NOW + 10 + 5 * 1.2 / CAP)  # 10 s alone, 5 s of work left at 1.03 / 1.2
    assert ends[1] is not None and ends[1] > ends[0]
    assert share.predicted_ends([Tenant(Profile(0.5), NOW)], CAP) == [None]  # run time unknown
    assert share.predicted_ends([], CAP) == []


def test_a_tenant_that_left_is_replayed_as_the_load_it_was() -> None:
    # A and B computed together from NOW - 20 (L 1.2 > 1.03); A left at NOW - 5. Forgetting A, B would have
    # run alone from NOW - 20 and end now; replayed, it progressed at 1.03 / 1.2 for 15 s, had
    # 20 - 15 x 1.03 / 1.2 = 7.125 s of its work alone left when A left, and ends 7.125 s after that.
    a = Tenant(Profile(0.6, 30.0, 10.0), NOW - 30, job_id=1, end_ts=NOW - 5)
    b = Tenant(Profile(0.6, 30.0, 10.0), NOW - 30, job_id=2)
    assert share.predicted_ends([b], CAP) == [pytest.approx(NOW + 0.0)]
    assert share.predicted_ends([a, b], CAP) == [NOW - 5, pytest.approx(NOW - 5 + 20 - 15 * CAP / 1.2)]
    # a tenant that left never counts at a new job's start, and a GPU of only such tenants takes anyone
    assert share.load_at_start([a, b], CAP, NOW, 2.0) == pytest.approx(0.6)
    assert share.load_at_start([a], CAP, NOW, 2.0) == 0.0


def test_track_departures_keeps_only_those_that_shaped_a_present_tenant() -> None:
    key = ("n1", 0)
    early = Tenant(Profile(0.5, 30.0, 10.0), NOW - 60, job_id=1)
    mate = Tenant(Profile(0.5, 60.0, 10.0), NOW - 40, job_id=2)
    late = Tenant(Profile(0.5, 30.0, 10.0), NOW - 2, job_id=3)
    gone = share.track_departures({key: [early, mate]}, {key: [mate]}, {}, NOW)
    # left now, while the mate computes
    assert gone == {key: [Tenant(early.profile, early.start_ts, 0.5, 1, NOW)]}
    # once the mate leaves too, only a tenant that began computing before they left keeps them
    kept = share.track_departures({key: [mate]}, {key: [late]}, gone, NOW + 1)
    assert kept == {}  # late computes from NOW + 8: neither shaped it
    assert share.track_departures({key: [mate]}, {key: []}, gone, NOW + 1) == {}  # an empty GPU keeps none
    # a long tenant beside many short ones keeps only the last DEPARTED_KEPT of them
    long = Tenant(Profile(0.5, 10_000.0, 10.0), NOW - 5_000, job_id=0)
    shorts = [Tenant(Profile(0.5, 30.0, 10.0), NOW - 4_000 + 50 * k, job_id=100 + k,
                     end_ts=NOW - 3_900 + 50 * k) for k in range(share.DEPARTED_KEPT + 8)]
    kept = share.track_departures({key: [long]}, {key: [long]}, {key: shorts}, NOW)[key]
    assert len(kept) == share.DEPARTED_KEPT and kept[-1] == shorts[-1] and shorts[7] not in kept
    unknown = Tenant(Profile(0.5), NOW - 60)  # no job id: never taken for gone
    assert share.track_departures({key: [unknown, mate]}, {key: [mate]}, {}, NOW) == {}


def test_a_tenant_that_leaves_before_the_next_one_computes_frees_its_room_at_once() -> None:
    # A computes alone now and ends in 5 s; B is still starting (computes from NOW + 14). A job with 10 s of
    # start-up computes from NOW + 10 beside B only: 1.8 / 1.03 = 1.75 <= 2. Taking A's slowdown as if B were
    # computing already would have put A's end at NOW + 20 and held the job (2.7 / 1.03 = 2.62).
    a = tenant(0.9, start=NOW - 20, run_s=25.0, startup_s=5.0)
    b = tenant(0.9, start=NOW - 1, run_s=35.0, startup_s=15.0)
    assert share.predicted_ends([a, b], CAP)[0] == pytest.approx(NOW + 5)
    d = choose([gpu(0, used=8, tenants=2)], [[a, b]], job=Profile(0.9, 30.0, 10.0))
    assert d.placed and "slowdown 1.75" in d.reason  # type: ignore[attr-defined]
    # computes while A does
    d = choose([gpu(0, used=8, tenants=2)], [[a, b]], job=Profile(0.9, 30.0, 4.0))
    assert not d.placed and "2.62 > 2" in d.reason  # type: ignore[attr-defined]


def test_a_silent_sampler_never_packs_past_the_bound_with_a_job_never_measured() -> None:
    # the 2x H200 run of 2026-11-26 broke its bound when the live state went missing for a round; a job
    # without history is held to the bound by its predicted activity, and so are tenants never measured
    silent = gpu(0, used=8, tenants=2, live=0.2, age=600.0)
    measured = [[tenant(0.9, start=NOW), tenant(0.9, start=NOW)]]
    never = Profile(None)
    d = share.choose_gpu_bounded([silent], measured, 4, never, Activity(0.5), CAP, 2.0, NOW)
    assert not d.placed and "slowdown 2.23 > 2 (predicted activity)" in d.reason
    d = share.choose_gpu_bounded([silent], measured, 4, never, Activity(0.1), CAP, 2.0, NOW)
    assert d.placed and d.basis == "slowdown-predicted"  # 1.9 / 1.03 = 1.84
    fresh_light = gpu(0, used=8, tenants=2, live=0.2)
    d = share.choose_gpu_bounded([fresh_light], measured, 4, never, Activity(0.5), CAP, 2.0, NOW)
    assert not d.placed  # a light live reading does not override the model either
    # where nobody was measured, the predictions hold a job too (7 per GPU broke the bound)
    unmeasured = [[Tenant(never, NOW, 0.9), Tenant(never, NOW, 0.9)]]
    d = share.choose_gpu_bounded([silent], unmeasured, 4, never, Activity(0.5), CAP, 2.0, NOW)
    assert not d.placed and "2.23 > 2" in d.reason
    # a job with no data at all (no signature, no FLOPs) goes by memory only among GPUs within the bound
    room = share.within_bound([silent, gpu(1, used=4, tenants=1), gpu(2), gpu(3, used=8, tenants=2)],
                              measured + [[tenant(0.3)], [], unmeasured[0]], lambda _m: CAP, 0.53, 2.0, NOW)
    assert [g.index for g in room] == [1, 2]


def test_order_candidates_least_gpu_work_first_within_fairness() -> None:
    light = Profile(0.3, 40.0, 10.0)   # 0.3 x 30 = 9 SMACT-s
    heavy = Profile(0.9, 40.0, 10.0)   # 27
    short = Profile(0.9, 15.0, 10.0)   # 4.5
    never = Profile(None)              # unknown: the median of the known ones (9)
    jobs = [(1, NOW - 10, heavy), (2, NOW - 9, light), (3, NOW - 8, short), (4, NOW - 7, never)]
    assert share.order_candidates(jobs, NOW, 300.0) == [3, 2, 4, 1]
    assert share.gpu_work(light) == pytest.approx(9.0) and share.gpu_work(never) is None
    # a job waiting past the age limit goes first, oldest first: SJF never holds it to its memory-only release
    old = [(5, NOW - 400, heavy), (6, NOW - 350, heavy)]
    assert share.order_candidates(jobs + old, NOW, 300.0)[:3] == [5, 6, 3]
    # no data: FIFO
    assert share.order_candidates([(1, NOW, never), (2, NOW - 1, never)], NOW, 300.0) == [2, 1]


def test_an_ending_job_leaves_the_model_at_once_but_keeps_its_shards() -> None:
    from slurm_coloc.placement.daemon import gpu_states
    from slurm_coloc.slurm import placement as sp

    held = "shard:g0:4(IDX:0)"
    jobs = parse_squeue_json(json.dumps({"jobs": [
        {"job_id": 7, "job_state": "COMPLETING", "nodes": "n1", "start_time": 990, "gres_detail": [held]},
        {"job_id": 9, "job_state": "RUNNING", "nodes": "n1", "start_time": 990, "gres_detail": [held]}]}))
    states = gpu_states([sp.NodeGpus("n1", "MIXED", {0: 80})], jobs, {}, {}, NOW, 30.0)
    assert states[0].shards_used == 8 and states[0].tenants == 2
    out = gpu_tenants(states, jobs, {}, lambda j, _model: (Profile(0.5, 30.0, 10.0), 0.5), NOW)
    assert len(out[0]) == 1  # the COMPLETING one computes no more


def _held(job_id: int, submit: float, sha: str = "") -> object:
    c = {"mode": "shard", "shards": 4, "v": 1, "place": True, **({"sha256": sha} if sha else {})}
    return parse_squeue_json(json.dumps({"jobs": [{"job_id": job_id, "job_state": "PENDING", "user_id": 2001,
                                                   "submit_time": submit,
                                                   "comment": "coloc:" + json.dumps(c)}]}))[0]


def test_the_round_orders_by_history_and_holds_a_job_without_data_at_the_bound() -> None:
    from slurm_coloc.placement import intensity
    from slurm_coloc.placement.intensity import signature
    from slurm_coloc.placement.rounds import PlacerState, Round

    cal = intensity.load_calibration()
    long_sig, short_sig = signature({"sha256": "a" * 64}), signature({"sha256": "b" * 64})
    state = PlacerState(history={(None, long_sig): [Activity(0.9)], (None, short_sig): [Activity(0.9)]},
                        timing={(None, long_sig): [(60.0, 10.0)], (None, short_sig): [(20.0, 10.0)]})
    cfg = config_mod.Config(placement_policy="throughput")
    silent = gpu(0, used=8, tenants=2, live=0.2, age=600.0)
    rnd = (Round(cfg, state, cal, Gate(), [silent], [[tenant(0.9, start=NOW), tenant(0.9, start=NOW)]], True,
                 NOW))
    jobs = [_held(1, NOW - 30, "a" * 64), _held(2, NOW - 20, "b" * 64), _held(3, NOW - 10)]
    # 9 SMACT-s, then 45 and the unknown (median: 45) by age
    assert [j.job_id for j in rnd.ordered(jobs)] == [2, 1, 3]
    # no signature, no FLOPs: memory, but not past the bound
    c = rnd.decide(jobs[2], 4)
    d, source = c.decision, c.source
    assert source == "no signature or FLOPs" and not d.placed and "at its bound" in d.reason
    rnd.tenants = [[tenant(0.9, start=NOW)]]
    d = rnd.decide(jobs[2], 4).decision
    assert d.placed and d.basis == "memory-only"  # 1.43 / 1.03 = 1.39


def test_a_tenant_counts_as_gone_only_with_a_tenth_of_its_work_to_spare() -> None:
    # computes alone from NOW - 15 for 20 s of work: predicted to end at NOW + 5, END_SLACK x 20 s = 2 s to
    # spare
    t = tenant(0.9, start=NOW - 20, run_s=25.0, startup_s=5.0)
    assert share.END_SLACK == pytest.approx(0.1)
    assert share.load_at_start([t], CAP, NOW, 6.0) == pytest.approx(0.9)  # ends 1 s before: too close, counts
    assert share.load_at_start([t], CAP, NOW, 7.0) == pytest.approx(0.0)  # 2 s before: gone
