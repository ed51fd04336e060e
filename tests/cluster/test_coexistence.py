"""Living beside what sites run, on a real local Slurm cluster (``COLOC_SLURM`` = 22.05, 24.11 or 26.05):

- a job whose AdminComment already holds jobstats' ``JS1:`` summary keeps it through our PrologSlurmctld and
  EpilogSlurmctld; another tool's plain text is kept, with our part after it;
- sbatch options newer than 22.05 with a space-separated value (``--tres-per-task X`` ... ``--container-id
  X``)
  reach Slurm as options, and the script stays the script (24.11+ only: 22.05's sbatch has none of them).
"""
from __future__ import annotations

import base64
import gzip
import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Dict

import pytest

from tests.slurm_cluster import Cluster

pytestmark = pytest.mark.slurm
# jobstats' format: "JS1:" + base64(gzip(JSON)); a real one, so a reader that decodes it must still succeed
JS1 = "JS1:H4sIAAAAAAACA6tWystPSS1WslKoVsozBFPJBaUgvmFtrY6CUkl+SWJOfElmbipYCABWMz9kLwAAAA=="


def _script(cluster: Cluster, name: str, body: str = "sleep 1\n") -> Path:
    path = cluster.jobs_dir / name
    path.write_text(f"#!/bin/sh\n{body}")
    os.chmod(path, 0o755)
    return path


def _show(cluster: Cluster, job: int) -> Dict[str, str]:
    """``scontrol show job -o`` as a dict (AdminComment: the value up to the next `` Comment=`` or ``
    StdErr=``, the fields that follow it on 22.05-26.05)."""
    line = cluster.scontrol("show", "job", "-o", str(job)).strip()
    admin = ""
    if " AdminComment=" in line:
        rest = line.split(" AdminComment=", 1)[1]
        admin = (rest.split(" Comment=", 1)[0] if " Comment=" in rest
                 else rest.split(" StdErr=", 1)[0]).strip()
    out = dict(w.split("=", 1) for w in line.split() if "=" in w)
    out["AdminComment"] = admin
    return out


def _wait_end_hook(cluster: Cluster, job: int, timeout: float = 60) -> dict:
    """The ``admin-comment`` event EpilogSlurmctld records last (hooks/ctld.py)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cluster.ctld_db.exists():
            with sqlite3.connect(cluster.ctld_db) as conn:
                rows = conn.execute("SELECT detail_json FROM events WHERE job_id = ? AND kind = "
                                    "'admin-comment'",
                                    (job,)).fetchall()
            if rows:
                return json.loads(rows[-1][0])
        time.sleep(0.5)
    raise TimeoutError(f"no admin-comment event for job {job}")


def _submit_held_with_admin_comment(cluster: Cluster, name: str, text: str) -> int:
    proc = cluster.run(["coloc-sbatch", "--parsable", "--hold", "--coloc-mem", "2G", "-o", f"{name}-%j.out",
                        str(_script(cluster, f"{name}.sh"))])
    assert proc.returncode == 0, proc.stderr
    job = int(proc.stdout.strip().split(";")[0])
    cluster.scontrol("update", f"jobid={job}", f"AdminComment={text}")  # as root, like jobstats
    assert _show(cluster, job)["AdminComment"] == text
    cluster.scontrol("release", str(job))
    return job


def test_jobstats_summary_and_foreign_text_survive_our_hooks(slurm_cluster: Cluster) -> None:
    js = _submit_held_with_admin_comment(slurm_cluster, "js1", JS1)
    site = _submit_held_with_admin_comment(slurm_cluster, "site", "site=abc owner=hpc")
    for job in (js, site):
        assert slurm_cluster.wait_job(job, timeout=120)["job_state"] == "COMPLETED"
        _wait_end_hook(slurm_cluster, job)
    assert _show(slurm_cluster, js)["AdminComment"] == JS1  # untouched: jobstats decodes the whole field
    merged = _show(slurm_cluster, site)["AdminComment"]
    assert merged.startswith("site=abc owner=hpc {\"coloc\":"), merged
    ours = json.loads(merged[len("site=abc owner=hpc "):])
    # the end summary or (22.05) the start note
    assert ours.get("coloc") == 1 or ours["coloc"]["shards"] == 2, ours
    decoded = json.loads(gzip.decompress(base64.b64decode(_show(slurm_cluster, js)["AdminComment"][4:])))
    assert decoded["nodes"] == {"n1": {"cpus": 1}}  # what jobstats reads back


NEWER = [("--tres-per-task", "cpu=1", "TresPerTask=cpu=1"), ("--segment", "1", "SegmentSize=1"),
         ("--tres-bind", "gres/gpu:verbose,per_task:1", "TresBind=gres/gpu:verbose,per_task:1"),
         ("--extra", "site=x", "Extra=site=x"), ("--container-id", "abc", "ContainerID=abc")]


def test_newer_sbatch_options_with_a_separate_value(slurm_cluster: Cluster) -> None:
    if slurm_cluster.version == "22.05":
        pytest.skip("22.05's sbatch has none of these options")
    script = _script(slurm_cluster, "newer.sh")
    jobs = {}
    for opt, value, shown in NEWER:
        proc = slurm_cluster.run(["coloc-sbatch", "--parsable", "--coloc-mem", "2G", opt, value, str(script),
                                  "arg1"])
        assert proc.returncode == 0, (opt, proc.stderr)
        jobs[int(proc.stdout.strip().split(";")[0])] = shown
    for job, shown in jobs.items():
        rec = _show(slurm_cluster, job)
        assert rec["Command"] == str(script) and shown in slurm_cluster.scontrol("show", "job", "-o",
                                                                                 str(job))
        assert "gres/shard:2" in rec.get("TresPerNode", "") or "shard:2" in rec.get("TresPerNode", "")
        assert slurm_cluster.wait_job(job, timeout=120)["job_state"] == "COMPLETED"
    # --prefer reaches Slurm as an option: this cluster has no feature a100, so Slurm itself refuses it
    proc = slurm_cluster.run(["coloc-sbatch", "--coloc-mem", "2G", "--prefer", "a100", str(script)])
    assert proc.returncode != 0 and "preferred feature" in proc.stderr and "does not exist" not in proc.stderr
    dry = slurm_cluster.run(["coloc-sbatch", "--dry-run", "--coloc-mem", "2G", "--prefer", "a100",
                             str(script)])
    assert dry.returncode == 0 and dry.stdout.split()[1:3] == ["--prefer", "a100"], dry.stdout
    assert dry.stdout.rstrip().endswith(str(script))
