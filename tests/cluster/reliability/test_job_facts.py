"""The root hooks take job facts from slurmctld's record, never from text a user wrote, on the real cluster.

Each attack runs as the ordinary user ``colocuser``: a job name (or work directory) holding ``Key=value`` text
or a newline must not change the shards the MPS fence and the records use, nor the final state that decides an
OOM rerun. Array tasks are recorded one by one and each gets its own AdminComment.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from tests.cluster.reliability.conftest import FaultCluster

pytestmark = pytest.mark.slurm
OOM_LINE = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
FAKE_MPS = """#!/bin/bash
# TEST DOUBLE of nvidia-cuda-mps-control (CI has no driver): daemonizes a sleeper, writes the pid file.
P=$CUDA_MPS_PIPE_DIRECTORY
if [ "$1" = -d ]; then
  setsid bash -c 'exec -a nvidia-cuda-mps-control sleep 600' </dev/null >/dev/null 2>&1 &
  echo $! > "$P/nvidia-cuda-mps-control.pid"; exit 0
fi
read -r cmd
[ "$cmd" = quit ] && kill "$(cat "$P/nvidia-cuda-mps-control.pid")" && rm -f "$P/nvidia-cuda-mps-control.pid"
"""


def _with_fake_mps(fc: FaultCluster) -> None:
    fake = fc.c.dir / "fakebin" / "nvidia-cuda-mps-control"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(FAKE_MPS)
    fake.chmod(0o755)
    fc.set_config(mps_control_bin=str(fake))


def _submit(fc: FaultCluster, *opts: str, body: str, cwd: Optional[Path] = None) -> int:
    script = fc.script(f"facts-{time.monotonic_ns()}.sh", body, mode=0o755)
    proc = fc.c.run(["sbatch", "--parsable", "-w", "n1", "-t", "2", *opts, str(script)], cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.strip().split(";")[0])


def _job_rows(fc: FaultCluster, job: int) -> Dict[str, List[Dict]]:
    return {"ctld": fc.rows(fc.c.ctld_db, "SELECT * FROM jobs WHERE job_id = ?", (job,)),
            "node": fc.rows(fc.c.node_db("n1"), "SELECT * FROM job_runs WHERE job_id = ?", (job,)),
            "oom": fc.rows(fc.c.ctld_db, "SELECT * FROM oom_events WHERE job_id = ?", (job,))}


@pytest.mark.parametrize("name", ["x TresPerNode=gres:shard:79", "y TresPerNode=gres:shard:80",
                                  "nl\nTresPerNode=gres:shard:80 JobState=FAILED"],
                         ids=["79-in-name", "80-in-name", "newline-in-name"])
def test_forged_gres_in_the_job_name_gets_the_real_shards_and_fence(fc: FaultCluster, name: str) -> None:
    _with_fake_mps(fc)
    job = _submit(fc, "--gres=shard:2", "-J", name, "-o", "facts-%j.out",
                  body="env | grep -E '^(CUDA_MPS_PINNED|COLOC_SHARE)' | sort\n")
    assert fc.c.wait_job(job)["job_state"] == "COMPLETED"
    fc.wait_hooks(job)
    env = dict(ln.split("=", 1) for ln in (fc.c.jobs_dir / f"facts-{job}.out").read_text().splitlines()
               if "=" in ln)
    assert env.get("COLOC_SHARE") == "mps" and env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") == "0=2G", env
    rows = _job_rows(fc, job)
    assert [r["shards_req"] for r in rows["ctld"]] == [2] and rows["ctld"][0]["share_mode"] == "shard", rows
    assert rows["ctld"][0]["job_name"] == name  # kept whole, as data
    assert [r["shards"] for r in rows["node"]] == [2], rows


def _forge_name_while_running(fc: FaultCluster, job: int) -> None:
    fc.c.wait_state(job, ["RUNNING"], timeout=60)
    proc = fc.c.run(["scontrol", "update", f"jobid={job}", "name=u JobState=FAILED"])
    assert proc.returncode == 0, proc.stderr  # a user may rename their own job


@pytest.mark.parametrize("how", ["name-at-submit", "renamed-while-running", "work-dir"])
def test_forged_failed_state_earns_no_oom_rerun(fc: FaultCluster, how: str) -> None:
    """The job prints an OOM line and exits 0: Slurm says COMPLETED, so no rerun whatever its text says."""
    body = f"sleep 3\necho '{OOM_LINE}' >&2\nexit 0\n"
    cwd = None
    opts = ["--gres=shard:2", "-o", "facts-%j.out", "-e", "facts-%j.err"]
    if how == "name-at-submit":
        opts += ["-J", "D JobState=FAILED"]
    elif how == "work-dir":
        cwd = fc.c.jobs_dir / f"w JobState=FAILED Reason=None {time.monotonic_ns()}"
        cwd.mkdir()
        shutil.chown(cwd, "colocuser", "colocuser")
    job = _submit(fc, *opts, body=body, cwd=cwd)
    if how == "renamed-while-running":
        _forge_name_while_running(fc, job)
    assert fc.c.wait_job(job)["job_state"] == "COMPLETED"
    fc.wait_hooks(job)
    time.sleep(1.0)
    rows = _job_rows(fc, job)
    assert [r["state"] for r in rows["ctld"]] == ["COMPLETED"], rows
    assert [r["state"] for r in rows["node"]] == ["COMPLETED"], rows
    assert rows["oom"] == [], rows
    assert not [j for j in fc.c.squeue() if f"oom-retry-of-{job}" in (j.get("comment") or "")]


def _hook_details(fc: FaultCluster, job: int, hook: str) -> List[str]:
    return [ln for ln in fc.hooks_log.read_text(errors="replace").splitlines()
            if f"coloc[{job}] {hook} ok" in ln]


def test_array_tasks_are_recorded_and_commented_one_by_one(fc: FaultCluster) -> None:
    """``--array=0-1%1``: task 1 starts after task 0 ended; each task is its own job id in every database and
    its AdminComment names ``<array>_<task>`` (a bare array id would also name the finished task and be
    refused)."""
    array = _submit(fc, "--gres=shard:2", "--array=0-1%1", "-o", "arr-%A_%a.out", body="sleep 1\n")
    deadline = time.time() + 120
    tasks: Dict[int, int] = {}
    while time.time() < deadline:
        recs = [j for j in fc.c.squeue() if j.get("array_job_id") == array
                and j.get("array_task_id") is not None]
        tasks = {j["array_task_id"]: j["job_id"] for j in recs}
        if len(tasks) == 2 and all(j["job_state"] == "COMPLETED" for j in recs):
            break
        time.sleep(0.5)
    assert sorted(tasks) == [0, 1], tasks
    for task, job in tasks.items():
        fc.wait_hooks(job)
        rows = _job_rows(fc, job)
        assert [r["state"] for r in rows["ctld"]] == ["COMPLETED"] and [r["shards"]
                                                                        for r in rows["node"]] == [2]
        pro = _hook_details(fc, job, "prolog-slurmctld")
        assert pro and "'admin_comment': 'provisional'" in pro[-1], pro
        events = fc.rows(fc.c.ctld_db,
                         "SELECT detail_json FROM events WHERE job_id = ? AND kind = 'admin-comment'",
                         (job,))
        assert len(events) == 1, events
        detail = json.loads(events[0]["detail_json"])
        assert detail["job"] == f"{array}_{task}" and json.loads(detail["text"])["coloc"] == 1
    assert len(set(tasks.values())) == 2
