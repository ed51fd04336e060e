"""Attacks through the job comment on root's hooks, on the real cluster (N3/N10, and the fourth
campaign in docs/reliability.md). ``colocuser2`` attacks; ``colocuser`` is the victim.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Dict, List

import pytest

from tests.cluster.reliability.conftest import FaultCluster

pytestmark = pytest.mark.slurm
OOM_LINE = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB."
VICTIM, ATTACKER = "colocuser", "colocuser2"
BIG_INT = "9" * 401


def _dir(fc: FaultCluster, owner: str) -> Path:
    d = fc.c.jobs_dir / f"comment-{owner}-{os.getpid()}-{time.monotonic_ns()}"
    d.mkdir()
    shutil.chown(d, owner, owner)
    return d


def _sbatch(fc: FaultCluster, user: str, cwd: Path, *opts: str, body: str) -> int:
    script = cwd / f"j-{time.monotonic_ns()}.sh"
    script.write_text("#!/bin/bash\n" + body)
    shutil.chown(script, user, user)
    proc = fc.c.run(["sbatch", "--parsable", "-t", "5", "-w", "n1", "-o", "o-%j.out", *opts, str(script)],
                    user=user, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.strip().split(";")[0])


def _finish(fc: FaultCluster, job: int) -> Dict:
    rec = fc.c.wait_job(job, timeout=120)
    fc.wait_hooks(job, hooks=("epilog", "epilog-slurmctld"))
    return rec


def _row(fc: FaultCluster, job: int) -> Dict:
    rows = fc.rows(fc.c.ctld_db, "SELECT * FROM jobs WHERE job_id = ?", (job,))
    assert len(rows) == 1, rows
    return rows[0]


def test_a_comment_out_of_range_makes_an_unannotated_job_that_keeps_its_record(fc: FaultCluster) -> None:
    """N3 through the hooks: the payload that stopped the placer, NaN and an estimate of 10^20 MiB, each in a
    real job's comment. Each job is recorded whole (user, name, Slurm's GRES) as an unannotated job (no
    estimate, no coloc JSON), with one log line in the hooks' log; its neighbours' records are untouched."""
    work = _dir(fc, ATTACKER)
    comments = ['coloc:{"v":1,"mode":"shard","shards":2,"mem_mib":1500,"spec":{"batch_size":1,"input_shape":['
                + BIG_INT + ']}}',
                'coloc:{"v":1,"mode":"shard","shards":2,"mem_mib":1500,"flops_per_step":NaN}',
                'coloc:{"v":1,"mode":"shard","shards":2,"mem_mib":100000000000000000000}']
    jobs = [_sbatch(fc, ATTACKER, work, "--gres=shard:2", "-J", f"bad{i}", f"--comment={c}", body="true\n")
            for i, c in enumerate(comments)]
    good = _sbatch(fc, VICTIM, _dir(fc, VICTIM), "--gres=shard:2", "-J", "good",
                   '--comment=coloc:{"v":1,"mode":"shard","shards":2,"mem_mib":1500,"method":"analytic"}',
                   body="true\n")
    for j in [*jobs, good]:
        assert _finish(fc, j)["job_state"] == "COMPLETED"
    for i, j in enumerate(jobs):
        row = _row(fc, j)
        assert (row["user_name"], row["job_name"], row["shards_req"]) == (ATTACKER, f"bad{i}", 2), row
        assert row["estimate_mib"] is None and row["coloc_json"] is None and row["spec_json"] is None, row
    assert _row(fc, good)["estimate_mib"] == 1500 and _row(fc, good)["estimate_method"] == "analytic"
    log = fc.hooks_log.read_text()
    for j in jobs:
        assert f"job {j}: coloc comment ignored" in log


def test_a_forged_rerun_tag_changes_nothing_of_the_job_it_names(fc: FaultCluster) -> None:
    """Fourth campaign: colocuser2's failing job carries ``oom-retry-of-<victim>`` and a ``retry_of`` key
    naming colocuser's job. Root gives the attacker's job no rerun (it claims to be one: its own loss) and the
    victim's records (its jobs row, its OOM rows, its rerun budget) are unchanged."""
    victim = _sbatch(fc, VICTIM, _dir(fc, VICTIM), "--gres=shard:2", body="true\n")
    assert _finish(fc, victim)["job_state"] == "COMPLETED"
    before = _row(fc, victim)
    forged = (f'oom-retry-of-{victim} coloc:{{"v":1,"mode":"shard","shards":2,"mem_mib":1500,'
              f'"retry_of":{victim},"method":"oom-retry"}}')
    attack = _sbatch(fc, ATTACKER, _dir(fc, ATTACKER), "--gres=shard:2", f"--comment={forged}",
                     body=f"echo '{OOM_LINE}' >&2\nexit 1\n")
    assert _finish(fc, attack)["job_state"] == "FAILED"
    reruns: List[Dict] = [j for j in fc.c.squeue() if f"oom-retry-of-{attack}" in (j.get("comment") or "")]
    assert reruns == []
    assert fc.rows(fc.c.ctld_db, "SELECT * FROM oom_events WHERE job_id = ?", (victim,)) == []
    # the attacker's own OOM row does not name the victim: only root's record links a rerun to its original
    own = fc.rows(fc.c.ctld_db, "SELECT retry_of FROM oom_events WHERE job_id = ?", (attack,))
    assert own and all(r["retry_of"] is None for r in own), own
    after = _row(fc, victim)
    keys = ("user_name", "uid", "job_name", "shards_req", "estimate_mib", "estimate_method", "coloc_json",
            "state",
            # settling may still turn state_source from inferred to slurm: that is the victim's own
            "exit_code")
    assert {k: after[k] for k in keys} == {k: before[k] for k in keys}


def test_nothing_can_be_planted_where_root_writes_the_heartbeat_and_listens(fc: FaultCluster) -> None:
    """Fourth campaign: root writes ``<run_dir>/placer.json`` through ``placer.json.<pid>.tmp`` and serves
    ``<run_dir>/report.sock``; a user who could create entries there could point root's write at any file (a
    symlink) or answer other users' coloc-report (a socket of their own). The directory is root's: refused."""
    run_dir = fc.run_dir
    assert run_dir.is_dir()
    for name in ("placer.json.4242.tmp", "placer.json", "evil.sock"):
        if not (run_dir / name).exists():
            out = fc.c.run(["ln", "-s", "/etc/shadow", str(run_dir / name)], user=ATTACKER)
            assert out.returncode != 0 and "Permission denied" in out.stderr, out
    code = ("import os,socket,sys\ntry: os.unlink(sys.argv[1] + '/report.sock')\nexcept FileNotFoundError: "
            "pass\n"
            "s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1] + '/report.sock')")
    out = fc.c.run(["python3", "-c", code, str(run_dir)], user=ATTACKER)
    assert out.returncode != 0 and "Permission denied" in out.stderr, out


def test_each_component_of_a_heterogeneous_job_is_attributed_to_its_own_job_id(fc: FaultCluster) -> None:
    """N4/N6 family: a heterogeneous job's steps on both components, real slurmstepd processes (this cluster
    tracks processes without cgroups: ``proctrack/linuxproc``). Each step's process counts against its
    component's job id (the leader's for group 0, the next for group 1), as each component's node Prolog
    records it."""
    from slurm_coloc.node.attribution import JobAttributor

    work = _dir(fc, VICTIM)
    body = ("srun --het-group=0 bash -c 'echo $$ > g0.pid; exec sleep 40' &\n"
            "srun --het-group=1 bash -c 'echo $$ > g1.pid; exec sleep 40' &\nwait\n")
    script = work / "het.sh"
    script.write_text("#!/bin/bash\n" + body)
    shutil.chown(script, VICTIM, VICTIM)
    out = fc.c.run(["sbatch", "--parsable", "-t", "2", "-o", "o-%j.out", "-w", "n1", "-n1", ":", "-w", "n2",
                    "-n1",
                    str(script)], user=VICTIM, cwd=work)
    assert out.returncode == 0, out.stderr
    leader = int(out.stdout.strip().split(";")[0])
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not ((work / "g0.pid").exists() and (work / "g1.pid").exists()):
            time.sleep(0.3)
        pids = [int((work / f"g{g}.pid").read_text()) for g in (0, 1)]
        ids = {j["job_id"] for j in fc.c.squeue() if j.get("het_job_id") == leader} or {leader, leader + 1}
        attr = JobAttributor(job_uid=lambda j: 2001 if j in ids else None)
        got = [attr.job_of(p) for p in pids]
        assert got[0] == leader and got[1] in ids and got[1] != leader, (got, ids)
    finally:
        fc.c.run(["scancel", str(leader)], user=None)
