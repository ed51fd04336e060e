"""Profiles alone learned from shared runs (``coruns.py``, ``history.read_history``): the fit
recovers each signature's SM activity alone from co-run mixes, a shared run's time alone is replayed through
the sharing model, only COMPLETED runs count, and history is capped per user and per signature. Node and
controller databases are real SQLite files written through the store."""
from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from slurm_coloc import config as config_mod
from slurm_coloc import coruns as learn
from slurm_coloc.comment import JobComment
from slurm_coloc.placement import history, intensity
from slurm_coloc.placement.history import ModelRuns, profile, read_history
from slurm_coloc.placement.policies import Profile, Tenant
from slurm_coloc.store.db import open_ctld_db, open_node_db

jc = JobComment.from_fields  # a coloc JSON object as the placer reads it

TRUE = {"a": 0.30, "b": 0.55, "c": 0.20, "d": 0.80}  # SM activity alone of four signatures


def _spans(seed: int, gpus: int = 2) -> List[Tuple[str, int, float, float, float]]:
    """``(signature, gpu, start, compute, end)`` of six runs per GPU, staggered so the mixes change."""
    rng = random.Random(seed)
    out = []
    for g in range(gpus):
        for sig in ("a", "b", "c", "d", "a", "c"):
            start = rng.uniform(0, 40)
            out.append((sig, g, start, start + 8.0, start + 8.0 + rng.uniform(20, 60)))
    return out


def _samples(spans: List[Tuple[str, int, float, float, float]], gpu: int, noise: float,
             seed: int) -> List[Tuple[float, float]]:
    """A 0.5-s sampler's aggregate SMACT on ``gpu``: the sum of the computing runs' activities, read at most
    1.0 (the GPU's SMs all busy), plus noise."""
    rng = random.Random(seed)
    out = []
    for k in range(400):
        ts = k * 0.5
        here = [TRUE[s] for s, g, _, c, e in spans if g == gpu and c <= ts <= e]
        if here:
            out.append((ts, max(0.0, min(1.0, sum(here) + rng.gauss(0, noise)))))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_fit_recovers_each_signature_from_the_mixes(seed: int) -> None:
    spans = _spans(seed)
    runs = [learn.SharedRun(i, (7, s), ("n1", g), st, c, e, 0.53) for i, (s, g, st, c, e) in enumerate(spans)]
    samples = {("n1", g): [learn.Sample(ts, v, 0.5) for ts, v in _samples(spans, g, 0.03, seed)]
               for g in (0, 1)}
    fitted = learn.fit_activity(runs, samples)
    # a signature that computed only on saturated GPUs is not pinned by the data and may stay near its prior;
    # over the four the error is a fraction of the prior's
    mae = sum(abs(fitted[(7, s)] - t) for s, t in TRUE.items()) / len(TRUE)
    prior_mae = sum(abs(0.53 - t) for t in TRUE.values()) / len(TRUE)
    assert mae < 0.1 and mae < prior_mae / 2, (mae, fitted)
    assert sum(abs(fitted[(7, s)] - t) < 0.05 for s, t in TRUE.items()) >= 2, fitted
    # the same runs with no samples keep their prior: nothing is invented
    assert all(v == pytest.approx(0.53) for v in learn.fit_activity(runs, {}).values())


def test_a_shared_runs_time_alone_is_its_computing_time_at_the_models_rate() -> None:
    # two runs of 0.6 computing together on a GPU of capacity 0.75: each progresses at 0.75 / 1.2 = 0.625
    runs = [learn.SharedRun(1, (1, "x"), ("n1", 0), 0.0, 10.0, 110.0, 0.6),
            learn.SharedRun(2, (1, "y"), ("n1", 0), 0.0, 10.0, 110.0, 0.6)]
    samples = {("n1", 0): [learn.Sample(10.0 + k, 1.0, 1.0) for k in range(100)]}
    out = learn.learn(runs, samples, lambda _g: 0.75)
    assert [r.job_id for r in out] == [1, 2] and all(r.shared for r in out)
    for r in out:
        assert r.startup_s == pytest.approx(10.0)
        # saturated samples only: the fit stays at the prior, so L = 1.2 and 100 s count as 62.5 s alone
        assert r.smact == pytest.approx(0.6, abs=0.01)
        assert r.run_s == pytest.approx(10.0 + 100 * 0.75 / (2 * r.smact), rel=0.02)
    alone = learn.learn(runs[:1], {("n1", 0): [learn.Sample(10.0 + k, 0.4, 1.0) for k in range(100)]},
                        lambda _g: 0.75)
    assert not alone[0].shared and alone[0].run_s == pytest.approx(110.0)  # under capacity: no slowdown
    assert alone[0].smact == pytest.approx(0.4, abs=0.01)


def _world(tmp_path: Path, states: Dict[int, str], uid_of: Dict[int, int]) -> config_mod.Config:
    """A state directory with one node database holding ``_spans(5)``'s runs on GPU 0 (an H200) with their
    samples and process memory, and a controller database whose jobs end in ``states``."""
    state = tmp_path / "state"
    (state / "nodes").mkdir(parents=True)
    now = time.time()
    t0 = now - 3600
    spans = [s for s in _spans(5, gpus=1)]
    db = open_node_db(state / "nodes" / "n1.db")
    db["gpus"].insert({"gpu_index": 0, "uuid": "GPU-0", "name": "NVIDIA H200"})
    for i, (_sig, _g, st, c, e) in enumerate(spans, start=1):
        db["job_runs"].insert({"job_id": i, "node": "n1", "gpus": "0", "start_ts": t0 + st, "end_ts": t0 + e})
        # memory ramps up during start-up and holds while computing: computing starts at 90 % of the peak
        db["proc_samples"].insert_all([{"ts": t0 + ts, "gpu_index": 0, "pid": 100 + i, "job_id": i,
                                        "used_mem_mib": min(1.0, (ts - st) / (c - st)) * 2000.0, "n": 1,
                                        "res_s": 0.5}
                                       for ts in [st + 0.5 * k for k in range(int((e - st) / 0.5))]])
    db["gpu_samples"].insert_all([{"ts": t0 + ts, "gpu_index": 0, "smact_pct": 100.0 * v, "n": 1,
                                   "res_s": 0.5} for ts, v in _samples(spans, 0, 0.02, 5)])
    db.conn.close()
    ctld = open_ctld_db(state / "ctld.db")
    ctld["jobs"].insert_all([{"job_id": i, "uid": uid_of.get(i, 2001), "end_ts": t0 + e,
                              "state": states.get(i, "COMPLETED"),
                              "coloc_json": json.dumps({"sha256": sig * 64})}
                             for i, (sig, _g, _s, _c, e) in enumerate(spans, start=1)])
    ctld.conn.close()
    return config_mod.Config(state_dir=str(state))


def test_history_learns_from_shared_runs_in_real_databases(tmp_path: Path) -> None:
    cfg = _world(tmp_path, {}, {})
    timing: dict = {}
    by_model = ModelRuns()
    cal = intensity.load_calibration()
    hist = read_history(cfg, timing, None, None, by_model, cal)
    identified = 0
    for sig, truth in TRUE.items():
        key = (2001, intensity.signature({"sha256": sig * 64}))
        assert key in hist, sig
        assert all(7.0 <= start_s <= 9.0 < run_s for run_s, start_s in timing[key])  # 8 s start-up
        prof = profile(jc({"sha256": sig * 64}), hist, timing, 2001, "NVIDIA H200", by_model)
        assert prof.smact == hist[key][0].smact and prof.startup_s is not None  # kept under its GPU model
        got = hist[key][0].smact
        if got == pytest.approx(cal.smact_floor):
            continue  # too few clean unsaturated seconds: kept at its prior, never learned lighter
        identified += 1
        assert got == pytest.approx(truth, abs=0.1), (sig, got)
    assert identified >= 1
    # another user's learned runs never steer this user's job
    other = profile(jc({"sha256": "a" * 64}), hist, timing, 2002, "", by_model)
    assert other.smact is None


def test_killed_cancelled_and_oomed_runs_never_count_as_a_profile(tmp_path: Path) -> None:
    bad = {1: "CANCELLED", 5: "OUT_OF_MEMORY", 2: "TIMEOUT", 6: "PREEMPTED", 3: "FAILED", 4: "NODE_FAIL"}
    cfg = _world(tmp_path, bad, {})
    hist = read_history(cfg, {}, None, None, None, intensity.load_calibration())
    assert hist == {}  # every run of every signature ended badly: nothing learned, nothing alone
    cfg = _world(tmp_path / "b", {1: "CANCELLED"}, {})  # job 1 (signature a) cancelled, job 5 (a) completed
    hist = read_history(cfg, {}, None, None, None, intensity.load_calibration())
    assert len(hist[(2001, intensity.signature({"sha256": "a" * 64}))]) == 1


def test_history_is_capped_per_signature_and_per_user(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _world(tmp_path, {}, {1: 2002, 2: 2002})
    monkeypatch.setattr(history, "RUNS_PER_KEY", 1)
    monkeypatch.setattr(history, "KEYS_PER_USER", 2)
    timing: dict = {}
    by_model = ModelRuns()
    hist = read_history(cfg, timing, None, None, by_model, intensity.load_calibration())
    per_uid: Dict[int, int] = {}
    for (uid, _sig), runs in hist.items():
        assert len(runs) == 1 and len(timing[(uid, _sig)]) == 1
        per_uid[uid] = per_uid.get(uid, 0) + 1
    # uid 2001 ran four signatures: two kept; uid 2002's two keys are untouched by 2001's flood
    assert per_uid == {2001: 2, 2002: 2}
    assert all(len([k for k in m if k[0] == 2001]) <= 2 for m in by_model.activity.values())


def test_the_live_reading_corrects_settled_tenants_never_measured() -> None:
    from slurm_coloc.placement import rounds, share
    from slurm_coloc.placement.policies import Activity, GpuState

    now = 10_000.0
    never = Profile(None)
    a, b = Tenant(never, now - 60, 0.53, 1), Tenant(never, now - 60, 0.53, 2)
    since = now - 4.0  # a 4-s live window
    fixed = rounds.live_corrected([a, b], 0.4, since, learn.UNSATURATED)
    assert [t.predicted for t in fixed] == [pytest.approx(0.2), pytest.approx(0.2)]
    # heavier than predicted: corrected upwards too
    assert [t.predicted for t in rounds.live_corrected([a, b], 0.8, since, learn.UNSATURATED)] == \
        [pytest.approx(0.4), pytest.approx(0.4)]
    # saturated: activities no longer add, nothing is learned
    assert rounds.live_corrected([a, b], 0.95, since, learn.UNSATURATED) == [a, b]
    # a tenant still starting keeps its prediction and is not subtracted (the settled ones get the rest)
    young = Tenant(never, now - 5, 0.53, 3)
    measured = Tenant(Profile(0.3, 40.0, 10.0), now - 60, 0.3, 4)
    out = rounds.live_corrected([a, young, measured], 0.5, since, learn.UNSATURATED)
    assert out[1] == young and out[2] == measured and out[0].predicted == pytest.approx(0.2)
    gone = Tenant(never, now - 90, 0.53, 5, end_ts=now - 20)
    assert rounds.live_corrected([gone], 0.1, since, learn.UNSATURATED) == [gone]  # only present ones
    # what it changes: two settled jobs reading 0.4 leave room for two more predicted at 0.53 under bound 2 on
    # an H200 (capacity 0.75: 1.46 <= 1.5), where their predictions alone (2 x 0.53 + 0.53) held the second
    g = GpuState("n1", 0, 140, 10, 2, Activity(0.4), 1.0)
    job = Profile(None)
    assert not share.choose_gpu_bounded([g], [[a, b, young]], 4, job, Activity(0.53), 0.75, 2.0, now).placed
    d = share.choose_gpu_bounded([g], [[*fixed, young]], 4, job, Activity(0.53), 0.75, 2.0, now)
    assert d.placed and d.basis == "slowdown-predicted"


RECORDED = Path(__file__).resolve().parents[1] / "benchmarks/device/results/h200x2-placement-learn"


def test_on_a_recording_of_2x_h200_shared_runs_the_learned_profiles_track_the_runs_alone() -> None:
    """Recorded on the real GPUs (2x H200, 2026-11-28): the fresh pile's first, cold pass (14 jobs, 7 per GPU,
    every run shared) and the same jobs' exclusive pass. What the placer learns from the shared pass alone is
    within the errors docs/benchmarks.md states, and far closer than the prior."""
    from benchmarks import placement_learn

    excl = json.loads((RECORDED / "exclusive-and-blind" / "mix-exclusive.json").read_text())
    cold = json.loads((RECORDED / "cold-and-again" / "mix-throughput.json").read_text())
    errs = placement_learn.learned_errors(RECORDED / "cold-and-again" / "state.tgz", [cold], excl, "H200")
    assert len(errs) == 14 and all(e["shared"] for e in errs)
    # the signatures the mixes pin (8 of 14 here; the others keep their prior, never learned lighter)
    pinned = [e for e in errs if e["identified"]]
    mae = sum(abs(e["smact_err"]) for e in pinned) / len(pinned)
    floor = intensity.load_calibration().smact_floor
    prior = sum(abs(floor - e["smact_alone"]) for e in pinned) / len(pinned)
    assert len(pinned) >= 6 and mae < 0.08 and mae < prior / 2, (len(pinned), mae, prior)
    assert sum(abs(e["run_s_rel_err"]) for e in errs) / len(errs) < 0.15


def test_a_learned_profile_moves_only_its_own_users_placement() -> None:
    """A user whose signature looked light while it was learned (0.1, as a job that idles while measured
    would) is trusted for their own jobs only: beside another user's job it counts at least the floor."""
    from slurm_coloc.placement import share
    from slurm_coloc.placement.policies import Activity, GpuState

    now, floor, cap = 10_000.0, 0.53, 0.75
    light = Profile(0.1, 60.0, 10.0, learned=True)
    measured = Profile(0.6, 60.0, 10.0)  # measured alone: trusted for everyone
    g = GpuState("n1", 0, 140, 12, 3, Activity(0.5), 1.0)
    mine = [Tenant(measured, now - 40, 0.6, 1, uid=2001),
            Tenant(light, now - 40, 0.1, 2, uid=2001), Tenant(light, now - 40, 0.1, 3, uid=2001)]
    job = Profile(0.1, 60.0, 10.0, learned=True)
    # the same user: 0.6 + 0.1 + 0.1 + 0.1 = 0.9 -> 1.2x, placed
    d = share.choose_gpu_bounded([g], [mine], 4, job, Activity(0.1), cap, 2.0, now, 2001, floor)
    assert d.placed and "slowdown 1.20" in d.reason
    # another user's tenants that are learned count at least 0.53 for user 2002's job: 0.6 + 2 x 0.53 + 0.1
    # = 1.76 -> 2.35 > 2, held
    other = Profile(0.1, 60.0, 10.0)  # user 2002's own job, measured alone
    d = share.choose_gpu_bounded([g], [mine], 4, other, Activity(0.1), cap, 2.0, now, 2002, floor)
    assert not d.placed and "2.35 > 2" in d.reason
    # and user 2001's light job beside user 2002's measured tenant counts at least the floor itself
    theirs = [Tenant(measured, now - 40, 0.6, 4, uid=2002), Tenant(measured, now - 40, 0.6, 5,
                                                                   uid=2002)]
    d = share.choose_gpu_bounded([g], [theirs], 4, job, Activity(0.1), cap, 2.0, now, 2001, floor)
    assert not d.placed and "2.31 > 2" in d.reason  # 0.6 + 0.6 + its floored 0.53
    d = share.choose_gpu_bounded([g], [theirs[:1]], 4, job, Activity(0.1), cap, 2.0, now, 2001, floor)
    assert d.placed and "slowdown 1.51" in d.reason  # 0.6 + 0.53: within the bound


def test_the_placer_knows_which_profiles_were_learned(tmp_path: Path) -> None:
    cfg = _world(tmp_path, {}, {})
    timing: dict = {}
    by_model = ModelRuns()
    hist = read_history(cfg, timing, None, None, by_model, intensity.load_calibration())
    prof = profile(jc({"sha256": "d" * 64}), hist, timing, 2001, "NVIDIA H200", by_model)
    assert prof.smact is not None and prof.learned
    assert not profile(jc({"sha256": "d" * 64}), {(2001, intensity.signature({"sha256": "d" * 64})): [
        intensity.Activity(0.5)]}, {}, 2001).learned  # a history without by_model marks is measured alone


@pytest.mark.parametrize("value", [1.5, -0.1, "high", [0.3]])
def test_a_garbage_unmeasured_floor_is_one_config_error_and_nothing_changes(tmp_path: Path,
                                                                            value: object) -> None:
    from slurm_coloc.errors import ConfigError

    bad = tmp_path / "cal.json"
    packaged = json.loads(intensity.DEFAULT_CALIBRATION.read_text())
    text = json.dumps({**packaged, "unmeasured_smact_floor": value})
    bad.write_text(text)
    with pytest.raises(ConfigError) as err:
        intensity.load_calibration(str(bad))
    assert "cal.json" in err.value.one_line() and "\n" not in err.value.one_line()
    assert bad.read_text() == text  # read only
    assert intensity.load_calibration().smact_floor == pytest.approx(0.5291)  # the packaged default: unknown
