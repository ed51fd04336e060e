"""Stopping jobs: ``scancel`` from a root daemon (the node sampler's watchdog) and where its stderr goes, and
coloc-replay's clean-up."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from slurm_coloc.errors import SlurmError
from slurm_coloc.slurm.jobinfo import JobInfo
from slurm_coloc.slurm.jobs import job_info
from slurm_coloc.slurm.run import run


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

    Raises:
        SlurmError: scancel missing or timed out.
    """
    if job_ids:
        run(["scancel", *[str(int(j)) for j in job_ids]], bin_dir=bin_dir, env=env, check=False)


def parse_stderr_target(job: JobInfo) -> StderrTarget:
    """A job's stderr path (stdout's when Slurm shows none) and uid/gid, from ``squeue --json``, never user
    text.

    Raises:
        SlurmError: no path or no uid/gid in the record.
    """
    path = job.stderr_path or job.stdout_path
    if not path or job.uid is None or job.gid is None:
        raise SlurmError(f"Slurm shows no stderr path or uid/gid for job {job.job_id}")
    return StderrTarget(path, int(job.uid), int(job.gid))


def stderr_target(job_id: int, bin_dir: str = "/usr/bin", env: Optional[Mapping[str, str]] = None,
                  timeout_s: float = 15.0) -> StderrTarget:
    """Where ``job_id`` writes its stderr, and as whom (``jobs.job_info``).

    Raises:
        SlurmError: unknown job, squeue failure, or fields missing.
    """
    job = job_info(job_id, bin_dir, env, timeout_s)
    if job is None:
        raise SlurmError(f"Slurm no longer knows job {job_id}")
    return parse_stderr_target(job)
