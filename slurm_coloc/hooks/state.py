"""Deciding how a job ended from what an epilog can see (pure).

Sources, best first (``final_state``): a final state a Slurm hands the epilog in its environment
(``FINAL_STATE_VARS``; none of 22.05, 24.11, 26.05 does: ``tests/data/slurm-<v>/hook_env/``); a final state in
slurmctld's record (``JobInfo.state``): on 24.11+ the epilogs' JSON query (``scontrol show job --json``,
``squeue --json``) gives it as ``job_state[0]`` with ``COMPLETING`` as a flag (``["TIMEOUT", "COMPLETING"]``,
``tests/data/slurm-24.11/epilog_states.txt``), so the epilogs record Slurm's state directly; else (22.05: the
record says ``COMPLETING``) an inference from the exit pair, run time and reason, recorded as ``inferred`` and
replaced by Slurm's own final state when a later controller hook finds the job ended (``hooks/ctld.py``
``settle``). The inference cannot tell a cancelled job from one that ended by itself: a cancelled batch script
that traps SIGTERM exits 0 or 1, and a job cancelled during its Prolog shows ``0:0`` (22.05.8, checked on the
local cluster).

In Slurm 22.05.8 every epilog sees ``JobState=COMPLETING``: the final state (COMPLETED, FAILED, CANCELLED,
TIMEOUT) is set only after the epilogs, and ``SLURM_JOB_EXIT_CODE`` is 0 for timeouts and cancels alike
(docs/facts.md §5, re-checked in tests/data/slurm-22.05/epilog_states.txt). slurmctld's record of the job
(``JobInfo``: exit code and signal, run time, time limit, reason) is enough to tell them apart.
"""
from __future__ import annotations

from typing import Mapping, Optional, Tuple

from slurm_coloc.slurm.jobinfo import JobInfo
from slurm_coloc.slurm.parse import FINAL_STATES

_FINAL = FINAL_STATES
# Environment variables through which a Slurm version gives its epilogs the job's final state. 22.05, 24.11
# and 26.05 set none (SLURM_JOB_STATE is for MailProg/triggers only: tests/data/slurm-<v>/epilog_states.txt);
# add a name here once a recording shows it.
FINAL_STATE_VARS: Tuple[str, ...] = ()
SLURM = "slurm"  # the state is Slurm's own final answer
INFERRED = "inferred"  # inferred inside the epilog; a later look-up may replace it


def is_final(state: str) -> bool:
    """Whether a state name from the environment (any case, suffix allowed: ``CANCELLED by 1000``) is final.

    ``JobInfo.final`` is the same test on Slurm's record. Pure, never raises.
    """
    return bool(state) and state.split()[0].upper() in _FINAL


def state_from_env(env: Mapping[str, str]) -> Optional[str]:
    """The upper-case final state (first word) the environment gives (``FINAL_STATE_VARS``); None on 22.05.

    Pure, never raises.
    """
    for name in FINAL_STATE_VARS:
        value = (env.get(name) or "").strip()
        if is_final(value):
            return value.split()[0].upper()
    return None


def final_state(job: JobInfo, env: Optional[Mapping[str, str]] = None) -> Tuple[str, str]:
    """``(state, source)``: the job's final state and ``SLURM`` or ``INFERRED`` (pure, never raises).

    The hook environment's, else slurmctld's record if final (24.11+ inside the epilogs: module docstring),
    else ``infer_final_state`` of the record (exit pair, run time, limit, reason; 22.05). ``env`` None: the
    record alone decides.
    """
    given = state_from_env(env or {})
    if given:
        return given, SLURM
    if job.final:
        return job.state, SLURM
    return infer_final_state(job.state, job.exit_code, job.signal, job.run_s, job.time_limit_s,
                             job.reason), INFERRED


def infer_final_state(job_state: str, exit_code: Optional[int], signal: Optional[int],
                      run_s: Optional[int], time_limit_s: Optional[int], reason: str = "") -> str:
    """The job's final state, ``COMPLETING`` resolved.

    ``exit_code``/``signal``: ``ExitCode=<code>:<signal>``; ``run_s``/``time_limit_s`` in s (None: unknown or
    unlimited). ``Reason=TimeLimit`` is ``TIMEOUT`` whatever the exit; a signal (or a shell's ``128 + signal``
    exit of SIGHUP, SIGINT, SIGTERM: ``shell_signal``) with the run at its limit is ``TIMEOUT``,
    SIGHUP/SIGINT/SIGTERM before it ``CANCELLED``, another signal or a non-zero exit ``FAILED``, else
    ``COMPLETED`` (also at the limit: without a signal the job ended by itself).
    """
    base = (job_state or "").split()[0].upper() if job_state else ""
    if base in _FINAL:
        return base
    if reason == "TimeLimit":  # only slurmctld's time-limit kill sets it; Slurm records TIMEOUT, any exit
        return "TIMEOUT"
    at_limit = run_s is not None and time_limit_s is not None and run_s >= time_limit_s
    signal = signal or shell_signal(exit_code)
    if signal:
        if at_limit:
            return "TIMEOUT"
        return "CANCELLED" if signal in (15, 2, 1) else "FAILED"
    if exit_code:
        return "FAILED"
    # RunTime >= TimeLimit with a clean 0:0 is a job that finished in time: Slurm counts RunTime from the
    # allocation, so a slow Prolog pushes a job that ran to completion up to its limit (Slurm records
    # COMPLETED: docs/reliability.md "Load"). A real time-out shows signal 15 (docs/facts.md §5).
    return "COMPLETED" if exit_code == 0 else (base or "UNKNOWN")


def shell_signal(exit_code: Optional[int]) -> Optional[int]:
    """The signal a batch shell reports in its exit code: 1, 2, 15 for 129, 130, 143; else None.

    Pure, never raises.

    bash exits ``128 + N`` when its last command was killed by signal N (bash(1), "EXIT STATUS"), as when a
    time-out or ``scancel`` reaches the shell's child first (``ExitCode=143:0`` rather than ``0:15``). Only
    the signals a cancel or time-out sends count.
    """
    return exit_code - 128 if exit_code in (129, 130, 143) else None
