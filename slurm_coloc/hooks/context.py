"""What a hook knows about its job and how the job ended, and the hook child's answer to its parent.

``HookContext``: the hook's environment (docs/facts.md §5); pure; user-chosen values (job name, comment) are
opaque text, never executed or parsed. Final state (``final_state``), best first: one a Slurm gives in
``FINAL_STATE_VARS`` (none so far: ``tests/data/slurm-<v>/hook_env/``); slurmctld's record if final (24.11+);
else (22.05: epilogs see ``COMPLETING``, exit 0 for timeouts and cancels: tests/data/slurm-22.05/
epilog_states.txt) inferred from exit pair, run time and reason, settled later (``hooks/ctld.py`` ``settle``).
The answer on hooks/runner.py's pipe: JSON ``{"ok", "detail", "result"}``, at most ``MAX_RESULT_BYTES``."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from slurm_coloc.errors import ColocError
from slurm_coloc.slurm.jobinfo import JobInfo
from slurm_coloc.slurm.parse import FINAL_STATES, decode_exit_code, parse_index_list


def _int(value: Optional[str]) -> Optional[int]:
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        return None


@dataclass(frozen=True)
class HookContext:
    """The job as a Prolog/Epilog/PrologSlurmctld/EpilogSlurmctld/TaskProlog sees it. ``context``:
    ``SLURM_SCRIPT_CONTEXT`` (empty for TaskProlog); ``job_name``: slurmctld hooks only; ``gpus``: global
    indices of ``SLURM_JOB_GPUS`` (node hooks only); ``exit_code``/``signal``: decoded ``SLURM_JOB_EXIT_CODE``
    (epilogs only; a timeout shows 0/0: docs/facts.md §5)."""

    job_id: Optional[int]
    context: str
    uid: Optional[int]
    gid: Optional[int]
    user_name: str
    job_name: str
    partition: str
    node: str
    node_list: str
    gpus: tuple
    comment: str
    restart_count: int
    exit_code: Optional[int]
    signal: Optional[int]
    spank_mem: Optional[str]
    spank_share: Optional[str]

    @property
    def job(self) -> int:
        """``job_id``, for a hook that needs one. Raises ColocError (the environment named no job
        (``SLURM_JOB_ID`` missing or not a number))."""
        if self.job_id is None:
            raise ColocError("no SLURM_JOB_ID in the hook's environment")
        return self.job_id

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "HookContext":
        """Built from a hook's environment (pure); missing variables and a non-integer id: None/empty."""
        raw_ec = _int(env.get("SLURM_JOB_EXIT_CODE"))
        code, sig = decode_exit_code(raw_ec) if raw_ec is not None else (None, None)
        return cls(
            job_id=_int(env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")),
            context=env.get("SLURM_SCRIPT_CONTEXT", ""),
            uid=_int(env.get("SLURM_JOB_UID") or env.get("SLURM_UID")),
            gid=_int(env.get("SLURM_JOB_GID")),
            user_name=env.get("SLURM_JOB_USER", "") or env.get("USER", ""),
            job_name=env.get("SLURM_JOB_NAME", ""),
            partition=env.get("SLURM_JOB_PARTITION", ""),
            node=env.get("SLURMD_NODENAME", ""),
            node_list=env.get("SLURM_JOB_NODELIST", "") or env.get("SLURM_NODELIST", ""),
            gpus=tuple(parse_index_list(env.get("SLURM_JOB_GPUS", ""))),
            comment=env.get("SLURM_JOB_COMMENT", ""),
            restart_count=_int(env.get("SLURM_JOB_RESTART_COUNT")) or 0,
            exit_code=code,
            signal=sig,
            spank_mem=env.get("SPANK_COLOC_MEM"),
            spank_share=env.get("SPANK_COLOC_SHARE"),
        )


_FINAL = FINAL_STATES
# Environment variables through which a Slurm version gives its epilogs the job's final state. 22.05, 24.11
# and 26.05 set none (SLURM_JOB_STATE is for MailProg/triggers only: tests/data/slurm-<v>/epilog_states.txt);
# add a name here once a recording shows it.
FINAL_STATE_VARS: Tuple[str, ...] = ()
SLURM = "slurm"  # the state is Slurm's own final answer
INFERRED = "inferred"  # inferred inside the epilog; a later look-up may replace it


def is_final(state: str) -> bool:
    """Whether a state name (any case, suffix allowed: ``CANCELLED by 1000``) is final; pure."""
    return bool(state) and state.split()[0].upper() in _FINAL


def state_from_env(env: Mapping[str, str]) -> Optional[str]:
    """The upper-case final state the environment gives (``FINAL_STATE_VARS``); None on 22.05. Pure."""
    for name in FINAL_STATE_VARS:
        value = (env.get(name) or "").strip()
        if is_final(value):
            return value.split()[0].upper()
    return None


def final_state(job: JobInfo, env: Optional[Mapping[str, str]] = None) -> Tuple[str, str]:
    """``(state, source)``: the final state and ``SLURM`` or ``INFERRED`` (pure, never raises): the
    environment's, else the record's if final, else ``infer_final_state`` of the record (22.05). ``env`` None:
    the record alone."""
    given = state_from_env(env or {})
    if given:
        return given, SLURM
    if job.final:
        return job.state, SLURM
    return infer_final_state(job.state, job.exit_code, job.signal, job.run_s, job.time_limit_s,
                             job.reason), INFERRED


def infer_final_state(job_state: str, exit_code: Optional[int], signal: Optional[int],
                      run_s: Optional[int], time_limit_s: Optional[int], reason: str = "") -> str:
    """The job's final state, ``COMPLETING`` resolved. ``exit_code``/``signal``: ``ExitCode=<code>:<signal>``;
    ``run_s``/``time_limit_s`` in s (None: unknown or unlimited). ``Reason=TimeLimit`` is ``TIMEOUT`` whatever
    the exit; a signal (or a shell's ``128 + signal`` exit of SIGHUP, SIGINT, SIGTERM: ``shell_signal``) with
    the run at its limit is ``TIMEOUT``, SIGHUP/SIGINT/SIGTERM before it ``CANCELLED``, another signal or a
    non-zero exit ``FAILED``, else ``COMPLETED`` (also at the limit: without a signal the job ended by
    itself)."""
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
    """The signal of a batch shell's exit code: 1, 2, 15 for 129, 130, 143 (bash exits ``128 + N`` when its
    last command was killed by signal N, bash(1) "EXIT STATUS"; only what a cancel or time-out sends); else
    None."""
    return exit_code - 128 if exit_code in (129, 130, 143) else None


MAX_RESULT_BYTES = 1 << 20  # the child's whole answer on the pipe
# a run's detail as recorded (hook_runs.detail_json, events): small enough that the run's record set always
# fits one queue entry (store/queue.py MAX_ENTRY_BYTES, 256 KiB; the detail appears once per op)
MAX_DETAIL_BYTES = 64 * 1024
MAX_ITEM_BYTES = 1024  # a detail item kept whole when a detail is cut


def _cut_detail(detail: Dict[str, Any], size: int) -> Dict[str, Any]:
    """``detail`` (``size`` bytes as JSON) cut to fit ``MAX_DETAIL_BYTES``: items up to ``MAX_ITEM_BYTES``
    kept, longer strings cut to half that plus ``" ... [cut]"``, others dropped, named in ``"truncated"``;
    only the marker when still too large."""
    kept: Dict[str, Any] = {}
    cut: List[str] = []
    for key, value in detail.items():
        if len(json.dumps(value, default=str)) <= MAX_ITEM_BYTES:
            kept[str(key)] = value
            continue
        if isinstance(value, str):
            kept[str(key)] = value[:MAX_ITEM_BYTES // 2] + " ... [cut]"
        cut.append(str(key)[:MAX_ITEM_BYTES])
    marker = {"bytes": size, "limit": MAX_DETAIL_BYTES, "cut": cut}
    out = {**kept, "truncated": marker}
    if len(json.dumps(out, default=str)) > MAX_DETAIL_BYTES:
        out = {"truncated": {**marker, "cut": "all"}}
    return out


def encode_result(payload: Dict[str, Any]) -> bytes:
    """The child's answer as UTF-8 JSON, at most ``MAX_RESULT_BYTES``; never raises. A ``detail`` over
    ``MAX_DETAIL_BYTES`` is cut (``_cut_detail``); an answer still too large (TaskProlog lines) becomes a
    failure naming its size, its lines dropped. Values JSON cannot encode are written as ``str``."""
    detail = payload.get("detail") or {}
    size = len(json.dumps(detail, default=str))
    if size > MAX_DETAIL_BYTES:
        payload = {**payload, "detail": _cut_detail(detail, size)}
    data = json.dumps(payload, default=str).encode()
    if len(data) > MAX_RESULT_BYTES:
        data = json.dumps({"ok": False, "detail": {"error": f"the hook's answer of {len(data)} bytes is over "
                                                            f"{MAX_RESULT_BYTES}: its result was dropped"},
                           "result": None}).encode()
    return data


def decode_answer(chunks: List[bytes]) -> tuple:
    """``(ok, detail, result)`` of the pipe's bytes; missing or broken: ``(False, {"error": ...}, None)``."""
    try:
        payload = json.loads(b"".join(chunks).decode())
        return bool(payload["ok"]), dict(payload.get("detail") or {}), payload.get("result")
    except (ValueError, KeyError, TypeError, AttributeError):
        return False, {"error": "the hook's child ended without a result (crashed?)"}, None
