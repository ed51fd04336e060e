"""Job-level Slurm operations built on ``run`` and the pure parsers: submit, look up, AdminComment, and
stopping jobs (``scancel`` from the node sampler's watchdog, where its stderr goes, coloc-replay's clean-up).

Queries differ by release (``slurm/run.py``): ``squeue --json --states=all`` everywhere (22.05 ignores the
filter and lists every job; 24.11+ list only live jobs without it); one job is ``scontrol show job --json
<id>`` on 24.11+ (inside the epilogs ``job_state[0]`` is final) and the full list filtered here on 22.05.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import List, Mapping, Optional, Sequence, Union

from slurm_coloc.errors import SlurmError
from slurm_coloc.slurm.jobinfo import JobInfo, parse_job_json
from slurm_coloc.slurm.parse import parse_sbatch_parsable
from slurm_coloc.slurm.run import remember, run, slurm_version

_JOB_REF = re.compile(r"\d+(?:_\d+)?")


def sbatch(
    args: Sequence[str],
    bin_dir: str = "/usr/bin",
    env: Optional[Mapping[str, str]] = None,
    timeout_s: float = 60.0,
):
    """``sbatch <args>`` whatever its exit status (coloc-sbatch passes it on); SlurmError: missing or timed
    out.
    """
    return run(["sbatch", *args], bin_dir=bin_dir, env=env, timeout_s=timeout_s, check=False)


def squeue_all(bin_dir: str = "/usr/bin", env: Optional[Mapping[str, str]] = None,
               timeout_s: float = 30.0) -> List[JobInfo]:
    """``squeue --json --states=all`` (22.05: every job slurmctld holds); caches ``meta``'s release.
    SlurmError: squeue failed or printed something unparsable.
    """
    proc = run(["squeue", "--json", "--states=all"], bin_dir=bin_dir, env=env, timeout_s=timeout_s)
    jobs, version = parse_job_json(proc.stdout)
    if version is not None:
        remember(bin_dir, version)
    return jobs


_UNKNOWN_JOB = ("invalid job id", "job does not exist", "unknown job")


def job_info(job_id: int, bin_dir: str = "/usr/bin", env: Optional[Mapping[str, str]] = None,
             timeout_s: float = 30.0) -> Optional[JobInfo]:
    """``job_id`` as slurmctld knows it, or None once it has forgotten it (``MinJobAge``).

    ``scontrol show job --json <job_id>`` on 24.11+; older: ``squeue --json --states=all`` and pick the job
    (module docstring).
    SlurmError: Slurm failed, timed out or printed something unparsable.
    """
    job_id = int(job_id)
    deadline = time.monotonic() + timeout_s  # one budget for the version look-up (cached) and the query
    version = slurm_version(bin_dir, env, timeout_s=max(0.5, timeout_s / 3))
    timeout_s = max(0.5, deadline - time.monotonic())
    if version.json_job_query:
        proc = run(["scontrol", "show", "job", "--json", str(job_id)], bin_dir=bin_dir, env=env,
                   timeout_s=timeout_s, check=False)
        if proc.returncode != 0 and any(m in proc.stderr.lower() for m in _UNKNOWN_JOB):
            return None
        if proc.returncode != 0 and not proc.stdout.strip():
            err = " ".join(proc.stderr.split()) or f"exit status {proc.returncode}"
            raise SlurmError(f"scontrol show job --json failed: {err}", returncode=proc.returncode,
                             stderr=proc.stderr.strip())
        jobs = parse_job_json(proc.stdout)[0]
    else:
        jobs = squeue_all(bin_dir, env, timeout_s)
    for info in jobs:
        if info.job_id == job_id:
            return info
    return None


def show_job(job_id: int, bin_dir: str = "/usr/bin", env: Optional[Mapping[str, str]] = None,
             timeout_s: float = 30.0) -> JobInfo:
    """Like ``job_info`` for a job that must exist.
    SlurmError: as ``job_info``, or slurmctld does not know ``job_id``.
    """
    info = job_info(job_id, bin_dir, env, timeout_s)
    if info is None:
        raise SlurmError(f"slurmctld does not know job {int(job_id)}")
    return info


def write_batch_script(job_id: int, path: str, bin_dir: str = "/usr/bin",
                       env: Optional[Mapping[str, str]] = None, timeout_s: float = 15.0) -> None:
    """``scontrol write batch_script <job_id> <path>`` (a relative ``path`` is scontrol's working
    directory's).
    SlurmError: scontrol failed (unknown job, no script kept) or timed out.
    """
    run(["scontrol", "write", "batch_script", str(int(job_id)), path], bin_dir=bin_dir, env=env,
        timeout_s=timeout_s)


def sbatch_as_user(script_path: str, uid: int, gid: int, args: Sequence[str], script_args: Sequence[str] = (),
                   bin_dir: str = "/usr/bin", slurm_conf: Optional[str] = None,
                   timeout_s: float = 15.0) -> int:
    """Submit ``script_path`` as ``uid``/``gid`` from root; return the new job id.

    ``env -i PATH=/usr/bin:/bin SLURM_CONF=<conf> sbatch --parsable --uid=<uid> --gid=<gid> <args>
    <script_path> <script_args>``: a minimal environment, so nothing of the caller's (a hook's
    ``SLURM_SCRIPT_CONTEXT``, ``SBATCH_*``) reaches the job; ``--export=NONE`` in ``args`` makes slurmd load
    the user's login environment (docs/facts.md §6: ``--uid`` is for root only). ``slurm_conf`` None: sbatch's
    default.
    SlurmError: sbatch refused the job (its stderr is carried), timed out, or printed no job id.
    """
    env = {"PATH": "/usr/bin:/bin"}
    if slurm_conf:
        env["SLURM_CONF"] = slurm_conf
    argv = ["sbatch", "--parsable", f"--uid={int(uid)}", f"--gid={int(gid)}", *args, script_path,
            *script_args]
    proc = run(argv, bin_dir=bin_dir, env=env, timeout_s=timeout_s)
    return parse_sbatch_parsable(proc.stdout)[0]


def spank_options_available(bin_dir: str = "/usr/bin", env: Optional[Mapping[str, str]] = None) -> bool:
    """Whether ``sbatch --help`` lists the SPANK plugin's ``--coloc-mem``; False when sbatch cannot be run."""
    try:
        proc = run(["sbatch", "--help"], bin_dir=bin_dir, env=env, timeout_s=10.0, check=False)
    except SlurmError:
        return False
    return "--coloc-mem" in proc.stdout


def _job_ref(job: Union[int, str]) -> str:
    """``12`` / ``"12"`` / ``"12_3"`` (an array task) -> the string; anything else raises SlurmError."""
    ref = str(job)
    if not _JOB_REF.fullmatch(ref):
        raise SlurmError(f"not a job id: {ref!r}")
    return ref


def set_admin_comment(job: Union[int, str], text: str, bin_dir: str = "/usr/bin",
                      env: Optional[Mapping[str, str]] = None, timeout_s: float = 10.0) -> None:
    """``scontrol update jobid=<job> AdminComment=<text>`` (root/SlurmUser; one argv word, no shell).

    ``job``: an id or ``<array_job_id>_<array_task_id>`` (``JobInfo.slurm_ref``; a bare array id names every
    task).
    SlurmError: ``text`` holds a newline, ``job`` is not a job reference, or scontrol refused (not root,
    unknown job) or timed out.
    """
    if "\n" in text:
        raise SlurmError("AdminComment must be one line")
    run(["scontrol", "update", f"jobid={_job_ref(job)}", f"AdminComment={text}"], bin_dir=bin_dir, env=env,
        timeout_s=timeout_s)


def set_admin_comment_accounting(job: Union[int, str], text: str, bin_dir: str = "/usr/bin",
                                 env: Optional[Mapping[str, str]] = None, timeout_s: float = 10.0) -> None:
    """``sacctmgr -i update job where jobid=<job> set AdminComment=<text>`` (``job`` as
    ``set_admin_comment``).

    slurmctld refuses ``scontrol update`` once a job has finished (22.05: ``Job has already finished``), so at
    job end slurmdbd is the only store (as jobstats does); without slurmdbd it fails.
    SlurmError: ``text`` holds a newline, ``job`` is not a job reference, or sacctmgr failed (no slurmdbd,
    not an admin) or timed out.
    """
    if "\n" in text:
        raise SlurmError("AdminComment must be one line")
    run(["sacctmgr", "-i", "update", "job", "where", f"jobid={_job_ref(job)}", "set", f"AdminComment={text}"],
        bin_dir=bin_dir, env=env, timeout_s=timeout_s)


def admin_comment_accounting(job: Union[int, str], bin_dir: str = "/usr/bin",
                             env: Optional[Mapping[str, str]] = None, timeout_s: float = 10.0) -> str:
    """``sacct -n -P -X -o AdminComment -j <job>``'s first line (``job`` as ``set_admin_comment``); ``""`` for
    none.
    SlurmError: ``job`` is not a job reference, or sacct failed (no slurmdbd) or timed out.
    """
    proc = run(["sacct", "-n", "-P", "-X", "-o", "AdminComment", "-j", _job_ref(job)], bin_dir=bin_dir,
               env=env,
               timeout_s=timeout_s)
    return proc.stdout.strip().splitlines()[0] if proc.stdout.strip() else ""


@dataclass(frozen=True)
class StderrTarget:
    """A job's expanded stderr path (``StdErr``; ``StdOut`` when Slurm shows none) and its user's uid/gid."""

    path: str
    uid: int
    gid: int


def scancel(job_id: int, bin_dir: str = "/usr/bin", env: Optional[Mapping[str, str]] = None,
            timeout_s: float = 15.0) -> None:
    """``scancel <job_id>`` (an ended job is no error to Slurm); SlurmError: missing, timed out or refused."""
    run(["scancel", str(int(job_id))], bin_dir=bin_dir, env=env, timeout_s=timeout_s)


def cancel_jobs(job_ids: Sequence[int], bin_dir: str = "/usr/bin",
                env: Optional[Mapping[str, str]] = None) -> None:
    """One ``scancel <id>...`` for all ``job_ids``, best effort (coloc-replay's clean-up): refusal is ignored.
    SlurmError: scancel missing or timed out.
    """
    if job_ids:
        run(["scancel", *[str(int(j)) for j in job_ids]], bin_dir=bin_dir, env=env, check=False)


def parse_stderr_target(job: JobInfo) -> StderrTarget:
    """A job's stderr path (stdout's when Slurm shows none) and uid/gid, from ``squeue --json``, never user
    text.
    SlurmError: no path or no uid/gid in the record.
    """
    path = job.stderr_path or job.stdout_path
    if not path or job.uid is None or job.gid is None:
        raise SlurmError(f"Slurm shows no stderr path or uid/gid for job {job.job_id}")
    return StderrTarget(path, int(job.uid), int(job.gid))


def stderr_target(job_id: int, bin_dir: str = "/usr/bin", env: Optional[Mapping[str, str]] = None,
                  timeout_s: float = 15.0) -> StderrTarget:
    """Where ``job_id`` writes its stderr, and as whom (``jobs.job_info``).
    SlurmError: unknown job, squeue failure, or fields missing.
    """
    job = job_info(job_id, bin_dir, env, timeout_s)
    if job is None:
        raise SlurmError(f"Slurm no longer knows job {job_id}")
    return parse_stderr_target(job)
