"""coloc-sbatch as a drop-in for sbatch, attacked as an ordinary user on the real cluster (docs/user.md).

- A model that prints at import, in ``__init__`` and in ``forward``: ``--parsable`` prints the job id alone.
- A model that forks a child and sleeps at import: coloc-sbatch returns after ``estimate_timeout_s`` with one
  warning line, the job goes in as without an estimate (a whole GPU), and the forked child is gone.
- 120 short script arguments and a 900-character kwarg: the job is accepted (the comment stays within Slurm's
  1024 characters), runs with every argument, and its controller record is complete.
Pure: ``fit_comment``/``comment_steps`` order and the user's own comment kept whole.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import pytest

from slurm_coloc.comment import MAX_COMMENT_CHARS, fit_comment, parse_comment
from slurm_coloc.submit.plan import comment_steps
from tests.cluster.reliability.conftest import FaultCluster

pytestmark = pytest.mark.slurm  # starts a real Slurm cluster

PRINTING_MODEL = """\
print("99999")
import torch


class Net(torch.nn.Module):
    def __init__(self, tag="t"):
        super().__init__()
        print("152 built", tag[:10])
        self.fc = torch.nn.Linear(3 * 8 * 8, 10)

    def forward(self, x):
        print("forward 77")
        return self.fc(x.flatten(1))
"""
SLEEPING_MODEL = """\
import os, sys, time
pid = os.fork()
if pid == 0:
    time.sleep(600)
    os._exit(0)
open({pidfile!r}, "w").write(str(pid))
time.sleep(600)
"""
JOB = """\
#!/bin/bash
#COLOC model={model}:Net input=3x8x8 batch=2{extra}
echo "args=$# last=${{@: -1}}"
"""


def _user_dir(fc: FaultCluster, name: str) -> Path:
    d = fc.c.jobs_dir / f"{name}-{os.getpid()}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    shutil.chown(d, "colocuser", "colocuser")
    return d


def _write(d: Path, name: str, text: str) -> Path:
    p = d / name
    p.write_text(text)
    shutil.chown(p, "colocuser", "colocuser")
    return p


def _job_id(stdout: str) -> int:
    assert stdout.count("\n") == 1 and stdout.strip().split(";")[0].isdigit(), repr(stdout)
    return int(stdout.strip().split(";")[0])


@pytest.mark.slurm
def test_parsable_prints_the_job_id_alone_whatever_the_model_prints(fc: FaultCluster) -> None:
    work = _user_dir(fc, "printing")
    _write(work, "printmod.py", PRINTING_MODEL)
    _write(work, "job.sh", JOB.format(model="printmod.py", extra=""))
    proc = fc.c.run(["coloc-sbatch", "--parsable", "-w", "n1", "-t", "2", "job.sh"], cwd=work, timeout=300)
    assert proc.returncode == 0, proc.stderr
    job = _job_id(proc.stdout)
    assert "99999" not in proc.stdout and "152" not in proc.stdout and "forward" not in proc.stdout
    assert fc.c.wait_job(job)["job_state"] == "COMPLETED"


@pytest.mark.slurm
def test_sleeping_model_is_bounded_and_its_forked_child_killed(fc: FaultCluster) -> None:
    fc.set_config(estimate_timeout_s=4)
    work = _user_dir(fc, "sleeping")
    pidfile = work / "forked.pid"
    _write(work, "sleepmod.py", SLEEPING_MODEL.format(pidfile=str(pidfile)))
    _write(work, "job.sh", JOB.format(model="sleepmod.py", extra=""))
    t0 = time.monotonic()
    proc = fc.c.run(["coloc-sbatch", "--parsable", "-w", "n1", "-t", "2", "job.sh"], cwd=work, timeout=120)
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    job = _job_id(proc.stdout)
    assert took < 30, took
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert (len(warnings) == 1 and "estimate_timeout_s (4 s)" in warnings[0]
            and "whole GPU" in warnings[0]), proc.stderr
    rec = fc.c.job(job)
    assert rec is not None and "shard:80" in json.dumps(rec.get("tres_per_node")), rec.get("tres_per_node")
    forked = int(pidfile.read_text())
    deadline = time.time() + 5
    while time.time() < deadline and Path(f"/proc/{forked}").exists() and \
            "State:\tZ" not in Path(f"/proc/{forked}/status").read_text(errors="replace"):
        time.sleep(0.1)
    status = Path(f"/proc/{forked}/status")
    assert (not status.exists()
            or "State:\tZ" in status.read_text(errors="replace")), "forked child outlived it"
    fc.c.wait_job(job)


@pytest.mark.slurm
def test_many_arguments_and_a_big_kwarg_are_accepted_and_recorded(fc: FaultCluster) -> None:
    work = _user_dir(fc, "bulky")
    _write(work, "printmod.py", PRINTING_MODEL)
    big = "x" * 900
    script = _write(work, "job.sh", JOB.format(model="printmod.py", extra=f" kwarg.tag={big}"))
    args = [f"a{i}" for i in range(120)]
    proc = fc.c.run(["coloc-sbatch", "--parsable", "-w", "n1", "-t", "2", "-o", "out-%j.txt", "job.sh",
                     *args],
                    cwd=work, timeout=300)
    assert proc.returncode == 0, proc.stderr
    job = _job_id(proc.stdout)
    assert fc.c.wait_job(job)["job_state"] == "COMPLETED"
    fc.wait_hooks(job, hooks=("epilog-slurmctld",))
    assert (work / f"out-{job}.txt").read_text().strip() == "args=120 last=a119"
    row = fc.rows(fc.ctld_db, "SELECT * FROM jobs WHERE job_id = ?", (job,))
    assert len(row) == 1, row
    rec = row[0]
    assert rec["user_name"] == "colocuser" and rec["shards_req"] and rec["estimate_mib"] > 0
    assert rec["estimate_method"] and rec["script_sha256"] == hashlib.sha256(script.read_bytes()).hexdigest()
    spec = json.loads(rec["spec_json"])
    assert spec["model"] == "printmod.py:Net" and spec["batch_size"] == 2 and spec["kwargs_chars"] >= 900
    comment = fc.c.job(job)["comment"]
    assert len(comment) <= MAX_COMMENT_CHARS and parse_comment(comment)["mem_mib"] == rec["estimate_mib"]


def test_fit_comment_drops_bulky_keys_in_order_and_keeps_the_users_text() -> None:
    data = {"v": 1, "mode": "shard", "shards": 4, "mem_mib": 3000, "method": "combined", "gpu_model": "H100",
            "sha256": "a" * 64, "spec": {"model": "m.py:Net", "kwargs": {"tag": "x" * 900}},
            "argv": ["a"] * 10}
    text, dropped = fit_comment(data, None, comment_steps(["a"] * 10))
    parsed = parse_comment(text)
    assert len(text) <= MAX_COMMENT_CHARS and dropped == ["the script arguments (Slurm's command line keeps "
                                                          "them)",
                                                          "the model's kwargs (they stay in the script's "
                                                          "#COLOC lines)"]
    assert parsed["spec"]["kwargs"] == {} and parsed["spec"]["kwargs_chars"] > 900 and "argv" not in parsed
    spaced = ["two words"] * 10  # Slurm's command line cannot give these back: the spec goes first
    text, dropped = fit_comment(data, None, comment_steps(spaced))
    assert "argv" in json.dumps(parse_comment(text)) or dropped[-1] == "the script arguments"
    assert dropped[0].startswith("the model's kwargs")
    mine = "u" * 1000  # plain sbatch takes it; the coloc JSON gives way, the user's text stays whole
    text, dropped = fit_comment(data, mine, comment_steps([]))
    assert text == mine and dropped[-1] == "the whole coloc JSON"
    small = {"v": 1, "mode": "shard", "shards": 4}
    assert fit_comment(small, "hi", comment_steps([])) == ('hi coloc:{"mode":"shard","shards":4,"v":1}', [])
