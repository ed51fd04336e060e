"""F2 on the real cluster: the OOM rerun stays inside the job's confinement, or is refused.

Before: a job of reservation ``rtres`` with ``--exclude=n1`` that OOM'd was rerun on n1 with no reservation
(the rerun passed name, partition, account, time, paths and sizes only). Now it carries the reservation, the
excluded nodes, the constraint, the licenses and ``--exclusive`` from slurmctld's record
(``slurm/jobinfo.py``), and a job whose confinement cannot be carried (a heterogeneous job's component)
is not rerun, with the reason recorded and told to the user. Ordinary users; 22.05 and 26.05
(``COLOC_SLURM``).
"""
from __future__ import annotations

import json
import time

import pytest

from tests.cluster.reliability.conftest import FaultCluster
from tests.cluster.reliability.test_rerun_attacks import (
    OOM_LINE,
    VICTIM,
    _finish,
    _reruns_of,
    _submit,
    _workdir,
)

pytestmark = pytest.mark.slurm


def _confine(fc: FaultCluster) -> None:
    """Licenses ``lic:4`` (slurm.conf + reconfigure), node features ``fa`` on both nodes, and reservation
    ``rtres`` of colocuser on both nodes (other jobs wait while it exists: the test deletes it)."""
    conf = fc.c.conf.read_text()
    if "\nLicenses=" not in conf:
        fc.c.conf.write_text(conf + "Licenses=lic:4\n")
        fc.c.scontrol("reconfigure")
        time.sleep(2)
    fc.c.scontrol("update", "nodename=n1,n2", "AvailableFeatures=fa", "ActiveFeatures=fa")
    if "rtres" not in fc.c.scontrol("show", "reservation"):
        fc.c.scontrol("create", "reservation", "ReservationName=rtres", f"Users={VICTIM}", "Nodes=n1,n2",
                      "StartTime=now", "Duration=120", "Flags=IGNORE_JOBS")


def _shown(fc: FaultCluster, job: int) -> str:
    return f" {' '.join(fc.c.scontrol('show', 'job', str(job)).split())} "


def test_a_confined_jobs_rerun_stays_in_its_reservation_and_off_its_excluded_node(fc: FaultCluster) -> None:
    fc.set_config(oom_rerun_per_user_max=1000)
    _confine(fc)
    work = _workdir(fc, "f2", VICTIM)
    job = _submit(fc, VICTIM, work, f"#!/bin/bash\necho \"ran on $SLURMD_NODENAME\"\n"
                  f"if [ \"${{SLURM_SHARDS_ON_NODE:-0}}\" -lt 80 ]; then echo '{OOM_LINE}' >&2; exit 1; fi\n",
                  "--reservation=rtres", "--exclude=n1", "--gres=shard:2", "-C", "fa", "-L", "lic:1")
    try:
        assert _finish(fc, job)["job_state"] == "FAILED"
        orig = _shown(fc, job)
        assert " Reservation=rtres " in orig and " ExcNodeList=n1 " in orig
        reruns = _reruns_of(fc, [job])
        assert len(reruns) == 1, reruns
        rid = int(reruns[0]["job_id"])
        shown = _shown(fc, rid)
        for word in ("Reservation=rtres", "ExcNodeList=n1", "Features=fa", "Licenses=lic:1"):
            assert f" {word} " in shown, (word, shown)
        assert "shard:80" in reruns[0]["tres_per_node"], reruns[0]["tres_per_node"]
        done = fc.c.wait_job(rid, timeout=120)
        assert done["job_state"] == "COMPLETED" and done["nodes"] == "n2", done
    finally:
        fc.c.scontrol("delete", "reservation=rtres")
    out = (work / f"o-{job}.out").read_text()
    assert "ran on n2" in out and "rerunning it once on a whole GPU" in out, out


def test_a_het_components_oom_is_refused_with_the_reason(fc: FaultCluster) -> None:
    """The rerun cannot rebuild the other components of a heterogeneous job: not rerun, the reason in
    ``oom_events`` and in the job's output. Before: root resubmitted the leader's script alone on a whole
    GPU."""
    fc.set_config(oom_rerun_per_user_max=1000)
    work = _workdir(fc, "f2het", VICTIM)
    text = (f"#!/bin/bash\n#SBATCH --gres=shard:2\n#SBATCH hetjob\n#SBATCH --gres=shard:2\n"
            f"echo '{OOM_LINE}' >&2\nexit 1\n")
    job = _submit(fc, VICTIM, work, text)
    assert _finish(fc, job)["job_state"] == "FAILED"
    time.sleep(2)
    comps = [int(j["job_id"]) for j in fc.c.squeue() if j.get("het_job_id") in (job, {"set": True,
             "infinite": False, "number": job})]
    assert job in comps and len(comps) == 2, comps
    for comp in comps:
        fc.wait_hooks(comp, hooks=("epilog-slurmctld",))
    assert _reruns_of(fc, comps) == []
    rows = fc.rows(fc.c.ctld_db, "SELECT job_id, retry_status, retry_reason FROM oom_events WHERE job_id = ?",
                   (job,))
    assert len(rows) == 1 and rows[0]["retry_status"] == "not-retried", rows
    assert "heterogeneous job" in rows[0]["retry_reason"], rows
    out = (work / f"o-{job}.out").read_text()
    assert "could not carry what the job asked for (the other components of a heterogeneous job)" in out, out
    events = fc.rows(fc.c.ctld_db, "SELECT detail_json FROM events WHERE job_id = ? AND kind = ?",
                     (job, "oom-not-retried"))
    assert events and "heterogeneous" in json.loads(events[0]["detail_json"])["reason"], events


def test_the_rerun_keeps_its_required_node_and_memory_per_cpu(fc: FaultCluster) -> None:
    """Fifth campaign: ``-w n2`` and ``--mem-per-cpu`` were not carried either: the rerun could land on n1,
    with the node's default memory. (``--exclusive`` is carried too, ``tests/test_rerun_confinement.py``; on
    this cluster an exclusive job waits for Resources, so it is not run here.)"""
    fc.set_config(oom_rerun_per_user_max=1000)
    work = _workdir(fc, "f2w", VICTIM)
    job = _submit(fc, VICTIM, work, f"#!/bin/bash\necho \"ran on $SLURMD_NODENAME\"\n"
                  f"if [ \"${{SLURM_SHARDS_ON_NODE:-0}}\" -lt 80 ]; then echo '{OOM_LINE}' >&2; exit 1; fi\n",
                  "-w", "n2", "--mem-per-cpu=100", "--gres=shard:2")
    assert _finish(fc, job)["job_state"] == "FAILED"
    reruns = _reruns_of(fc, [job])
    assert len(reruns) == 1, reruns
    rid = int(reruns[0]["job_id"])
    shown = _shown(fc, rid)
    for word in ("ReqNodeList=n2", "MinMemoryCPU=100M"):
        assert f" {word} " in shown, (word, shown)
    done = fc.c.wait_job(rid, timeout=120)
    assert done["job_state"] == "COMPLETED" and done["nodes"] == "n2", done
