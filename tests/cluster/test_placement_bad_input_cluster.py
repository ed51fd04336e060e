"""coloc-placer's ``throughput`` policy on bad input, on a real Slurm cluster with typed shards (2 slurmd x 2
fake GPUs, ``COLOC_SLURM``): missing, corrupt or stale history, a GPU whose sampler is silent, a job without
FLOPs or signature. Each time the placer places by memory (or, where it has to wait, releases the job by
memory once ``placement_max_wait_s`` has passed) and says so in one log line, however many rounds run.

GPU state is written into the node databases as in ``test_placement_cluster.py`` (whose fixtures and helpers
this module uses: an H100 recording for light GPUs, synthetic rows at SM activity 85 % for a saturated one).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from slurm_coloc import config as config_mod
from slurm_coloc.placement import intensity
from slurm_coloc.placement.daemon import PlacerState, place_round
from slurm_coloc.placement.intensity import signature
from tests.cluster import test_placement_cluster as base
from tests.cluster.test_placement_cluster import _cfg, gpu_of, occupy, write_samples
from tests.slurm_cluster import Cluster

typed_cluster = base.typed_cluster  # the same fixtures: a cluster of this module's own
cl = base.cl

pytestmark = pytest.mark.slurm
SHA = "ab" * 32
SIG = signature({"sha256": SHA})


def comment(place: bool, sha: Optional[str] = SHA) -> str:
    c: Dict[str, Any] = {"mode": "shard", "shards": 4, "v": 1}
    if place:
        c["place"] = True
    if sha:
        c["sha256"] = sha
    return "coloc:" + json.dumps(c, separators=(",", ":"))


def submit(cl: Cluster, place: bool = True, sha: Optional[str] = SHA, node: str = "n1",
           index: int = 0) -> int:
    """A held placer job (``place``), or a running shard job of the same signature on ``node``/GPU
    ``index``."""
    argv = ["sbatch", "--parsable", "--wrap=sleep 120", "-o", "/dev/null", "--comment=" + comment(place, sha)]
    argv += ["--hold"] if place else [f"--gres=shard:g{index}:4", f"--nodelist={node}"]
    out = cl.run(argv)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip())


def tcfg(cl: Cluster, **kw: Any) -> config_mod.Config:
    return replace(_cfg(cl), placement_policy="throughput", **kw)


def lines(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(text in r.getMessage() for r in caplog.records)


def history_file(path: Path, age_days: float = 0.0) -> Path:
    """The job signature measured alone at SM activity 90 % for 300 s (two of them and a third exceed 2x)."""
    path.write_text(json.dumps({"signatures": {SIG: {"smact": 0.9, "smocc": 0.5, "drama": 0.5, "run_s": 300,
                                                     "startup_s": 10}}}))
    t = time.time() - age_days * 86400
    os.utime(path, (t, t))
    path.chmod(0o644)
    return path


def two_tenants_rest_full(cl: Cluster) -> List[int]:
    """n1/gpu0 holds two running jobs of the signature; the three other GPUs are taken whole."""
    ids = [submit(cl, place=False) for _ in range(2)] + occupy(cl, [("n1", 1), ("n2", 0), ("n2", 1)])
    for j in ids[:2]:
        cl.wait_state(j, ("RUNNING",), 40)
    return ids


@pytest.mark.parametrize("kind", ["missing", "corrupt"])
def test_missing_or_corrupt_history_file_places_by_memory_with_one_line(
        cl: Cluster, tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "history.json"
    if kind == "corrupt":
        path.write_text('{"signatures": {"' + SIG + '": {"smact": 0.9,')
    cfg = tcfg(cl, placement_history_path=str(path))
    state = PlacerState()
    caplog.set_level("INFO", logger="slurm_coloc.placer")
    jobs = []
    t = time.time()
    for k in range(3):  # each round re-reads history (60 s apart)
        jobs.append(submit(cl))
        counts = place_round(cfg, state, env=cl.env, now=t + 61 * k)
        assert counts["placed"] == 1 and counts["errors"] == 0, counts
    assert lines(caplog, "cannot read placement_history_path") == 1
    assert lines(caplog, "(empty-gpu") == 3  # nothing to predict from: free GPUs by memory
    assert len({gpu_of(cl, j) for j in jobs}) == 3  # spread by memory over the empty GPUs


def test_stale_history_is_ignored_and_a_job_at_the_bound_is_released_by_max_wait(
        cl: Cluster, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    two_tenants_rest_full(cl)
    caplog.set_level("INFO", logger="slurm_coloc.placer")
    # fresh history: 0.9 x 3 = 2.7 -> slowdown 3.60 > 2 (a GPU whose model no sampler named yet gets the least
    # capacity of any model, the H200's 0.75): the job waits, with the reason shown to the user
    fresh = tcfg(cl, placement_history_path=str(history_file(tmp_path / "fresh.json")),
                 placement_max_wait_s=4.0)
    job = submit(cl)
    state = PlacerState()
    counts = place_round(fresh, state, env=cl.env)
    assert counts["waiting"] == 1 and counts["placed"] == 0, counts
    shown = cl.run(["squeue", "-h", "-j", str(job), "-o", "%k"], user=None).stdout
    assert "coloc-wait:every GPU with room is at its bound: n1/gpu0 slowdown 3.60 > 2" in shown, shown
    time.sleep(4.5)  # past placement_max_wait_s: released by memory, never held longer
    counts = place_round(fresh, state, env=cl.env)
    assert counts["memory_only"] == 1, counts
    cl.wait_state(job, ("RUNNING",), 40)
    # stale history (40 days, the limit is 30): ignored with one line; without history the three tenants count
    # with their predicted activity (0.53 each), so the next job waits at the bound instead of going by memory
    # (a GPU packed by memory alone ran one job 4.29x its time alone)
    stale = tcfg(cl, placement_history_path=str(history_file(tmp_path / "stale.json", age_days=40)))
    state = PlacerState()
    submit(cl)
    for _ in range(2):
        counts = place_round(stale, state, env=cl.env)
        assert counts["waiting"] == 1 and counts["placed"] == 0, counts
    assert lines(caplog, "is stale") == 1
    cal = intensity.load_calibration()  # 0.53 each: three tenants and the job, the least capacity (0.75)
    slow = 4 * cal.smact_floor / cal.capacity_for("")
    assert lines(caplog, f"n1/gpu0 slowdown {slow:.2f} > 2 (predicted activity)") == 1  # once


def test_silent_sampler_gpu_takes_jobs_by_the_model_with_one_line(cl: Cluster,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    tenants = [submit(cl, place=False, sha=None, node="n1", index=i) for i in (0, 1)]
    for j in tenants:
        cl.wait_state(j, ("RUNNING",), 40)
    occupy(cl, [("n2", 0), ("n2", 1)])
    write_samples(cl, "n1", 0, "saturated")  # fresh and saturated; n1/gpu1 has no sample at all (silent)
    caplog.set_level("INFO", logger="slurm_coloc.placer")
    state = PlacerState()
    jobs = []
    for _ in range(2):
        # a signature no earlier test of this module ran (their runs of SHA may have had a GPU alone while
        # this test's saturated rows were written, which would give SHA a measured history): the sharing model
        # with predicted activity decides, whatever each sampler says (saturated, or silent)
        jobs.append(submit(cl, sha="cd" * 32))
        counts = place_round(tcfg(cl), state, env=cl.env)
        assert counts["placed"] == 1, counts
    assert [gpu_of(cl, j) for j in jobs] == [("n1", 0), ("n1", 1)]  # one each: 1.06 / 0.75, then the other
    assert lines(caplog, "sampler silent") == 1 and lines(caplog, "(slowdown-predicted, slowdown 1.41)") == 2


def test_job_without_flops_or_signature_is_placed_by_memory_with_one_line(
        cl: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    tenant = submit(cl, place=False, sha=None)
    cl.wait_state(tenant, ("RUNNING",), 40)
    occupy(cl, [("n1", 1), ("n2", 0), ("n2", 1)])
    write_samples(cl, "n1", 0, "saturated")
    caplog.set_level("INFO", logger="slurm_coloc.placer")
    job = submit(cl, sha=None)
    state = PlacerState()
    counts = place_round(tcfg(cl), state, env=cl.env)
    assert counts["placed"] == 1, counts  # no data to predict from: memory decides, the gate does not hold it
    assert gpu_of(cl, job) == ("n1", 0)
    assert lines(caplog, f"job {job} has no signature and no FLOPs: placed by memory") == 1


LIGHT_SHA = "5a" * 32  # a signature of colocuser's, learned light from shared runs only


def _learned_light_history(cl: Cluster) -> List[int]:
    """Two finished COMPLETED runs of colocuser's ``LIGHT_SHA`` that shared n2/gpu1 for 100 s while it read
    SM activity 0.2 (so each is learned at about 0.1): rows in ctld.db and n2's database, ids far above
    Slurm's."""
    import pwd

    from slurm_coloc.store.db import open_ctld_db, open_node_db

    uid = pwd.getpwnam("colocuser").pw_uid
    t0 = time.time() - 600
    ids = [990001, 990002]
    ctld = open_ctld_db(_cfg(cl).ctld_db_path)
    coloc = json.dumps({"mode": "shard", "shards": 4, "v": 1, "sha256": LIGHT_SHA})
    ctld["jobs"].insert_all([{"job_id": j, "uid": uid, "end_ts": t0 + 110, "state": "COMPLETED",
                              "coloc_json": coloc} for j in ids], replace=True)
    ctld.conn.close()
    node = open_node_db(cl.node_db("n2"))
    node["job_runs"].insert_all([{"job_id": j, "node": "n2", "gpus": "1", "start_ts": t0,
                                  "end_ts": t0 + 110, "state": "COMPLETED"} for j in ids], replace=True)
    node["gpu_samples"].insert_all([{"ts": t0 + 10 + 0.5 * k, "gpu_index": 1, "smact_pct": 20.0, "n": 1,
                                     "res_s": 0.5} for k in range(200)])
    node.conn.close()
    return ids


def test_a_user_whose_runs_were_learned_light_moves_only_their_own_jobs(
        cl: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    """Bad input: colocuser's signature looked light in its shared runs (learned ~0.1; a job that
    idles while it is measured would look the same). Three such jobs hold n1/gpu0 (the other GPUs are taken).
    colocuser's next job of that signature joins them (0.4 in all); colocuser2's job, never measured, does
    not: another user's learned activity counts at least the floor (0.53) for it, 4 x 0.53 / 0.75 > 2."""
    fake = _learned_light_history(cl)
    occupy(cl, [("n1", 1), ("n2", 0), ("n2", 1)])
    tenants = [submit(cl, place=False, sha=LIGHT_SHA, node="n1", index=0) for _ in range(3)]
    for j in tenants:
        cl.wait_state(j, ("RUNNING",), 40)
    caplog.set_level("INFO", logger="slurm_coloc.placer")
    theirs = cl.run(["sbatch", "--parsable", "--wrap=sleep 120", "-o", "/dev/null", "--hold",
                     "--comment=" + comment(True, "6b" * 32)], user="colocuser2")
    assert theirs.returncode == 0, theirs.stderr
    other = int(theirs.stdout.strip())
    counts = place_round(tcfg(cl), PlacerState(), env=cl.env)
    assert counts["placed"] == 0 and counts["waiting"] == 1, counts  # colocuser2's job holds at the bound
    assert cl.job(other)["state_reason"] == "JobHeldAdmin"
    mine = submit(cl, place=True, sha=LIGHT_SHA)
    counts = place_round(tcfg(cl), PlacerState(), env=cl.env)
    assert counts["placed"] == 1, counts
    assert gpu_of(cl, mine) == ("n1", 0)  # history SMACT ~0.1 x 4: colocuser's own jobs pack
    assert lines(caplog, f"job {mine} (4 shards, history SMACT 0.1") == 1
    from slurm_coloc.store.db import open_ctld_db, open_node_db

    ctld = open_ctld_db(_cfg(cl).ctld_db_path)
    ctld.execute(f"DELETE FROM jobs WHERE job_id IN ({fake[0]}, {fake[1]})")
    ctld.conn.commit()
    ctld.conn.close()
    node = open_node_db(cl.node_db("n2"))
    node.execute(f"DELETE FROM job_runs WHERE job_id IN ({fake[0]}, {fake[1]})")
    node.conn.commit()
    node.conn.close()
