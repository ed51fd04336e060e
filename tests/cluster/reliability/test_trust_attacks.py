"""Attacks by ordinary users on what root-side code trusts, on the real cluster (docs/reliability.md "Trust
boundaries"). ``colocuser2`` attacks ``colocuser``; each test fails on the code before the fix (said per
test).
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from tests.cluster.reliability.conftest import FaultCluster

pytestmark = pytest.mark.slurm
OOM_LINE = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB."
VICTIM, ATTACKER = "colocuser", "colocuser2"
PLANT = "from pathlib import Path\nPath({marker!r}).touch()\n"
MODEL = ("import torch\n\n\ndef build():\n    return torch.nn.Linear(64, 8)\n")


def _dir(fc: FaultCluster, name: str, owner: str = "root", mode: int = 0o755) -> Path:
    d = fc.c.jobs_dir / f"{name}-{os.getpid()}-{time.monotonic_ns()}"
    d.mkdir()
    shutil.chown(d, owner, owner)
    os.chmod(d, mode)
    return d


def _write(path: Path, text: str, owner: str, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    shutil.chown(path, owner, owner)
    os.chmod(path, mode)
    return path


def _dry_run_mem(fc: FaultCluster, script: Path, user: str = VICTIM):
    proc = fc.c.run(["coloc-sbatch", "--dry-run", script.name], user=user, cwd=script.parent, timeout=300,
                    env={"COLOC_ESTIMATE_CACHE": "off"})
    m = re.search(r'"mem_mib":\s*(\d+)', proc.stdout)
    return proc, int(m.group(1)) if m else None


def test_planted_package_in_a_shared_directory_is_never_imported(fc: FaultCluster) -> None:
    """Before: ``loader.py`` put the script's directory first on ``sys.path``: the planted ``torchvision`` ran
    as the victim (marker present) and the dry run failed on its missing ``models``."""
    shared = _dir(fc, "shared", mode=0o1777)  # a group/project directory every user writes to
    marker = shared / "planted-ran"
    plant_dir = shared / "torchvision"
    plant_dir.mkdir()
    shutil.chown(plant_dir, ATTACKER, ATTACKER)
    _write(plant_dir / "__init__.py", PLANT.format(marker=str(marker)), ATTACKER)
    script = _write(shared / "job.sh",
                    "#!/bin/sh\n#COLOC model=torchvision.models:resnet18 input=3x32x32 batch=2\n"
                    "true\n", VICTIM)
    proc, mem = _dry_run_mem(fc, script)
    assert not marker.exists(), "the attacker's torchvision ran inside the victim's coloc-sbatch"
    assert proc.returncode == 0 and mem and mem > 0, proc.stderr


def test_file_model_in_a_directory_others_can_write_is_refused(fc: FaultCluster) -> None:
    """Before: the model file was imported from any directory, its siblings first on ``sys.path`` (exit 0)."""
    shared = _dir(fc, "shared-file", mode=0o1777)
    script = _write(shared / "job.sh", "#!/bin/sh\n#COLOC model=mymodel.py:build input=64 batch=2\ntrue\n",
                    VICTIM)
    _write(shared / "mymodel.py", MODEL, VICTIM)
    proc, mem = _dry_run_mem(fc, script)
    assert proc.returncode != 0 and mem is None
    err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and str(shared) in err[0] and "writable by other users" in err[0], proc.stderr
    private = _dir(fc, "private", owner=VICTIM, mode=0o755)  # the fix the message names works
    for name in ("job.sh", "mymodel.py"):
        shutil.copy(shared / name, private / name)
        shutil.chown(private / name, VICTIM, VICTIM)
    proc, mem = _dry_run_mem(fc, private / "job.sh")
    assert proc.returncode == 0 and mem, proc.stderr


def _sbatch(fc: FaultCluster, user: str, cwd: Path, *opts: str, body: str) -> int:
    script = cwd / f"j-{time.monotonic_ns()}.sh"
    _write(script, "#!/bin/bash\n" + body, user, 0o755)
    proc = fc.c.run(["sbatch", "--parsable", "-t", "5", "-o", "o-%j.out", *opts, str(script)], user=user,
                    cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.strip().split(";")[0])


def _finish(fc: FaultCluster, job: int, timeout: float = 120) -> Dict:
    rec = fc.c.wait_job(job, timeout=timeout)
    fc.wait_hooks(job, hooks=("epilog-slurmctld",))
    return rec


def test_forged_history_does_not_reach_another_users_estimate(fc: FaultCluster) -> None:
    """The attacker forges the victim script's SHA-256 in the comment of a job that prints an OOM line on 40
    shards. Before: history was keyed on that comment value, so the victim's next estimate became
    ``40960 * 1.05 + 64`` MiB (a whole GPU)."""
    home = _dir(fc, "victim", owner=VICTIM)
    script = _write(home / "job.sh", "#!/bin/sh\n#COLOC model=torch.nn:Linear kwarg.in_features=64 "
                    "kwarg.out_features=8 input=64 batch=4\ntrue\n", VICTIM)
    proc, before = _dry_run_mem(fc, script)
    assert proc.returncode == 0 and before and before < 4096, proc.stderr
    sha = hashlib.sha256(script.read_bytes()).hexdigest()
    bad = _dir(fc, "attacker", owner=ATTACKER)
    comment = f'coloc:{{"v":1,"mode":"shard","shards":40,"mem_mib":40000,"sha256":"{sha}"}}'
    oom = _sbatch(fc, ATTACKER, bad, "--gres=shard:40", "-w", "n1", f"--comment={comment}",
                  body=f"echo '{OOM_LINE}' >&2\nexit 1\n")
    done = _sbatch(fc, ATTACKER, bad, "--gres=shard:2", "-w", "n1", f"--comment=oom-retry-of-1 {comment}",
                   body="exit 0\n")
    assert _finish(fc, oom)["job_state"] == "FAILED" and _finish(fc, done)["job_state"] == "COMPLETED"
    rows = fc.rows(fc.c.ctld_db, "SELECT job_id, uid, script_sha256 FROM jobs WHERE job_id IN (?, ?)",
                   (oom, done))
    assert rows and all(r["script_sha256"] != sha and r["uid"] == 2002 for r in rows), rows
    proc, after = _dry_run_mem(fc, script)
    assert proc.returncode == 0 and after == before, (before, after, proc.stdout)


SLOW = 'sleep {s}\n'


def _slow_hook(fc: FaultCluster, hook: str, seconds: int) -> str:
    wrapper = fc.c.dir / "etc" / "hooks" / f"{hook}.sh"
    saved = wrapper.read_text()
    wrapper.write_text(saved.replace("\n", "\n" + SLOW.format(s=seconds), 1))
    return saved


def _settled_state(fc: FaultCluster, job: int, timeout: float = 60) -> Optional[str]:
    """The recorded state once a later controller hook settled it (a trivial job triggers one)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        rows = fc.rows(fc.c.ctld_db, "SELECT state, state_source FROM jobs WHERE job_id = ?", (job,))
        if rows and rows[0]["state_source"] == "slurm":
            return rows[0]["state"]
        _finish(fc, fc.sbatch(fc.script(f"tick-{time.monotonic_ns()}.sh"), node="n2"))
    return None


@pytest.mark.parametrize("phase", ["running-trap-exit0", "running-trap-exit1", "prolog", "completing"])
def test_cancel_at_each_phase_records_slurms_final_state(fc: FaultCluster, phase: str) -> None:
    """Before: the EpilogSlurmctld's inference was final: a cancelled job whose script traps SIGTERM and exits
    0 or 1 was recorded COMPLETED or FAILED, one cancelled during its Prolog COMPLETED (exit 0:0)."""
    work = _dir(fc, f"cancel-{phase}", owner=VICTIM)
    body = {"running-trap-exit0": "trap 'exit 0' TERM\nsleep 60 & wait\n",
            "running-trap-exit1": "trap 'exit 1' TERM\nsleep 60 & wait\n",
            "prolog": "sleep 60\n", "completing": "exit 0\n"}[phase]
    hook = {"prolog": "prolog", "completing": "epilog"}.get(phase)
    saved = _slow_hook(fc, hook, 8) if hook else None
    try:
        job = _sbatch(fc, VICTIM, work, "--gres=shard:2", "-w", "n1", body=body)
        if phase == "completing":
            fc.c.wait_state(job, ["COMPLETING"], timeout=60)
        else:
            fc.c.wait_state(job, ["RUNNING", "CONFIGURING"], timeout=60)
            time.sleep(2)
        cancel = fc.c.run(["scancel", str(job)], user=VICTIM)
        assert cancel.returncode == 0 or phase == "completing", cancel.stderr
        want = "COMPLETED" if phase == "completing" else "CANCELLED"
        assert fc.c.wait_job(job, timeout=120)["job_state"] == want
        fc.wait_hooks(job, hooks=("epilog-slurmctld",))
    finally:
        if saved is not None:
            (fc.c.dir / "etc" / "hooks" / f"{hook}.sh").write_text(saved)
    assert _settled_state(fc, job) == want


def test_pending_job_cancel_needs_no_record(fc: FaultCluster) -> None:
    """A job cancelled while pending never reaches a controller hook: it leaves no row, so nothing is
    wrong."""
    work = _dir(fc, "cancel-pending", owner=VICTIM)
    job = _sbatch(fc, VICTIM, work, "--gres=shard:2", "--begin=now+600", body="true\n")
    assert fc.c.run(["scancel", str(job)], user=VICTIM).returncode == 0
    assert fc.c.wait_job(job)["job_state"] == "CANCELLED"
    _finish(fc, fc.sbatch(fc.script(f"tick-{time.monotonic_ns()}.sh"), node="n2"))
    assert fc.rows(fc.c.ctld_db, "SELECT * FROM jobs WHERE job_id = ?", (job,)) == []


def _reruns_of(fc: FaultCluster, job: int) -> List[Dict]:
    return [j for j in fc.c.squeue() if f"oom-retry-of-{job}" in (j.get("comment") or "")]


def _oom_rows(fc: FaultCluster, job: int) -> List[Dict]:
    return fc.rows(fc.c.ctld_db, "SELECT * FROM oom_events WHERE job_id = ?", (job,))


def test_cancelled_pending_rerun_is_recorded_and_rerun_takes_only_slurms_options(fc: FaultCluster) -> None:
    """The rerun cannot start (every GPU is taken); the user cancels it while pending. Before: it had no
    EpilogSlurmctld, so ``retry_state`` stayed NULL forever. The comment's forged ``partition``/``argv`` and
    the name's ``Partition=`` text never reach the rerun: it runs in the original's partition with its
    arguments."""
    work = _dir(fc, "rerun", owner=VICTIM)
    bdir = _dir(fc, "blockers", owner=ATTACKER)
    blockers = [_sbatch(fc, ATTACKER, bdir, f"--gres=shard:{n}", "-w", node, body="sleep 300\n")
                for node, n in (("n1", 80), ("n2", 80), ("n2", 80), ("n1", 78))]
    try:
        for b in blockers:
            fc.c.wait_state(b, ["RUNNING"], timeout=60)
        comment = 'coloc:{"v":1,"mode":"shard","shards":2,"mem_mib":1500,"partition":"nosuch","argv":["--x"]}'
        job = _sbatch(fc, VICTIM, work, "--gres=shard:2", "-J", "r Partition=nosuch", f"--comment={comment}",
                      body=f"echo '{OOM_LINE}' >&2\nexit 1\n")
        assert _finish(fc, job)["job_state"] == "FAILED"
        reruns = _reruns_of(fc, job)
        assert len(reruns) == 1 and reruns[0]["job_state"] == "PENDING", reruns
        assert reruns[0]["partition"] == "debug" and reruns[0]["name"] == "r Partition=nosuch"
        assert reruns[0]["command"].split()[1:] == []  # Slurm's record: no arguments (the comment said --x)
        rerun = reruns[0]["job_id"]
        assert fc.c.run(["scancel", str(rerun)], user=VICTIM).returncode == 0
        assert fc.c.wait_job(rerun)["job_state"] == "CANCELLED"
    finally:
        fc.c.run(["scancel", *map(str, blockers)], user=None)
    for b in blockers:
        _finish(fc, b)  # their EpilogSlurmctld runs look the rerun up
    row = _oom_rows(fc, job)
    assert row and row[0]["retry_job_id"] == rerun and row[0]["retry_state"] == "CANCELLED", row


def _watchdog_row(fc: FaultCluster, job: int) -> None:
    """What the sampler's watchdog records when it stops a job (a ``watchdog_events`` row in the node
    database, written through the watchdog's own store function)."""
    from slurm_coloc.store import oom as store_oom
    from slurm_coloc.store.db import open_node_db

    db = open_node_db(fc.c.node_db("n1"))
    try:
        store_oom.record_event(db, store_oom.WatchdogEvent(
            ts=time.time(), job_id=job, node="n1", gpu_index=0, reason="over-grant", share="mps",
            grant_mib=2048.0,
            used_mib=8192.0, tolerance_mib=512.0, pids=(), action="stop",
            message="stopped by the GPU watchdog"))
    finally:
        db.conn.close()


def test_fake_oom_lines_cannot_farm_whole_gpu_reruns(fc: FaultCluster) -> None:
    """Before: every FAILED shard job printing an OOM line got a whole-GPU rerun, without limit (5 of 5 here),
    also one the watchdog stopped and one whose sampled memory stayed far below its grant."""
    fc.set_config(oom_rerun_per_user_max=3, oom_rerun_window_s=3600)
    work = _dir(fc, "farm", owner=ATTACKER)
    fake = f"sleep 2\necho '{OOM_LINE}' >&2\nexit 1\n"
    cpu = _sbatch(fc, ATTACKER, work, "-w", "n1", body=fake)
    whole = _sbatch(fc, ATTACKER, work, "--gres=shard:80", "-w", "n1", body=fake)
    watched = _sbatch(fc, ATTACKER, work, "--gres=shard:4", "-w", "n1", body="sleep 6\n" + fake)
    fc.c.wait_state(watched, ["RUNNING"], timeout=60)
    _watchdog_row(fc, watched)
    low = _sbatch(fc, ATTACKER, work, "--gres=shard:8", "-w", "n1", body="sleep 6\n" + fake)
    fc.c.wait_state(low, ["RUNNING"], timeout=60)
    conn = sqlite3.connect(fc.c.node_db("n1"), timeout=10)
    try:  # what the sampler writes on a GPU node: the job held 300 MiB of its 8 GiB
        now = time.time()
        conn.execute("INSERT INTO gpu_samples (ts, gpu_index, mem_used_mib, n, res_s) VALUES (?, 0, 300, 1, "
                     "1)", (now,))
        conn.execute("INSERT INTO proc_samples (ts, gpu_index, pid, job_id, used_mem_mib, mps_client, n, "
                     "res_s) "
                     "VALUES (?, 0, 4242, ?, 300, 1, 1, 1)", (now, low))
        conn.commit()
    finally:
        conn.close()
    for j in (cpu, whole, watched, low):
        assert _finish(fc, j)["job_state"] == "FAILED"
    for j in (cpu, whole, watched, low):
        assert _reruns_of(fc, j) == [], j
    prior = fc.rows(fc.c.ctld_db, "SELECT count(*) AS n FROM oom_events WHERE uid = 2002 AND ts >= ? AND "
                    "retry_status IN ('submitting', 'submitted')", (time.time() - 3600,))[0]["n"]
    allowed = max(0, 3 - prior)  # reruns the attacker got earlier in this session count against the window
    farm = [_sbatch(fc, ATTACKER, work, "--gres=shard:2", "-w", "n2", body=fake) for _ in range(5)]
    for j in farm:
        _finish(fc, j)
    time.sleep(1)
    rerun = [j for j in farm if _reruns_of(fc, j)]
    assert len(rerun) == allowed, (rerun, prior)
    refused = [r for j in farm for r in _oom_rows(fc, j) if r["retry_status"] == "not-retried"]
    assert len(refused) == 5 - allowed and all("limit 3" in r["retry_reason"] for r in refused), refused
    reasons = {j: (_oom_rows(fc, j) or [{}])[0].get("retry_reason", "") for j in (watched, low)}
    assert "watchdog" in reasons[watched] and "sampler saw at most 300" in reasons[low], reasons
    for r in rerun:
        for j in _reruns_of(fc, r):
            fc.c.run(["scancel", str(j["job_id"])], user=None)
