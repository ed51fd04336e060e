"""History per GPU model (``placement/history.py`` ``ModelRuns``): a job's profile on a GPU comes from its
runs alone on that GPU's model where there are any, else from all its runs. On 2x H200 with the 2x H100 runs
as history the product needed 81 s on the issue-sized pile, against 69-71 s with the H200's own runs
(docs/benchmarks.md, "The best split measured"). These tests check the selection on real SQLite files and in
the placer's round, without a GPU."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from slurm_coloc import config as config_mod
from slurm_coloc.comment import JobComment
from slurm_coloc.errors import ConfigError
from slurm_coloc.placement import intensity
from slurm_coloc.placement.daemon import gpu_tenants
from slurm_coloc.placement.history import ModelRuns, profile, read_history, read_history_file
from slurm_coloc.placement.policies import Activity, Gate, GpuState, Profile, Tenant
from slurm_coloc.placement.rounds import PlacerState, Round
from slurm_coloc.slurm.jobinfo import parse_squeue_json
from slurm_coloc.store.db import open_ctld_db, open_node_db

jc = JobComment.from_fields  # a coloc JSON object as the placer reads it

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
NOW = 1000.0
COLOC = {"sha256": "c" * 64}
SIG = intensity.signature(COLOC)


def _node_db(path: Path, name: str, runs: list, now: float) -> None:
    """A node database whose GPU 0 is ``name`` and whose alone runs are ``(job_id, run_s, smact_pct)``."""
    db = open_node_db(path)
    db["gpus"].insert_all([{"gpu_index": 0, "uuid": f"GPU-{path.stem}", "name": name}])
    t = now - 1000
    for job_id, run_s, smact_pct in runs:
        db["job_runs"].insert({"job_id": job_id, "node": path.stem, "gpus": "0", "start_ts": t,
                               "end_ts": t + run_s})
        db["gpu_samples"].insert_all([{"ts": t + 2 + k, "gpu_index": 0, "smact_pct": smact_pct,
                                       "smocc_pct": 20.0, "dram_bw_pct": 10.0, "mem_used_mib": 900.0, "n": 1,
                                       "res_s": 1.0} for k in range(int(run_s) - 3)])
        t += run_s + 5
    db.conn.close()


def test_node_database_runs_are_kept_per_gpu_model_and_the_profile_follows_the_gpu(tmp_path: Path) -> None:
    now = time.time()
    state = tmp_path / "state"
    (state / "nodes").mkdir(parents=True)
    _node_db(state / "nodes" / "a.db", H100, [(1, 40.0, 50.0), (2, 44.0, 50.0)], now)
    _node_db(state / "nodes" / "b.db", H200, [(3, 30.0, 40.0)], now)
    ctld = open_ctld_db(state / "ctld.db")
    ctld["jobs"].insert_all([{"job_id": j, "uid": 2001, "end_ts": now, "coloc_json": json.dumps(COLOC),
                              "state": "COMPLETED"}
                             for j in (1, 2, 3)])
    ctld.conn.close()
    cfg = config_mod.Config(state_dir=str(state))
    timing: dict = {}
    by_model = ModelRuns()
    hist = read_history(cfg, timing, now, None, by_model)
    key = (2001, SIG)
    assert len(hist[key]) == 3 and len(timing[key]) == 3  # every run, whatever its GPU
    assert set(by_model.timing) == {H100, H200} and len(by_model.timing[H100][key]) == 2
    on_h200 = profile(jc(COLOC), hist, timing, 2001, H200, by_model)
    on_h100 = profile(jc(COLOC), hist, timing, 2001, H100, by_model)
    anywhere = profile(jc(COLOC), hist, timing, 2001)
    assert on_h200.run_s == pytest.approx(30.0) and on_h200.smact == pytest.approx(0.4)
    assert on_h100.run_s == pytest.approx(42.0) and on_h100.smact == pytest.approx(0.5)
    assert anywhere.run_s == pytest.approx(38.0)  # no model named: the mean of all three runs
    # a model without runs of this job: all its runs, as before; another user: none of them
    assert profile(jc(COLOC), hist, timing, 2001, "NVIDIA A100-SXM4-80GB", by_model) == anywhere
    assert profile(jc(COLOC), hist, timing, 2002, H200, by_model) == Profile(None)


def test_history_file_gpu_models_section(tmp_path: Path) -> None:
    path = tmp_path / "hist.json"
    path.write_text(json.dumps({
        "signatures": {"aa": {"smact": 0.6, "smocc": 0.3, "drama": 0.2, "run_s": 40, "startup_s": 12}},
        "gpu_models": {H200: {"aa": {"smact": 0.5, "smocc": 0.3, "drama": 0.2, "run_s": 28, "startup_s": 11},
                              "bb": {"smact": 0.2, "smocc": 0.1, "drama": 0.1, "run_s": 20}},
                       H100: {"bb": {"smact": 0.4, "smocc": 0.1, "drama": 0.1, "run_s": 30},
                              "bad": {"smact": 7}}}}))
    timing: dict = {}
    models: dict = {}
    acts = read_history_file(str(path), timing, models)
    assert acts["aa"] == Activity(0.6, 0.3, 0.2)  # the plain entry stands for any model
    assert acts["bb"].smact == pytest.approx(0.3) and "bad" not in acts  # only per model: their mean
    assert timing == {"aa": [(40.0, 12.0)], "bb": [(20.0, None), (30.0, None)]}
    assert models[H200]["aa"] == (Activity(0.5, 0.3, 0.2), (28.0, 11.0)) and set(models[H100]) == {"bb"}
    cfg = config_mod.Config(state_dir=str(tmp_path / "state"), placement_history_path=str(path))
    by_model = ModelRuns()
    hist = read_history(cfg, {}, None, None, by_model)  # the admin's file: uid None, for everyone
    assert hist[(None, "aa")] == [Activity(0.6, 0.3, 0.2)]
    assert by_model.timing[H200][(None, "aa")] == [(28.0, 11.0)]
    assert set(by_model.activity[H100]) == {(None, "bb")}
    path.write_text(json.dumps({"signatures": {}, "gpu_models": {H200: ["not", "an", "object"]}}))
    with pytest.raises(ConfigError, match="gpu_models"):
        read_history_file(str(path))
    assert read_history(cfg, None, None, set(), ModelRuns()) == {}  # a bad file never stops the placer


def _gpu(index: int, model: str, tenants: int = 1) -> GpuState:
    return GpuState("n1", index, 80, 4 * tenants, tenants, Activity(0.3), 1.0, model=model)


def test_the_round_judges_each_gpu_with_the_job_s_runs_on_its_model() -> None:
    """Bound 1.5, one tenant of SM activity 0.5 alone on each GPU. Measured on the H100 the job is 0.9 active
    alone: (0.5 + 0.9) / 1.03 = 1.36, within the bound; on the H200 (capacity 0.75 in the calibration) it is
    1.0 (made up to tell the two apart): (0.5 + 1.0) / 0.75 = 2.0, past it. The round must judge each GPU with
    that GPU's runs, and keep for the job it steered the profile of the GPU it chose."""
    cal = intensity.load_calibration()
    state = PlacerState(history={(None, SIG): [Activity(0.9)]}, timing={(None, SIG): [(40.0, 10.0)]})
    state.by_model.add(H100, (None, SIG), Activity(0.9), (40.0, 10.0))
    state.by_model.add(H200, (None, SIG), Activity(1.0), (25.0, 8.0))
    cfg = config_mod.Config(placement_policy="throughput", placement_max_slowdown=1.5)
    comment = "coloc:" + json.dumps({"mode": "shard", "shards": 4, "v": 1, "place": True, **COLOC})
    job = parse_squeue_json(json.dumps({"jobs": [{"job_id": 9, "job_state": "PENDING", "user_id": 2001,
                                                  "submit_time": NOW - 5, "comment": comment}]}))[0]
    tenant = Tenant(Profile(0.5, 60.0, 5.0), NOW - 10, 0.5, 1)
    rnd = Round(cfg, state, cal, Gate(), [_gpu(0, H200), _gpu(1, H100)], [[tenant], [tenant]], True, NOW)
    c = rnd.decide(job, 4)
    d, prof = c.decision, c.profile
    assert d.placed and d.index == 1, d.reason  # the H100
    assert prof == Profile(0.9, 40.0, 10.0)
    state.by_model.activity[H200][(None, SIG)] = [Activity(0.2)]
    c = rnd.decide(job, 4)
    d, prof = c.decision, c.profile
    # lighter on the H200: (0.5 + 0.2) / 0.75 < 1, the lower predicted slowdown
    assert d.placed and d.index == 0 and prof == Profile(0.2, 25.0, 8.0)
    # a tenant's profile is asked for with the model of the GPU it holds
    running = parse_squeue_json(json.dumps({"jobs": [{
        "job_id": 7, "job_state": "RUNNING", "nodes": "n1", "start_time": 990, "user_id": 2001,
        "gres_detail": ["shard:g0:4(IDX:0)"]}]}))
    asked: list = []

    def known(_job: object, model: str) -> tuple:
        asked.append(model)
        return Profile(None), 0.5

    gpu_tenants([_gpu(0, H200, 0)], running, {}, known, NOW)
    assert asked == [H200]
