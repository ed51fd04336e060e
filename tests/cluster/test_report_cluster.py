"""coloc-report on the real local cluster: the AdminComment summary, and who sees which jobs."""
from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import time
from pathlib import Path

import pytest

from slurm_coloc import config as config_mod
from slurm_coloc.hooks import ctld as ctld_hooks
from slurm_coloc.slurm import jobs as slurm_jobs
from tests.slurm_cluster import Cluster

pytestmark = pytest.mark.slurm


def _submit(cluster: Cluster, user: str, name: str, sleep_s: int = 1) -> int:
    script = cluster.jobs_dir / f"{name}.sh"
    script.write_text(f"#!/bin/sh\nsleep {sleep_s}\n")
    os.chmod(script, 0o644)
    proc = cluster.run(["coloc-sbatch", "--parsable", "--coloc-mem", "2G", "-J", name, str(script)],
                       user=user)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.strip())


def _admin_comment(cluster: Cluster, job_id: int, timeout: float = 20) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = re.search(r"AdminComment=(\{\S*\})", cluster.scontrol("show", "job", str(job_id)))
        if m:
            return json.loads(m.group(1))
        time.sleep(0.5)
    raise AssertionError(f"no AdminComment on job {job_id}: {cluster.scontrol('show', 'job', str(job_id))}")


def _readable_copy(cluster: Cluster, dst: Path, admin_group: str) -> Path:
    """A 0755 snapshot of the cluster's databases (sqlite backup: WAL included) and a config reading it."""
    state = dst / "state"
    (state / "nodes").mkdir(parents=True)
    pairs = [(cluster.ctld_db, state / "ctld.db")] + [
        (p, state / "nodes" / p.name) for p in (cluster.state_dir / "nodes").glob("*.db")]
    for src, out in pairs:
        with sqlite3.connect(src) as a, sqlite3.connect(out) as b:
            a.backup(b)
        os.chmod(out, 0o644)
    for d in (dst, state, state / "nodes"):
        os.chmod(d, 0o755)
    yaml = dst / "coloc.yaml"
    yaml.write_text(f"state_dir: {state}\ngpu_mem_gib: 80\nadmin_group: {admin_group}\n")
    os.chmod(yaml, 0o644)
    return yaml


def _ctld_events(cluster: Cluster, job_id: int, kind: str) -> list:
    with sqlite3.connect(cluster.ctld_db) as conn:
        return [json.loads(r[0]) for r in conn.execute(
            "SELECT detail_json FROM events WHERE job_id = ? AND kind = ?", [job_id, kind])]


def test_admin_comment_and_visibility(slurm_cluster: Cluster):
    mine = _submit(slurm_cluster, "colocuser", "vis-mine", sleep_s=6)
    theirs = _submit(slurm_cluster, "colocuser2", "vis-theirs")
    # while the job runs, the writer's scontrol call lands in the job record (what scontrol show job prints)
    slurm_cluster.wait_state(mine, ["RUNNING"], timeout=60)
    cfg = config_mod.load(str(slurm_cluster.coloc_config), environ={})
    running = ctld_hooks.build(cfg, mine, wait_s=0)
    slurm_jobs.set_admin_comment(mine, running, slurm_cluster.bin_dir, env=slurm_cluster.env)
    assert _admin_comment(slurm_cluster, mine) == json.loads(running)
    for j in (mine, theirs):
        assert slurm_cluster.wait_job(j, timeout=90)["job_state"] == "COMPLETED"
    # at job end (EpilogSlurmctld) 22.05 refuses scontrol for a finished job and there is no slurmdbd here:
    # the summary is kept in ctld.db and the hook log says why
    deadline = time.time() + 20
    while time.time() < deadline and not _ctld_events(slurm_cluster, mine, "admin-comment"):
        time.sleep(0.5)
    ev = _ctld_events(slurm_cluster, mine, "admin-comment")
    assert len(ev) == 1, ev
    end = json.loads(ev[0]["text"])
    assert end["coloc"] == 1 and end["mode"] == "shard" and end["shards"] == 2 and end["req_mib"] == 2048
    assert end["est_mib"] == 2048 and end["gpu_h"] > 0 and "measured" in end
    log = (slurm_cluster.dir / "log" / "hooks.log").read_text()
    assert f"coloc[{mine}] epilog-slurmctld ok" in log and "Job has already finished" in log
    # scontrol -o keeps the comment one key=value word (no spaces), so field-name parsers read it whole
    line = slurm_cluster.scontrol("show", "job", "-o", str(mine))
    assert json.loads(line.split("AdminComment=", 1)[1].split(" ", 1)[0]) == json.loads(running)
    dst = Path("/tmp") / f"coloc-report-vis-{os.getpid()}"
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir()
    try:
        yaml = _readable_copy(slurm_cluster, dst, admin_group="colocuser2")
        seen = {}
        for user in ("colocuser", "colocuser2", None):
            proc = slurm_cluster.run(["coloc-report", "--json", "--config", str(yaml)], user=user)
            assert proc.returncode == 0, proc.stderr
            data = json.loads(proc.stdout)
            seen[user] = {j["job_id"]: j["user"] for j in data["jobs"]}
            problems = data["problems"]
            if user == "colocuser":
                assert any("showing only colocuser's jobs" in p for p in data["problems"])
        assert mine in seen["colocuser"] and theirs not in seen["colocuser"], problems
        assert set(seen["colocuser"].values()) == {"colocuser"}
        assert {mine, theirs} <= set(seen["colocuser2"]) and {mine, theirs} <= set(seen[None])
        users = slurm_cluster.run(["coloc-report", "users", "--json", "--config", str(yaml)],
                                  user="colocuser")
        assert [u["user"] for u in json.loads(users.stdout)["users"]] == ["colocuser"]
        table = slurm_cluster.run(["coloc-report", "--config", str(yaml)], user="colocuser")
        assert table.returncode == 0 and str(mine) in table.stdout and "│ colocuser2" not in table.stdout
    finally:
        shutil.rmtree(dst, ignore_errors=True)
