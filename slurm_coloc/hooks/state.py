"""Deciding how a job ended from what an epilog can see (pure).

In Slurm 22.05.8 every epilog sees ``JobState=COMPLETING``: the final state (COMPLETED, FAILED, CANCELLED,
TIMEOUT) is set only after the epilogs, and ``SLURM_JOB_EXIT_CODE`` is 0 for timeouts and cancels alike
(facts §5, re-checked in tests/data/slurm-22.05/epilog_states.txt). slurmctld's record of the job
(``JobInfo``: exit code and signal, run time, time limit, reason) is enough to tell them apart.
"""
from __future__ import annotations

from typing import Optional

from slurm_coloc.slurm.jobinfo import JobInfo
from slurm_coloc.slurm.parse import FINAL_STATES

_FINAL = FINAL_STATES


def final_state(job: JobInfo) -> str:
    """``infer_final_state`` of a job as slurmctld shows it (state, exit pair, run time, limit, reason)."""
    return infer_final_state(job.state, job.exit_code, job.signal, job.run_s, job.time_limit_s, job.reason)


def infer_final_state(job_state: str, exit_code: Optional[int], signal: Optional[int],
                      run_s: Optional[int], time_limit_s: Optional[int], reason: str = "") -> str:
    """The job's final state.

    Args:
        job_state: the job's state (usually ``COMPLETING`` inside an epilog).
        exit_code, signal: the pair scontrol prints as ``ExitCode=<code>:<signal>``.
        run_s, time_limit_s: run time and time limit in seconds (None if unknown/unlimited).
        reason: the state reason (``TimeLimit`` in EpilogSlurmctld of a timed-out job).

    Returns:
        A Slurm state name; ``COMPLETING`` states are resolved: a signal with the run at its time limit is
        ``TIMEOUT``, a signal before it is ``CANCELLED``, a non-zero exit ``FAILED``, ``Reason=TimeLimit``
        ``TIMEOUT``, else ``COMPLETED`` (also at the limit: without a signal the job ended by itself).
    """
    base = (job_state or "").split()[0].upper() if job_state else ""
    if base in _FINAL:
        return base
    at_limit = reason == "TimeLimit" or (run_s is not None and time_limit_s is not None and run_s >= time_limit_s)
    if signal:
        if at_limit:
            return "TIMEOUT"
        return "CANCELLED" if signal in (15, 2, 1) else "FAILED"
    if exit_code:
        return "FAILED"
    if reason == "TimeLimit":
        return "TIMEOUT"
    # RunTime >= TimeLimit with a clean 0:0 is a job that finished in time: Slurm counts RunTime from the
    # allocation, so a slow Prolog pushes a job that ran to completion up to its limit (Slurm records COMPLETED:
    # docs/reliability.md "Load"). A real time-out shows signal 15 (facts §5).
    return "COMPLETED" if exit_code == 0 else (base or "UNKNOWN")
