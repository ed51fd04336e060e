"""Which job a GPU process counts against (node/attribution.py): only sources users cannot forge, as root reads them.

The attack (second campaign, docs/reliability.md): a process of ``colocuser2``'s job that sets
``SLURM_JOB_ID=<colocuser's job>`` in its own environment was attributed to the victim's job, so the watchdog
cancelled the victim and billed the victim for the attacker's memory.
"""
from __future__ import annotations

import os
import subprocess
import time
from typing import List

import pytest

from slurm_coloc.node.attribution import JobAttributor

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (runuser, reading other users' /proc)")


def _children(pid: int) -> List[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as fh:
        return [int(x) for x in fh.read().split()]


def _leaf(p: subprocess.Popen) -> int:
    """The innermost process under ``p`` (runuser and sh fork or exec; wait until the sleep exists)."""
    for _ in range(100):
        pid = p.pid
        while True:
            kids = _children(pid)
            if not kids:
                break
            pid = kids[0]
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            if fh.read().startswith(b"sleep"):
                return pid
        time.sleep(0.05)
    raise AssertionError("no sleep process")


def _start(user: str, cmd: str) -> subprocess.Popen:
    argv = ["bash", "-c", cmd] if user == "root" else ["runuser", "-u", user, "--", "bash", "-c", cmd]
    return subprocess.Popen(argv, start_new_session=True)


@pytest.mark.parametrize("owner_uid,expected", [(2001, None), (2002, 64), (None, None)])
def test_a_users_own_slurm_job_id_counts_only_for_that_jobs_user(owner_uid, expected) -> None:
    p = _start("colocuser2", "exec env SLURM_JOB_ID=64 sleep 30")  # colocuser2 (uid 2002) claims job 64
    try:
        pid = _leaf(p)
        attr = JobAttributor(job_uid=lambda job: owner_uid if job == 64 else None)
        assert attr.job_of(pid) == expected
    finally:
        os.killpg(p.pid, 9)
        p.wait()


def test_root_processes_and_root_owned_slurmstepd_ancestors_are_trusted() -> None:
    root = _start("root", "exec env SLURM_JOB_ID=65 sleep 30")
    stepd = _start("root", "exec -a 'slurmstepd: [77.batch]' bash -c 'sleep 30; :'")
    fake = _start("colocuser2", "exec -a 'slurmstepd: [78.batch]' bash -c 'sleep 30; :'")
    try:
        attr = JobAttributor(job_uid=lambda job: None)
        assert attr.job_of(_leaf(root)) == 65
        assert attr.job_of(_leaf(stepd)) == 77  # proctrack without cgroups: the step daemon root runs
        assert attr.job_of(_leaf(fake)) is None  # a user's process named like slurmstepd is not one
    finally:
        for p in (root, stepd, fake):
            os.killpg(p.pid, 9)
            p.wait()
