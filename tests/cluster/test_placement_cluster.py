"""coloc-placer on a real Slurm cluster (``COLOC_SLURM``) with typed shards (2 slurmd x 2 fake GPUs,
``COLOC_GRES_TYPED=1``).

The GPUs are fake, so their live state is written into the node databases: light GPUs get the frames of the
H100 recording ``tests/data/nvml/h100_mps_2jobs.jsonl`` (two MPS clients, SM activity ~15 %), re-stamped to
now; a saturated GPU gets rows at SM activity 85 % (the top of what the 14-job pile read on the H100, issue
text) with SM occupancy 50 % and DRAM activity 45 %, which are synthetic values above the gate (no saturated
recording exists yet). Rounds are run in-process (``place_round``) so each test decides when the placer acts.
"""
from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

from slurm_coloc import config as config_mod
from slurm_coloc.nvml.readings import Frame
from slurm_coloc.placement.daemon import PlacerState, place_round
from slurm_coloc.slurm.parse import gres_detail_counts
from slurm_coloc.store import samples as store_samples
from slurm_coloc.store.db import open_node_db
from tests.slurm_cluster import Cluster, start_cluster, stop_cluster

pytestmark = pytest.mark.slurm
RECORDING = Path(__file__).parents[1] / "data" / "nvml" / "h100_mps_2jobs.jsonl"
PLACE = 'coloc:{"mode":"shard","place":true,"shards":%d,"v":1}'


@pytest.fixture(scope="module")
def typed_cluster() -> Iterator[Cluster]:
    import os
    if os.geteuid() != 0:
        pytest.skip("the local Slurm cluster needs root")
    cluster = start_cluster({"COLOC_GRES_TYPED": "1"})
    with open(cluster.coloc_config, "a") as f:
        # the gate policy's tests (test_placement_bad_input_cluster.py covers the throughput policy)
        f.write("sampler_autostart: false\nplacement_state_max_age_s: 60\nplacement_window_s: 30\n"
                "placement_policy: gate\n")
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


@pytest.fixture()
def cl(typed_cluster: Cluster) -> Iterator[Cluster]:
    from slurm_coloc.placement.heartbeat import heartbeat_paths

    beats = heartbeat_paths(_cfg(typed_cluster))
    for beat in beats:
        beat.unlink(missing_ok=True)
    yield typed_cluster
    for beat in beats:
        beat.unlink(missing_ok=True)
    ids = [str(j) for j in typed_cluster.job_ids()]
    if ids:
        typed_cluster.run(["scancel", *ids], user=None)
    for node in ("n1", "n2"):
        path = typed_cluster.node_db(node)
        if path.exists():
            db = open_node_db(path)
            store_samples.purge(db, time.time() + 10)
            db.conn.close()


def _cfg(cl: Cluster) -> config_mod.Config:
    return config_mod.load(str(cl.coloc_config), environ={})


def write_samples(cl: Cluster, node: str, index: int, kind: str, age_s: float = 0.0) -> None:
    """30 s of GPU rows ending ``age_s`` ago: ``light`` from the H100 recording, ``saturated`` synthetic."""
    lines = [json.loads(x) for x in RECORDING.read_text().splitlines()[1:]]
    frames = [Frame.from_json(x, ts=0.0) for x in lines if x["gpus"][0].get("smact_pct")]
    end = time.time() - age_s
    rows: List[dict] = []
    for k in range(30):
        g = frames[k % len(frames)].gpus[0]
        if kind == "saturated":
            g = replace(g, smact_pct=85.0, smocc_pct=50.0, dram_bw_pct=45.0)
        rows += store_samples.gpu_rows(end - 29 + k, [replace(g, index=index)], 1.0)
    db = open_node_db(cl.node_db(node))
    store_samples.write_rows(db, rows, [])
    db.conn.close()


def submit_held(cl: Cluster, shards: int, gres: Optional[str] = None, node: Optional[str] = None,
                seconds: int = 120) -> int:
    """A job as coloc-sbatch submits it for the placer (held, no GRES, comment with ``place``), or, with
    ``gres``, a plain running job that holds a GPU (``gpu:g1:1``) on ``node``."""
    argv = ["sbatch", "--parsable", f"--wrap=sleep {seconds}", "-o", "/dev/null"]
    if gres:
        argv += [f"--gres={gres}", f"--nodelist={node}"]
    else:
        argv += ["--hold", "--comment=" + PLACE % shards]
    out = cl.run(argv)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip())


def gpu_of(cl: Cluster, job_id: int, timeout: float = 40) -> Tuple[str, int]:
    """(node, GPU index) a job runs on, from ``scontrol show job -d`` once it runs: the per-node ``GRES=``
    item in either version's form (22.05 ``shard:g0:4(IDX:0)``, 24.11+ ``shard:g0:4(4/80,0/80)``:
    ``gres_detail_counts``)."""
    j = cl.wait_state(job_id, ("RUNNING",), timeout)
    detail = cl.scontrol("show", "job", "-d", str(job_id))
    items = __import__("re").findall(r"\bGRES=((?:shard|gpu):g\d+:[1-9]\d*\([^)]*\))", detail)
    idx = [i for name, _t, per in gres_detail_counts(items) if name in ("gpu", "shard")
           for i, n in sorted(per.items()) if n]
    assert len(idx) == 1, detail
    return j["nodes"], idx[0]


def run_round(cl: Cluster, state: PlacerState) -> Dict[str, int]:
    return place_round(_cfg(cl), state, env=cl.env)


def occupy(cl: Cluster, gpus: List[Tuple[str, int]]) -> List[int]:
    ids = [submit_held(cl, 0, gres=f"gpu:g{i}:1", node=n) for n, i in gpus]
    for j in ids:
        cl.wait_state(j, ("RUNNING",), 40)
    return ids


def test_light_jobs_spread_across_the_four_gpus(cl: Cluster) -> None:
    for node in ("n1", "n2"):
        for i in (0, 1):
            write_samples(cl, node, i, "light")
    jobs = [submit_held(cl, 4) for _ in range(4)]
    assert cl.job(jobs[0])["state_reason"] == "JobHeldUser"
    counts = run_round(cl, PlacerState())
    assert counts["placed"] == 4, counts
    assert sorted(gpu_of(cl, j) for j in jobs) == [("n1", 0), ("n1", 1), ("n2", 0), ("n2", 1)]


def test_saturated_gpu_takes_no_tenant_job_waits_with_reason_then_starts(cl: Cluster) -> None:
    tenant = submit_held(cl, 0, gres="shard:g0:4", node="n1")
    cl.wait_state(tenant, ("RUNNING",), 40)
    full = occupy(cl, [("n1", 1), ("n2", 0), ("n2", 1)])
    write_samples(cl, "n1", 0, "saturated")
    job = submit_held(cl, 4)
    state = PlacerState()
    counts = run_round(cl, state)
    assert counts["waiting"] == 1 and counts["placed"] == 0, counts
    rec = cl.job(job)
    # the round held it as admin
    assert rec["job_state"] == "PENDING" and rec["state_reason"] == "JobHeldAdmin"
    shown = cl.run(["squeue", "-h", "-j", str(job), "-o", "%i %r %k"], user=None).stdout
    assert "coloc-wait:every GPU with room is saturated: n1/gpu0 saturated now" in shown, shown
    cl.run(["scancel", str(full[2])], user=None)  # n2/gpu1 frees
    cl.wait_state(full[2], ("CANCELLED", "COMPLETED"), 30)
    time.sleep(1)
    counts = run_round(cl, state)
    assert counts["placed"] == 1, counts
    assert gpu_of(cl, job) == ("n2", 1)
    assert "coloc-wait" not in (cl.job(job)["comment"] or "")


def test_stale_live_state_falls_back_to_memory_only(cl: Cluster) -> None:
    tenant = submit_held(cl, 0, gres="shard:g0:4", node="n1")
    cl.wait_state(tenant, ("RUNNING",), 40)
    occupy(cl, [("n1", 1), ("n2", 0), ("n2", 1)])
    write_samples(cl, "n1", 0, "saturated", age_s=300)  # older than placement_state_max_age_s
    job = submit_held(cl, 4)
    counts = run_round(cl, PlacerState())
    assert counts["placed"] == 1, counts
    assert gpu_of(cl, job) == ("n1", 0)


def test_placer_cli_one_round_and_release_all(cl: Cluster) -> None:
    job = submit_held(cl, 2)
    out = cl.run(["coloc-placer", "run", "--rounds", "1"], user=None)
    assert out.returncode == 0, out.stderr
    assert "-> n" in out.stderr and f"job {job}" in out.stderr
    assert gpu_of(cl, job)[1] in (0, 1)
    assert cl.run(["coloc-placer", "status"], user=None).returncode == 0
    held = submit_held(cl, 3)
    out = cl.run(["coloc-placer", "release-all"], user=None)
    assert out.returncode == 0 and f"job {held}: released with shard:3" in out.stdout, out.stdout + out.stderr
    cl.wait_state(held, ("RUNNING",), 40)
    assert "shard:3" in cl.job(held)["tres_per_node"]


def test_coloc_sbatch_plan_submitted_for_the_placer_runs_on_the_chosen_gpu(cl: Cluster,
                                                                           tmp_path: Path) -> None:
    """The aware replay's path: coloc-sbatch's real plan (``--dry-run``), held without GRES, steered, run."""
    import subprocess

    script = cl.jobs_dir / "placer_job.sh"
    script.write_text("#!/bin/bash\nsleep 60\n")
    script.chmod(0o755)
    occupy(cl, [("n1", 0), ("n1", 1), ("n2", 0)])
    argv = ["--parsable", "-o", "/dev/null", "--coloc-mem=3G", str(script)]
    proc = subprocess.run(["runuser", "-u", "colocuser", "--", "env", f"SLURM_CONF={cl.conf}",
                           f"COLOC_CONFIG={cl.coloc_config}", f"PATH={cl.env['PATH']}", "python3", "-c",
                           "import os, sys; from slurm_coloc.config import load; "
                           "from slurm_coloc.replay.runner import submit_for_placer; "
                           "p = submit_for_placer(sys.argv[1:], load(), dict(os.environ)); "
                           "print(p.stdout.strip()); sys.exit(p.returncode)", *argv],
                          cwd=str(cl.jobs_dir), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    job = int(proc.stdout.strip().split(";")[0])
    rec = cl.job(job)
    assert rec["state_reason"] == "JobHeldUser" and not rec["tres_per_node"]
    assert '"place":true' in rec["comment"] and '"shards":3' in rec["comment"]
    assert run_round(cl, PlacerState())["placed"] == 1
    assert gpu_of(cl, job) == ("n2", 1)


def _script(cl: Cluster, name: str, body: str) -> Path:
    script = cl.jobs_dir / name
    script.write_text("#!/bin/bash\n" + body + "\n")
    script.chmod(0o755)
    return script


def test_coloc_sbatch_held_for_a_live_placer_and_classic_without_one(cl: Cluster) -> None:
    """A plain coloc-sbatch shard job: placed by a running ``coloc-placer run``; classic ``shard:N`` once the
    placer is gone (no heartbeat)."""
    import subprocess

    script = _script(cl, "wired.sh", "sleep 60")
    placer = subprocess.Popen(["coloc-placer", "run"], env=cl.env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        beat = cl.state_dir / "placer.json"
        for _ in range(100):
            if beat.exists():
                break
            time.sleep(0.2)
        assert beat.exists(), "no heartbeat from coloc-placer run"
        out = cl.run(["coloc-sbatch", "--coloc-mem=3G", "-o", "/dev/null", str(script)])
        assert out.returncode == 0, out.stderr
        assert "held for coloc-placer" in out.stderr, out.stderr
        job = int(out.stdout.split()[-1])
        node, idx = gpu_of(cl, job)  # the placer steered it onto one typed GPU
        rec = cl.job(job)
        assert f"shard:g{idx}:3" in rec["tres_per_node"] and '"place":true' in rec["comment"], rec
    finally:
        import os
        import signal
        os.killpg(placer.pid, signal.SIGTERM)
        rc = placer.wait(timeout=30)
    from slurm_coloc.placement.heartbeat import heartbeat_paths, placer_alive

    # a clean stop (SIGTERM, as systemd stops it) leaves no live heartbeat: the next job is not held for it
    assert rc == 0 and not any(p.exists() for p in heartbeat_paths(_cfg(cl))) and not placer_alive(_cfg(cl))
    out = cl.run(["coloc-sbatch", "--parsable", "--coloc-mem=3G", "-o", "/dev/null", str(script)])
    assert out.returncode == 0 and "held for coloc-placer" not in out.stderr, out.stderr
    job2 = int(out.stdout.strip().split(";")[0])
    cl.wait_state(job2, ("RUNNING",), 40)
    rec = cl.job(job2)
    assert rec["tres_per_node"].replace("gres:", "") == "shard:3" and '"place"' not in rec["comment"], rec


def test_placer_holds_as_admin_so_the_user_cannot_release_it(cl: Cluster) -> None:
    full = occupy(cl, [("n1", 0), ("n1", 1), ("n2", 0), ("n2", 1)])
    job = submit_held(cl, 4)
    counts = run_round(cl, PlacerState())
    assert counts["admin_held"] == 1 and counts["waiting"] == 1, counts
    assert cl.job(job)["state_reason"] == "JobHeldAdmin"
    out = cl.run(["scontrol", "release", str(job)])
    assert out.returncode != 0, out.stdout + out.stderr
    time.sleep(2)
    rec = cl.job(job)
    assert rec["job_state"] == "PENDING" and rec["state_reason"] == "JobHeldAdmin", rec
    cl.run(["scancel", str(full[0])], user=None)
    cl.wait_state(full[0], ("CANCELLED", "COMPLETED"), 30)
    time.sleep(1)
    assert run_round(cl, PlacerState())["placed"] == 1
    assert gpu_of(cl, job) == ("n1", 0)


def test_fallback_releases_held_jobs_memory_only_when_the_placer_is_dead(cl: Cluster) -> None:
    from slurm_coloc.placement.heartbeat import write_heartbeat

    job = submit_held(cl, 3)
    write_heartbeat(_cfg(cl), {"candidates": 0})  # a live placer: the fallback leaves the job alone
    out = cl.run(["coloc-placer", "fallback"], user=None)
    assert out.returncode == 0 and "placer alive" in out.stdout, out.stdout + out.stderr
    assert cl.job(job)["job_state"] == "PENDING"
    from slurm_coloc.placement.heartbeat import heartbeat_paths

    for beat in heartbeat_paths(_cfg(cl)):
        stale = json.loads(beat.read_text())
        stale["ts"] -= 3600  # the placer stopped an hour ago
        beat.write_text(json.dumps(stale))
    t0 = time.monotonic()
    out = cl.run(["coloc-placer", "fallback"], user=None)
    took_s = time.monotonic() - t0
    assert out.returncode == 0 and f"released memory-only ({job})" in out.stdout, out.stdout + out.stderr
    cl.wait_state(job, ("RUNNING",), 40)
    assert cl.job(job)["tres_per_node"].replace("gres:", "") == "shard:3"
    assert took_s < 15, took_s


def test_prolog_guard_no_gpu_for_a_placer_job_released_by_its_user(cl: Cluster) -> None:
    """Released by its user before any placer round: it runs without GRES, so the Prolog leaves it no GPU."""
    outfile = cl.jobs_dir / "guard.out"
    outfile.unlink(missing_ok=True)
    argv = ["sbatch", "--parsable", "--hold", "-o", str(outfile), "--comment=" + PLACE % 2,
            "--wrap=echo CVD=[${CUDA_VISIBLE_DEVICES-unset}]"]
    out = cl.run(argv)
    assert out.returncode == 0, out.stderr
    job = int(out.stdout.strip())
    assert cl.run(["scontrol", "release", str(job)]).returncode == 0  # a user hold: its user may release it
    cl.wait_job(job, 60)
    text = outfile.read_text()
    assert "CVD=[]" in text, text
    assert f"coloc: job {job} was submitted for coloc-placer but started without its GPU" in text, text
    plain = cl.run(["sbatch", "--parsable", "-o", str(cl.jobs_dir / "plain.out"),
                    "--wrap=echo CVD=[${CUDA_VISIBLE_DEVICES-unset}]"])
    cl.wait_job(int(plain.stdout.strip()), 60)
    assert "CVD=[unset]" in (cl.jobs_dir / "plain.out").read_text()  # a job without place: untouched
