"""OOM recovery on a real Slurm cluster of any version (``COLOC_SLURM``; no GPU: jobs print real OOM messages;
GRES shards are real).

One campaign submits every case at once (the timeout case needs a minute), then each test checks one case:
an OOM on shards gets exactly one rerun on a whole GPU that completes; a rerun that OOMs again is not rerun; a
timeout, a scancel (also where the shell exits 143 on the SIGTERM), a plain ``exit 1`` and an OOM on a whole
GPU are not rerun; a planted symlink as the stderr path (file or directory) is not followed.
"""
from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import statistics
import time
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from slurm_coloc.store import oom as store_oom
from slurm_coloc.store.db import open_readonly
from tests.slurm_cluster import REPO, Cluster

pytestmark = pytest.mark.slurm  # starts a real Slurm cluster

USER = "colocuser"
SHA = "0123456789abcdef" * 4
OOM_LINE = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
            "capacity "
            "of 79.18 GiB")
SLEEPER = f"#!/bin/bash\necho '{OOM_LINE}' >&2\nsleep 600\n"
# The shell exits 128+15 when the time-out's or scancel's SIGTERM arrives (as bash does when its child dies of
# the signal first): ExitCode=143:0, no signal, on an OOM line.
TERM_143 = f"#!/bin/bash\necho '{OOM_LINE}' >&2\ntrap 'exit 143' TERM\nsleep 600 &\nwait\n"
PLAIN_FAIL = "#!/bin/bash\necho 'ValueError: bad config' >&2\nexit 1\n"
# The job replaces its own stderr file by a symlink to a root-owned, world-readable file that holds an OOM
# message, then fails: a hook that follows it would see "OOM" and rerun the job.
FILE_LINK = "#!/bin/bash\nrm -f \"$1\"\nln -s \"$2\" \"$1\"\nexit 1\n"
DIR_LINK = "#!/bin/bash\nmv \"$1\" \"$1.real\"\nln -s \"$2\" \"$1\"\nexit 1\n"


def _sbatch(c: Cluster, cwd: Path, args: List[str]) -> int:
    out = c.run(["sbatch", "--parsable", *args], user=USER, cwd=cwd)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip().split(";")[0])


def _retries_of(c: Cluster, job_id: int) -> List[dict]:
    tag = f"oom-retry-of-{job_id}"
    return [j for j in c.squeue() if tag in (j.get("comment") or "").split()]


def _wait_retry(c: Cluster, job_id: int, timeout: float = 180) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = _retries_of(c, job_id)
        if found:
            return found[0]
        time.sleep(0.3)
    raise TimeoutError(f"no rerun of job {job_id} after {timeout} s")


def _oom_row(c: Cluster, job_id: int) -> Optional[store_oom.OomRecord]:
    return store_oom.load_oom_event(open_readonly(c.ctld_db), job_id)


@pytest.fixture(scope="module")
def campaign(slurm_cluster: Cluster) -> Dict[str, object]:
    c = slurm_cluster
    work = c.jobs_dir / f"oom-{os.getpid()}"
    work.mkdir()
    shutil.chown(work, USER, USER)
    job = work / "oom_job.sh"
    shutil.copy(REPO / "examples" / "oom_job.sh", job)
    for name, text in (("sleeper.sh", SLEEPER), ("term143.sh", TERM_143), ("plain.sh", PLAIN_FAIL),
                       ("file_link.sh", FILE_LINK), ("dir_link.sh", DIR_LINK)):
        (work / name).write_text(text)
    for p in work.iterdir():
        os.chmod(p, 0o755)
        shutil.chown(p, USER, USER)
    # root-owned bait, world-readable, holding an OOM message
    bait_dir = c.dir / "bait"
    bait_dir.mkdir(mode=0o755, exist_ok=True)
    (bait_dir / "err.txt").write_text(OOM_LINE + "\n")
    os.chmod(bait_dir / "err.txt", 0o644)
    (work / "d").mkdir()
    shutil.chown(work / "d", USER, USER)
    comment = f'--comment=coloc:{{"v":1,"mode":"shard","shards":4,"mem_mib":3500,"sha256":"{SHA}"}}'
    # 24.11 records the batch script alone (its arguments are nowhere a hook can read:
    # docs/slurm-versions.md), so a plain sbatch's "200" cannot reach the rerun there (it would rerun with the
    # default need and complete); coloc-sbatch carries the arguments in the comment's argv, the rerun's only
    # source on 24.11: "again" carries them as coloc-sbatch writes them. 22.05 (command) and 26.05
    # (submit_line) keep them: plain sbatch there.
    again_comment = [f'--comment=coloc:{{"v":1,"mode":"shard","shards":4,"mem_mib":3500,'
                     f'"sha256":"{SHA[::-1]}","argv":["200"]}}'] if c.version == "24.11" else []
    ids = {
        "oom": _sbatch(c, work,
                       ["-J", "oom-once", "--gres=shard:4", "-t", "10", "-o", "once.out", "-e", "once.err",
                                 comment, str(job), "8"]),
        "again": _sbatch(c, work,
                         ["-J", "oom-again", "--gres=shard:4", "-o", "again.out", *again_comment, str(job),
                                   "200"]),
        "timeout": _sbatch(c, work, ["-J", "oom-timeout", "--gres=shard:2", "-t", "1", "-o", "timeout.out",
                                     str(work / "sleeper.sh")]),
        "cancel": _sbatch(c, work, ["-J", "oom-cancel", "--gres=shard:2", "-o", "cancel.out",
                                    str(work / "sleeper.sh")]),
        "timeout143": _sbatch(c, work, ["-J", "oom-timeout143", "--gres=shard:2", "-t", "1", "-o", "t143.out",
                                        str(work / "term143.sh")]),
        "cancel143": _sbatch(c, work, ["-J", "oom-cancel143", "--gres=shard:2", "-o", "c143.out",
                                       str(work / "term143.sh")]),
        "plain": _sbatch(c, work,
                         ["-J", "plain-fail", "--gres=shard:2", "-o", "plain.out", str(work / "plain.sh")]),
        "whole": _sbatch(c, work, ["-J", "oom-whole", "--gres=shard:80", "-o", "whole.out", str(job), "200"]),
        "file_link": _sbatch(c, work, ["-J", "link-file", "--gres=shard:2", "-o", "fl.out", "-e", "fl.err",
                                       str(work / "file_link.sh"), str(work / "fl.err"),
                                       str(bait_dir / "err.txt")]),
        "dir_link": _sbatch(c, work, ["-J", "link-dir", "--gres=shard:2", "-o", "dl.out", "-e", "d/err.txt",
                                      str(work / "dir_link.sh"), str(work / "d"), str(bait_dir)]),
    }
    for case in ("cancel", "cancel143"):
        c.wait_state(ids[case], ["RUNNING"], timeout=60)
    time.sleep(1)
    assert c.run(["scancel", str(ids["cancel"]), str(ids["cancel143"])], user=USER).returncode == 0
    final = {k: c.wait_job(v, timeout=240) for k, v in ids.items()}
    return {"dir": work, "ids": ids, "final": final}


def test_oom_on_shards_gets_exactly_one_rerun_on_a_whole_gpu_that_completes(slurm_cluster: Cluster,
                                                                           campaign) -> None:
    c, orig = slurm_cluster, campaign["ids"]["oom"]
    assert campaign["final"]["oom"]["job_state"] == "FAILED"
    retry = _wait_retry(c, orig)
    done = c.wait_job(retry["job_id"], timeout=300)
    assert done["job_state"] == "COMPLETED"
    assert len(_retries_of(c, orig)) == 1
    assert done["tres_per_node"] == "gres:shard:80"
    assert done["name"] == "oom-once" and done["user_name"] == USER and done["partition"] == "debug"
    assert done["time_limit"] == 10
    work = campaign["dir"]
    out, err = (work / "once.out").read_text(), (work / "once.err").read_text()
    assert "4 GiB of GPU" in out and "trained 10 steps with 80 GiB" in out          # both attempts, appended
    assert "torch.OutOfMemoryError" in err                                          # first attempt's log kept
    assert f"rerunning it once on a whole GPU as job {retry['job_id']}" in err      # the user is told
    row = _oom_row(c, orig)
    assert row is not None and row.retry_status == "submitted" and row.retry_job_id == retry["job_id"]
    # the history key is root's hash of the script Slurm stored and the job's uid, never the comment's sha256
    root_sha = hashlib.sha256((work / "oom_job.sh").read_bytes()).hexdigest()
    assert row.fence_mib == 4096 and row.script_sha256 == root_sha != SHA and row.retry_state == "COMPLETED"
    assert row.evidence["messages"][0][0] == "torch.OutOfMemoryError"
    # the campaign's other OOM jobs run the same script as the same user, so they share this key: this job's
    # fence is among them, and a rerun that died again adds the whole GPU's fence
    hist = store_oom.history_peaks_mib(open_readonly(c.ctld_db), root_sha, pwd.getpwnam(USER).pw_uid)
    assert 4096 in hist and set(hist) <= {4096, 81920}, hist
    assert store_oom.history_peaks_mib(open_readonly(c.ctld_db), SHA, pwd.getpwnam(USER).pw_uid) == []


def test_rerun_that_ooms_again_is_not_rerun(slurm_cluster: Cluster, campaign) -> None:
    c, orig = slurm_cluster, campaign["ids"]["again"]
    retry = _wait_retry(c, orig)
    assert c.wait_job(retry["job_id"])["job_state"] == "FAILED"
    deadline = time.time() + 20
    row = None
    while time.time() < deadline and row is None:
        row = _oom_row(c, retry["job_id"])
        time.sleep(0.3)
    assert row is not None and row.retry_status == "not-retried" and row.retry_of == orig
    time.sleep(3)
    assert _retries_of(c, retry["job_id"]) == [] and len(_retries_of(c, orig)) == 1
    assert "not rerun again" in (campaign["dir"] / "again.out").read_text()


@pytest.mark.parametrize("case,state", [("timeout", "TIMEOUT"), ("cancel", "CANCELLED"), ("plain", "FAILED"),
                                        ("timeout143", "TIMEOUT"), ("cancel143", "CANCELLED")])
def test_timeout_cancel_and_plain_failure_are_not_rerun(slurm_cluster: Cluster, campaign, case: str,
                                                        state: str) -> None:
    job_id = campaign["ids"][case]
    assert campaign["final"][case]["job_state"] == state
    assert _retries_of(slurm_cluster, job_id) == []
    assert _oom_row(slurm_cluster, job_id) is None


def test_oom_on_a_whole_gpu_is_recorded_but_not_rerun(slurm_cluster: Cluster, campaign) -> None:
    job_id = campaign["ids"]["whole"]
    assert campaign["final"]["whole"]["job_state"] == "FAILED"
    row = _oom_row(slurm_cluster, job_id)
    assert row is not None and row.retry_status == "not-retried" and "whole GPU" in row.retry_reason
    assert _retries_of(slurm_cluster, job_id) == []


@pytest.mark.parametrize("case", ["file_link", "dir_link"])
def test_planted_symlink_as_stderr_is_not_followed(slurm_cluster: Cluster, campaign, case: str) -> None:
    job_id = campaign["ids"][case]
    assert campaign["final"][case]["job_state"] == "FAILED"
    assert _retries_of(slurm_cluster, job_id) == []
    assert _oom_row(slurm_cluster, job_id) is None
    bait = (slurm_cluster.dir / "bait" / "err.txt").read_text()
    assert bait == OOM_LINE + "\n"  # and nothing was appended through the link


def test_time_from_oom_death_to_rerun_running(slurm_cluster: Cluster, campaign) -> None:
    """Figure: seconds from the OOM death (EndTime) to the rerun running (StartTime); no job may be lost."""
    c, work = slurm_cluster, campaign["dir"]
    gaps, lost = [], 0
    for i in range(5):
        orig = _sbatch(c, work, ["-J", f"oom-lat{i}", "--gres=shard:3", "-o", f"lat{i}.out",
                                 str(work / "oom_job.sh"), "8"])
        first = c.wait_job(orig)
        retry = c.wait_job(_wait_retry(c, orig)["job_id"])
        lost += retry["job_state"] != "COMPLETED"
        gaps.append(retry["start_time"] - first["end_time"])
    print(f"\nOOM death -> rerun running: median {statistics.median(gaps):.1f} s over {len(gaps)} runs "
          f"(each {gaps}); jobs lost: {lost}")
    assert lost == 0
