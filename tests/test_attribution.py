"""Which job a GPU process counts against (node/attribution.py): only sources users cannot forge, as root
reads them.

The attack (second campaign, docs/reliability.md): a process of ``colocuser2``'s job that sets
``SLURM_JOB_ID=<colocuser's job>`` in its own environment was attributed to the victim's job, so the watchdog
cancelled the victim and billed the victim for the attacker's memory.
"""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import List

import pytest

from slurm_coloc.node.attribution import JobAttributor, cgroup_mounts

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


@pytest.mark.parametrize("owner_uid,running,expected", [
    (2001, [64], None),  # another user's job: never
    (2002, [64], 64),  # the only job colocuser2 runs here: the claim chooses nothing
    (2002, [63, 64], None),  # N7: colocuser2 runs two jobs here; its own claim does not pick the one billed
    (2002, None, None),  # the node database cannot say which jobs run: no attribution
    (None, [64], None)])
def test_a_users_own_slurm_job_id_counts_only_for_that_users_only_job(owner_uid, running, expected) -> None:
    p = _start("colocuser2", "exec env SLURM_JOB_ID=64 sleep 30")  # colocuser2 (uid 2002) claims job 64
    try:
        pid = _leaf(p)
        attr = JobAttributor(job_uid=lambda job: owner_uid if job == 64 else None,
                             uid_jobs=lambda uid: running if uid == 2002 else [])
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


# Real cgroups (N4): processes moved into cgroup directories created on this host's cgroup
# filesystems, named as Slurm's cgroup plugins name them (v2 ``/system.slice/slurmstepd.scope/job_<N>``, v1
# ``/slurm/uid_<U>/job_<N>``) or as a user's delegated systemd subtree would (``.../user@2002.service/...``).
MOUNTS = cgroup_mounts()
UID1, UID2 = 2001, 2002  # colocuser, colocuser2 (scripts/lib/slurm_conf.sh)


class Cgroups:
    """Cgroup directories made for one test, removed (children first) after its processes are gone."""

    def __init__(self) -> None:
        self.made: List[Path] = []

    def make(self, hierarchy: str, path: str, owner: int = 0) -> Path:
        base = Path(MOUNTS[hierarchy])
        d = base
        for part in path.strip("/").split("/"):
            d = d / part
            if not d.exists():
                d.mkdir()
                self.made.append(d)
        os.chown(d, owner, owner)
        return d

    def put(self, pid: int, hierarchy: str, path: str, owner: int = 0) -> None:
        (self.make(hierarchy, path, owner) / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        for d in reversed(self.made):
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)


def _can_make_cgroups() -> bool:
    if "" not in MOUNTS or "pids" not in MOUNTS:
        return False
    probe = Path(MOUNTS[""]) / f"coloc-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
        return True
    except OSError:
        return False


cgroups_needed = pytest.mark.skipif(os.geteuid() != 0 or not _can_make_cgroups(),
                                    reason="needs root and writable cgroup v1 (pids) and v2 hierarchies")


@pytest.fixture()
def cg():
    c = Cgroups()
    procs: List[subprocess.Popen] = []
    try:
        yield c, procs
    finally:
        for p in procs:
            os.killpg(p.pid, 9)
            p.wait()
        c.remove()


def _job() -> int:
    return 700_000 + (os.getpid() * 13 + time.monotonic_ns()) % 200_000


@cgroups_needed
def test_a_users_own_cgroup_named_job_n_is_not_that_job(cg) -> None:
    """N4: a uid-2002 process in ``.../user@2002.service/app.slice/job_<N>`` was attributed to job N
    (colocuser's) and could get it stopped. Neither Slurm's tree nor an owner that may speak for job N: no
    attribution."""
    c, procs = cg
    job = _job()
    p = _start("colocuser2", "exec sleep 30")
    procs.append(p)
    pid = _leaf(p)
    c.put(pid, "", f"/user.slice/user-{UID2}.slice/user@{UID2}.service/app.slice/job_{job}", owner=UID2)
    for owner in (UID1, UID2, None):  # whoever job N belongs to
        attr = JobAttributor(job_uid=lambda j, o=owner: o if j == job else None, uid_jobs=lambda uid: [])
        assert attr.job_of(pid) is None
    # the same user-made directory placed where Slurm's would be, but owned by colocuser2: not job N's
    # (colocuser)
    c.put(pid, "", f"/system.slice/slurmstepd.scope/job_{job}", owner=UID2)
    assert JobAttributor(job_uid=lambda j: UID1 if j == job else None).job_of(pid) is None
    assert JobAttributor(job_uid=lambda j: None).job_of(pid) is None  # job's uid unknown: only root's counts


@cgroups_needed
def test_slurms_v2_cgroup_of_the_job_counts_and_each_het_component_is_its_own_job(cg) -> None:
    """A job's processes in Slurm's cgroup v2 tree (root-owned ``job_<N>``) count against job N; the
    components of a heterogeneous job (consecutive job ids, each with its own ``job_<N>`` cgroup) each against
    their own id."""
    c, procs = cg
    leader = _job()
    pids = []
    for comp in (leader, leader + 1):
        p = _start("colocuser", "exec sleep 30")
        procs.append(p)
        pids.append(_leaf(p))
        c.put(pids[-1], "", f"/system.slice/slurmstepd.scope/job_{comp}/step_0/user/task_0")
    attr = JobAttributor(job_uid=lambda j: UID1 if j in (leader, leader + 1) else None)
    assert [attr.job_of(pid) for pid in pids] == [leader, leader + 1]


@cgroups_needed
def test_slurms_v1_cgroup_counts_only_under_the_jobs_own_uid(cg) -> None:
    """cgroup v1: Slurm makes ``/slurm/uid_<U>/job_<N>`` owned by the job's user, so ``uid_2002`` is
    colocuser2's to write: a ``job_<N>`` there for colocuser's job N does not count; colocuser's real one
    does."""
    c, procs = cg
    job = _job()
    fake = _start("colocuser2", "exec sleep 30")
    real = _start("colocuser", "exec sleep 30")
    procs += [fake, real]
    c.make("pids", f"/slurm/uid_{UID2}", owner=UID2)
    c.put(_leaf(fake), "pids", f"/slurm/uid_{UID2}/job_{job}/step_batch", owner=UID2)
    c.make("pids", f"/slurm/uid_{UID1}", owner=UID1)
    c.put(_leaf(real), "pids", f"/slurm/uid_{UID1}/job_{job}/step_batch", owner=UID1)
    attr = JobAttributor(job_uid=lambda j: UID1 if j == job else None)
    assert attr.job_of(_leaf(fake)) is None and attr.job_of(_leaf(real)) == job
    assert JobAttributor(job_uid=lambda j: None).job_of(_leaf(real)) is None  # uid unknown: not root-owned


@cgroups_needed
def test_an_escaped_process_with_its_users_other_job_id_is_not_billed_to_that_job(cg) -> None:
    """N7: colocuser runs a 1-shard job A and a 40-shard job B here; a process that left A (no Slurm cgroup,
    no slurmstepd ancestor) with ``SLURM_JOB_ID=B`` was billed to B. It is not; a process in A's cgroup with
    the same claim counts against A."""
    c, procs = cg
    a = _job()
    b = a + 1
    escaped = _start("colocuser", f"exec env SLURM_JOB_ID={b} sleep 30")
    inside = _start("colocuser", f"exec env SLURM_JOB_ID={b} sleep 30")
    procs += [escaped, inside]
    c.put(_leaf(inside), "", f"/system.slice/slurmstepd.scope/job_{a}/step_0")
    attr = JobAttributor(job_uid=lambda j: UID1 if j in (a, b) else None, uid_jobs=lambda uid: [a, b])
    assert attr.job_of(_leaf(escaped)) is None
    assert attr.job_of(_leaf(inside)) == a
