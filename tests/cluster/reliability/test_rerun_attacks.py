"""The third campaign: attacks by ordinary users on the OOM rerun and the TaskProlog, on the real
cluster (docs/reliability.md "Third campaign"). Each test says what it found before the fix.

N1: directives root's ``sbatch --uid`` read from the user's script; N2: one array task's OOM rerun the whole
array;
N6: het components got the leader's env file; N9: ``--export=COLOC_RUN_DIR=...`` removed the TaskProlog's
exports.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

from tests.cluster.reliability.conftest import FaultCluster
from tests.cluster.reliability.test_job_facts import _with_fake_mps

pytestmark = pytest.mark.slurm
OOM_LINE = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
VICTIM, ATTACKER = "colocuser", "colocuser2"


def _num(v: Any) -> Any:
    """A number of 22.05's JSON or a 24.11+ number object."""
    if isinstance(v, dict):
        return v.get("number") if v.get("set", True) else None
    return v


def _workdir(fc: FaultCluster, name: str, owner: str) -> Path:
    d = fc.c.jobs_dir / f"{name}-{os.getpid()}-{time.monotonic_ns()}"
    d.mkdir()
    shutil.chown(d, owner, owner)
    return d


def _submit(fc: FaultCluster, user: str, cwd: Path, text: str, *opts: str) -> int:
    script = cwd / f"j-{time.monotonic_ns()}.sh"
    script.write_text(text)
    shutil.chown(script, user, user)
    script.chmod(0o755)
    proc = fc.c.run(["sbatch", "--parsable", "-t", "5", "-o", "o-%j.out", *opts, str(script)], user=user,
                    cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.strip().split(";")[0])


def _finish(fc: FaultCluster, job: int, timeout: float = 120) -> Dict:
    rec = fc.c.wait_job(job, timeout=timeout)
    fc.wait_hooks(job, hooks=("epilog-slurmctld",))
    return rec


def _reruns_of(fc: FaultCluster, jobs: List[int]) -> List[Dict]:
    tags = {f"oom-retry-of-{j}" for j in jobs}
    return [j for j in fc.c.squeue() if tags & set((j.get("comment") or "").split())]


# (directive lines, what root's rerun got from them before the fix, what scontrol shows after it)
DIALECTS = {
    "pbs-nice": ("#PBS -p -1000\n#PBS -N pbs-renamed\n", ["Nice=-1000"], ["Nice=0", "JobName=n1-attack"]),
    "bsub-exclusive-node": ("#BSUB -x\n#BSUB -m n2\n", ["OverSubscribe=NO", "ReqNodeList=n2"],
                            ["ReqNodeList=(null)"]),
}
SHARING_KEYS = ("OverSubscribe=", "Exclusive=")  # the rerun shares its node as the original did


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_pbs_and_bsub_directives_never_become_options_of_roots_rerun(fc: FaultCluster, dialect: str) -> None:
    """N1. Before: root's ``sbatch --uid`` read the script's ``#PBS``/``#BSUB`` lines that the user's own
    submission ignored (``--ignore-pbs``): the rerun of ``#PBS -p -1000`` had Nice=-1000 (the user's own
    sbatch refuses it: "Invalid --nice value"), and ``#BSUB -x -m n2`` made it take node n2 exclusively."""
    fc.set_config(oom_rerun_per_user_max=1000)
    lines, _before, after = DIALECTS[dialect]
    work = _workdir(fc, "n1", ATTACKER)
    own = fc.c.run(["sbatch", "--parsable", "--nice=-1000", "--wrap", "true"], user=ATTACKER, cwd=work)
    assert own.returncode != 0  # what the attacker may not do directly
    job = _submit(fc, ATTACKER, work, f"#!/bin/bash\n{lines}echo '{OOM_LINE}' >&2\nexit 1\n",
                  "--ignore-pbs", "--gres=shard:2", "-J", "n1-attack")
    assert _finish(fc, job)["job_state"] == "FAILED"
    reruns = _reruns_of(fc, [job])
    assert len(reruns) == 1, reruns
    rerun = reruns[0]
    try:
        shown = f" {' '.join(fc.c.scontrol('show', 'job', str(rerun['job_id'])).split())} "
        assert all(f" {w} " in shown for w in after), shown
        orig = fc.c.scontrol("show", "job", str(job)).split()
        assert [w for w in shown.split() if w.startswith(SHARING_KEYS)] == \
            [w for w in orig if w.startswith(SHARING_KEYS)], (shown, orig)
        assert rerun["user_name"] == ATTACKER and rerun["tres_per_node"].endswith("shard:80")
    finally:
        fc.c.run(["scancel", str(rerun["job_id"])], user=None)
        _finish(fc, rerun["job_id"])


def test_one_array_tasks_oom_reruns_that_task_alone(fc: FaultCluster) -> None:
    """N2. Before: task 0's OOM resubmitted ``--array=0-3`` on whole GPUs: 4 reruns (``_0``..``_3``), the
    tasks that had succeeded included, for one unit of the budget."""
    fc.set_config(oom_rerun_per_user_max=1000)
    work = _workdir(fc, "n2", VICTIM)
    text = ("#!/bin/bash\n#SBATCH --array=0-3\n"
            "if [ \"$SLURM_ARRAY_TASK_ID\" = 0 ] && [ \"${SLURM_SHARDS_ON_NODE:-0}\" -lt 80 ]; then\n"
            f"  echo '{OOM_LINE}' >&2; exit 1\nfi\necho \"task $SLURM_ARRAY_TASK_ID done on "
            "$SLURM_SHARDS_ON_NODE\"\n")
    array = _submit(fc, VICTIM, work, text, "--gres=shard:2", "-o", "a-%A_%a.out")
    tasks: Dict[int, int] = {}
    deadline = time.time() + 60
    while len(tasks) < 4 and time.time() < deadline:
        tasks = {int(_num(j["array_task_id"])): int(j["job_id"]) for j in fc.c.squeue()
                 if _num(j.get("array_job_id")) == array and _num(j.get("array_task_id")) is not None}
        time.sleep(0.5)
    assert sorted(tasks) == [0, 1, 2, 3], tasks
    states = {t: _finish(fc, j)["job_state"] for t, j in tasks.items()}
    assert states == {0: "FAILED", 1: "COMPLETED", 2: "COMPLETED", 3: "COMPLETED"}, states
    time.sleep(1)
    reruns = _reruns_of(fc, list(tasks.values()))
    assert len(reruns) == 1, [(r["job_id"], r.get("array_task_id")) for r in reruns]
    rerun = reruns[0]
    assert _num(rerun["array_task_id"]) == 0 and f"oom-retry-of-{tasks[0]}" in rerun["comment"]
    done = fc.c.wait_job(int(rerun["job_id"]), timeout=120)
    assert done["job_state"] == "COMPLETED"
    out = (work / f"a-{array}_0.out").read_text()
    assert "task 0 done on 80" in out  # appended to task 0's own output
    rows = fc.rows(fc.c.ctld_db, "SELECT job_id, retry_job_id FROM oom_events WHERE retry_job_id IS NOT NULL "
                   "AND job_id IN (?, ?, ?, ?)", tuple(tasks.values()))
    assert rows == [{"job_id": tasks[0],
                     "retry_job_id": int(rerun["job_id"])}], rows  # one unit of the budget


def test_each_het_component_gets_its_own_grants_env(fc: FaultCluster) -> None:
    """N6. Before: a step of het component 1 (2 shards) got the leader's 1-shard env file (``0=1G``): the
    TaskProlog read ``SLURM_JOB_ID``, which names the leader in every component's tasks."""
    _with_fake_mps(fc)
    work = _workdir(fc, "n6", VICTIM)
    text = ("#!/bin/bash\n#SBATCH --gres=shard:1\n#SBATCH hetjob\n#SBATCH --gres=shard:2\n"
            "srun --het-group=0 sh -c 'echo G0 $COLOC_SHARE $CUDA_MPS_PINNED_DEVICE_MEM_LIMIT'\n"
            "srun --het-group=1 sh -c 'echo G1 $COLOC_SHARE $CUDA_MPS_PINNED_DEVICE_MEM_LIMIT'\n")
    job = _submit(fc, VICTIM, work, text)
    assert _finish(fc, job)["job_state"] == "COMPLETED"
    lines = [ln.split() for ln in (work / f"o-{job}.out").read_text().splitlines() if ln.startswith("G")]
    assert ["G0", "mps", "0=1G"] in lines and ["G1", "mps", "0=2G"] in lines, lines


@pytest.mark.parametrize("how", ["coloc-keys", "pythonpath"])
def test_exported_variables_do_not_remove_the_taskprologs_exports(fc: FaultCluster, how: str) -> None:
    """N9. Before: ``--export=ALL,COLOC_RUN_DIR=<dir>`` pointed the TaskProlog at an empty run directory, and
    ``PYTHONPATH=<dir holding a slurm_coloc package>`` replaced the TaskProlog's own code (found in this
    campaign): either way the task had no ``COLOC_SHARE`` and kept the user's own
    ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=79G``."""
    _with_fake_mps(fc)
    work = _workdir(fc, "n9", ATTACKER)
    own = work / "run"
    (own / "jobs").mkdir(parents=True)
    (work / "py" / "slurm_coloc").mkdir(parents=True)
    (work / "py" / "slurm_coloc" / "__init__.py").write_text("raise SystemExit(3)\n")
    for p in (own, own / "jobs", work / "py", work / "py" / "slurm_coloc",
              work / "py" / "slurm_coloc" / "__init__.py"):
        shutil.chown(p, ATTACKER, ATTACKER)
    text = "#!/bin/bash\nenv | grep -E '^(COLOC_SHARE|CUDA_MPS_PINNED_DEVICE_MEM_LIMIT)=' | sort\n"
    extra = {"coloc-keys": f"COLOC_RUN_DIR={own},COLOC_MPS_MODE=off,COLOC_STATE_DIR={own}",
             "pythonpath": f"PYTHONPATH={work / 'py'},"
                           f"PYTHONSTARTUP={work / 'py' / 'slurm_coloc' / '__init__.py'}"}[how]
    export = f"--export=ALL,{extra},CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=79G"
    job = _submit(fc, ATTACKER, work, text, "--gres=shard:2", "-w", "n1", export)
    assert _finish(fc, job)["job_state"] == "COMPLETED"
    env = dict(ln.split("=", 1) for ln in (work / f"o-{job}.out").read_text().splitlines() if "=" in ln)
    assert env == {"COLOC_SHARE": "mps", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=2G"}, env
