"""One Slurm job as a frozen, typed ``JobInfo``, built from ``squeue --json`` (openapi v0.0.38 in 22.05).

Why JSON: ``scontrol show job -o`` prints ``Key=value`` pairs with user text unquoted (``JobName`` is its second
field; ``WorkDir``, ``Command``, ``Comment``, ``StdOut``, ``MailUser`` follow), so a job named
``x TresPerNode=gres:shard:79`` or holding a newline reads as other fields. In JSON every user-editable string
is one opaque value and cannot stand for another field. 22.05 has no ``scontrol show job --json``
(``tests/data/slurm-22.05/scontrol_show_job_json.txt``) and ``squeue --json`` ignores filters (facts §7), so the
caller picks its job from the full list.

``squeue --json`` gives the output paths unexpanded (``%j``); ``expand_std_path`` applies 22.05's own
substitution (``src/api/job_info.c`` ``_fname_format``: ``%A %a %j %u`` then ``%x``; no ``%%``, no widths), so
``stdout_path`` equals scontrol's ``StdOut`` (checked against scontrol on the real cluster).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from slurm_coloc.errors import SlurmError
from slurm_coloc.slurm.parse import decode_exit_code, expand_hostlist, parse_tres_per_node

NO_VAL = 0xFFFFFFFE  # Slurm's "not set" for 32-bit fields (an array task id outside an array prints as this)
_BIG = 0xFFFFFFF0  # 32-bit values at or above this are Slurm's NO_VAL/INFINITE markers


@dataclass(frozen=True)
class JobInfo:
    """A job as slurmctld knows it. Times are Unix seconds, durations seconds; None = not set/unknown.

    Attributes:
        job_id: this job's own id (an array task has its own, distinct from ``array_job_id``).
        array_job_id / array_task_id: set for an array task (None otherwise, and for the pending array record).
        name, comment, work_dir, command, account: user-editable text, kept as opaque strings.
        uid / gid: numeric ids of the submitting user and group.
        state: ``job_state`` (``COMPLETING`` inside epilogs); reason: ``state_reason`` (``None`` when none).
        exit_code / signal: the pair scontrol prints as ``ExitCode=<code>:<signal>``.
        run_s: elapsed run time as scontrol computes ``RunTime``; time_limit_s: None when unlimited/partition's.
        gres: counts per GRES name from ``tres_per_node`` (``{"shard": 2}``); node_names: expanded ``nodes``.
        stdout_path / stderr_path / stdin_path: expanded as scontrol's ``StdOut``/``StdErr``/``StdIn``.
        cpus_per_task: ``--cpus-per-task`` (22.05's JSON prints null even when given: ``min_cpus_per_node``,
            scontrol's ``MinCPUsNode``, keeps the CPUs per node it implies).
        mem_per_node_mib: ``--mem`` in MiB (None when not given or given per CPU).
    """

    job_id: int
    array_job_id: Optional[int]
    array_task_id: Optional[int]
    name: str
    user_name: str
    uid: Optional[int]
    gid: Optional[int]
    state: str
    reason: str
    exit_code: Optional[int]
    signal: Optional[int]
    submit_ts: Optional[float]
    start_ts: Optional[float]
    end_ts: Optional[float]
    run_s: Optional[int]
    time_limit_s: Optional[int]
    tres_per_node: str
    gres: Dict[str, int]
    gres_detail: Tuple[str, ...]
    nodes: str
    node_names: Tuple[str, ...]
    batch_host: str
    partition: str
    account: str
    work_dir: str
    stdout_path: str
    stderr_path: str
    stdin_path: str
    comment: str
    admin_comment: str
    command: str
    restart_count: int
    num_nodes: Optional[int]
    num_tasks: Optional[int]
    cpus_per_task: Optional[int]
    min_cpus_per_node: Optional[int]
    mem_per_node_mib: Optional[int]
    raw: Dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def shards(self) -> Optional[int]:
        """Shards per node the job asked for (``--gres=shard:N``), None without shard GRES."""
        return self.gres.get("shard")

    @property
    def slurm_ref(self) -> str:
        """How Slurm commands name this one job: ``<array_job_id>_<array_task_id>`` for an array task (a bare
        ``scontrol update jobid=<array_job_id>`` addresses every task of the array), else ``<job_id>``."""
        if self.array_job_id and self.array_task_id is not None:
            return f"{self.array_job_id}_{self.array_task_id}"
        return str(self.job_id)


def expand_std_path(pattern: str, job_id: int, array_job_id: Optional[int], array_task_id: Optional[int],
                    user_name: str, job_name: str, work_dir: str) -> str:
    """An output path pattern as Slurm 22.05 expands it for ``scontrol show job`` (module docstring).

    ``%A`` array job id (the job id outside an array), ``%a`` array task id (4294967294 outside an array),
    ``%j`` job id, ``%u`` user name, then ``%x`` job name; a relative result is joined to ``work_dir``.
    ``"out-%j.txt"`` with job 7 in ``/w`` -> ``/w/out-7.txt``. The result is text for display and for an
    as-user open; nothing in it is interpreted.
    """
    text = pattern.replace("%A", str(array_job_id if array_task_id is not None and array_job_id else job_id))
    text = text.replace("%a", str(array_task_id if array_task_id is not None else NO_VAL))
    text = text.replace("%j", str(job_id)).replace("%u", user_name).replace("%x", job_name)
    return text if text.startswith("/") else f"{work_dir}/{text}"


def _std_paths(j: Mapping[str, Any], job_id: int, array_job_id: Optional[int], array_task_id: Optional[int],
               user_name: str, name: str, work_dir: str) -> Tuple[str, str, str]:
    """(stdout, stderr, stdin) as 22.05's ``slurm_get_job_stdout/stderr/stdin`` give them."""
    def fmt(p: str) -> str:
        return expand_std_path(p, job_id, array_job_id, array_task_id, user_name, name, work_dir)

    out_p, err_p, in_p = (_s(j, k) for k in ("standard_output", "standard_error", "standard_input"))
    if not j.get("batch_flag", True):
        return (fmt(out_p) if out_p else "", fmt(err_p) if err_p else "", fmt(in_p) if in_p else "")
    if out_p:
        stdout = fmt(out_p)
    elif array_job_id:
        stdout = f"{work_dir}/slurm-{array_job_id}_{array_task_id if array_task_id is not None else NO_VAL}.out"
    else:
        stdout = f"{work_dir}/slurm-{job_id}.out"
    return stdout, fmt(err_p) if err_p else stdout, fmt(in_p) if in_p else "/dev/null"


def _s(j: Mapping[str, Any], key: str) -> str:
    v = j.get(key)
    return "" if v is None else str(v)


def _n(j: Mapping[str, Any], key: str) -> Optional[int]:
    """An integer field; None when absent, not a number, or one of Slurm's NO_VAL/INFINITE markers."""
    v = j.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return int(v) if 0 <= v < _BIG else None


def _ts(j: Mapping[str, Any], key: str) -> Optional[float]:
    v = _n(j, key)
    return float(v) if v else None


def _run_s(j: Mapping[str, Any], state: str, now: float) -> Optional[int]:
    """scontrol's ``RunTime`` (22.05 ``slurm_sprint_job_info``): 0 while pending, ``pre_sus_time`` while
    suspended, else end (now while running) minus start, counting suspensions."""
    start, end = _n(j, "start_time") or 0, _n(j, "end_time") or 0
    pre_sus, suspend = _n(j, "pre_sus_time") or 0, _n(j, "suspend_time") or 0
    if state == "PENDING":
        return 0
    if state == "SUSPENDED":
        return pre_sus
    if not start:
        return None
    stop = now if state in ("RUNNING", "CONFIGURING") or not end else end
    return int(stop - suspend + pre_sus) if suspend else int(stop - start)


def job_info_from_json(j: Mapping[str, Any], now: Optional[float] = None) -> JobInfo:
    """One ``jobs[]`` entry of ``squeue --json`` -> ``JobInfo``; ``now`` (default: the clock) for ``run_s``.

    Raises:
        SlurmError: the entry has no integer ``job_id``.
    """
    job_id = _n(j, "job_id")
    if job_id is None:
        raise SlurmError(f"squeue --json entry without a job_id: {str(dict(j))[:120]}")
    array_job_id = _n(j, "array_job_id") or None
    array_task_id = _n(j, "array_task_id") if array_job_id else None
    state = _s(j, "job_state")
    status = _n(j, "exit_code")
    code, sig = decode_exit_code(status) if status is not None else (None, None)
    limit_min = _n(j, "time_limit")
    tres = _s(j, "tres_per_node")
    nodes = _s(j, "nodes")
    try:
        node_names = tuple(expand_hostlist(nodes))
    except SlurmError:
        node_names = ()
    name, user_name, work_dir = _s(j, "name"), _s(j, "user_name"), _s(j, "current_working_directory")
    stdout, stderr, stdin = _std_paths(j, job_id, array_job_id, array_task_id, user_name, name, work_dir)
    return JobInfo(
        job_id=job_id, array_job_id=array_job_id, array_task_id=array_task_id, name=name, user_name=user_name,
        uid=_n(j, "user_id"), gid=_n(j, "group_id"), state=state, reason=_s(j, "state_reason"),
        exit_code=code, signal=sig, submit_ts=_ts(j, "submit_time"), start_ts=_ts(j, "start_time"),
        end_ts=_ts(j, "end_time"), run_s=_run_s(j, state, time.time() if now is None else now),
        time_limit_s=limit_min * 60 if limit_min is not None else None, tres_per_node=tres,
        gres=parse_tres_per_node(tres), gres_detail=tuple(str(x) for x in (j.get("gres_detail") or [])),
        nodes=nodes, node_names=node_names, batch_host=_s(j, "batch_host"), partition=_s(j, "partition"),
        account=_s(j, "account"), work_dir=work_dir, stdout_path=stdout, stderr_path=stderr, stdin_path=stdin,
        comment=_s(j, "comment"), admin_comment=_s(j, "admin_comment"), command=_s(j, "command"),
        restart_count=_n(j, "restart_cnt") or 0, num_nodes=_n(j, "node_count"), num_tasks=_n(j, "tasks"),
        cpus_per_task=_n(j, "cpus_per_task"), min_cpus_per_node=_n(j, "minimum_cpus_per_node"),
        mem_per_node_mib=_n(j, "memory_per_node") or None, raw=dict(j),
    )


def parse_squeue_json(text: str, now: Optional[float] = None) -> List[JobInfo]:
    """Every job in ``squeue --json`` output (22.05 ignores squeue's filters: facts §7).

    Raises:
        SlurmError: not JSON or no ``jobs`` list.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SlurmError(f"squeue --json printed invalid JSON: {exc}") from None
    jobs = data.get("jobs") if isinstance(data, dict) else None
    if not isinstance(jobs, list):
        raise SlurmError("squeue --json output has no 'jobs' list")
    return [job_info_from_json(j, now) for j in jobs if isinstance(j, dict) and _n(j, "job_id") is not None]
