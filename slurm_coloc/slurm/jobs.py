"""Job-level Slurm operations on ``run`` and the pure parsers: submit, look up, AdminComment, and stopping
jobs (the watchdog's ``scancel`` and where the job's stderr goes, coloc-replay's clean-up). Queries differ by
release: ``squeue --json --states=all`` everywhere (22.05 ignores the filter; 24.11+ list only live jobs
without it); one job is ``scontrol show job --json <id>`` on 24.11+ (in the epilogs ``job_state[0]`` is
final), the full list filtered here on 22.05.
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
    out."""
    return run(["sbatch", *args], bin_dir=bin_dir, env=env, timeout_s=timeout_s, check=False)


def squeue_all(bin_dir: str = "/usr/bin", env: Optional[Mapping[str, str]] = None,
               timeout_s: float = 30.0) -> List[JobInfo]:
    """``squeue --json --states=all``; caches ``meta``'s release. SlurmError: failed or unparsable."""
    proc = run(["squeue", "--json", "--states=all"], bin_dir=bin_dir, env=env, timeout_s=timeout_s)
    jobs, version = parse_job_json(proc.stdout)
    if version is not None:
        remember(bin_dir, version)
    return jobs


_UNKNOWN_JOB = ("invalid job id", "job does not exist", "unknown job")


def job_info(job_id: int, bin_dir: str = "/usr/bin", env: Optional[Mapping[str, str]] = None,
             timeout_s: float = 30.0) -> Optional[JobInfo]:
    """``job_id`` as slurmctld knows it (module docstring), or None once forgotten (``MinJobAge``).
    SlurmError: Slurm failed, timed out or printed something unparsable."""
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
    """Like ``job_info`` for a job that must exist (SlurmError when slurmctld does not know it)."""
    info = job_info(job_id, bin_dir, env, timeout_s)
    if info is None:
        raise SlurmError(f"slurmctld does not know job {int(job_id)}")
    return info


def write_batch_script(job_id: int, path: str, bin_dir: str = "/usr/bin",
                       env: Optional[Mapping[str, str]] = None, timeout_s: float = 15.0) -> None:
    """``scontrol write batch_script <job_id> <path>`` (relative to scontrol's cwd); SlurmError."""
    run(["scontrol", "write", "batch_script", str(int(job_id)), path], bin_dir=bin_dir, env=env,
        timeout_s=timeout_s)


def sbatch_as_user(script_path: str, uid: int, gid: int, args: Sequence[str], script_args: Sequence[str] = (),
                   bin_dir: str = "/usr/bin", slurm_conf: Optional[str] = None,
                   timeout_s: float = 15.0) -> int:
    """Submit ``script_path`` as ``uid``/``gid`` from root under ``env -i PATH=/usr/bin:/bin
    SLURM_CONF=<conf>`` (nothing of the caller's environment, such as ``SBATCH_*``, reaches the job); return
    the new job id. ``--export=NONE`` in ``args`` makes slurmd load the user's login environment
    (docs/facts.md §6). SlurmError: sbatch refused the job (stderr carried), timed out, or gave no job id."""
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
    """``scontrol update jobid=<job> AdminComment=<text>`` (root/SlurmUser; one argv word, no shell); ``job``:
    an id or ``JobInfo.slurm_ref``. SlurmError: a newline in ``text``, not a job reference, refused or timed
    out."""
    if "\n" in text:
        raise SlurmError("AdminComment must be one line")
    run(["scontrol", "update", f"jobid={_job_ref(job)}", f"AdminComment={text}"], bin_dir=bin_dir, env=env,
        timeout_s=timeout_s)


def set_admin_comment_accounting(job: Union[int, str], text: str, bin_dir: str = "/usr/bin",
                                 env: Optional[Mapping[str, str]] = None, timeout_s: float = 10.0) -> None:
    """``sacctmgr -i update job where jobid=<job> set AdminComment=<text>``: slurmctld refuses ``scontrol
    update`` once a job has finished, so at job end slurmdbd is the only store. SlurmError as
    ``set_admin_comment`` (also: no slurmdbd, not an admin)."""
    if "\n" in text:
        raise SlurmError("AdminComment must be one line")
    run(["sacctmgr", "-i", "update", "job", "where", f"jobid={_job_ref(job)}", "set", f"AdminComment={text}"],
        bin_dir=bin_dir, env=env, timeout_s=timeout_s)


def admin_comment_accounting(job: Union[int, str], bin_dir: str = "/usr/bin",
                             env: Optional[Mapping[str, str]] = None, timeout_s: float = 10.0) -> str:
    """``sacct -n -P -X -o AdminComment -j <job>``'s first line, ``""`` for none; SlurmError: not a job
    reference, or sacct failed (no slurmdbd) or timed out."""
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
    """One best-effort ``scancel <id>...`` (refusal ignored); SlurmError: scancel missing or timed out."""
    if job_ids:
        run(["scancel", *[str(int(j)) for j in job_ids]], bin_dir=bin_dir, env=env, check=False)


def parse_stderr_target(job: JobInfo) -> StderrTarget:
    """From ``squeue --json``, never user text; SlurmError: no path or no uid/gid in the record."""
    path = job.stderr_path or job.stdout_path
    if not path or job.uid is None or job.gid is None:
        raise SlurmError(f"Slurm shows no stderr path or uid/gid for job {job.job_id}")
    return StderrTarget(path, int(job.uid), int(job.gid))


def stderr_target(job_id: int, bin_dir: str = "/usr/bin", env: Optional[Mapping[str, str]] = None,
                  timeout_s: float = 15.0) -> StderrTarget:
    """Where ``job_id`` writes its stderr, and as whom; SlurmError: unknown job, squeue failure, fields
    missing."""
    job = job_info(job_id, bin_dir, env, timeout_s)
    if job is None:
        raise SlurmError(f"Slurm no longer knows job {job_id}")
    return parse_stderr_target(job)
