"""One Slurm job as a frozen, typed ``JobInfo`` built from ``squeue --json`` / ``scontrol show job --json``,
and what in that record confines the job (``Confinement``), as sbatch options for its OOM rerun.

Why JSON: ``scontrol show job -o`` prints user text unquoted, so a job named ``x TresPerNode=gres:shard:79``
or holding a newline reads as other fields; in JSON every user string is one opaque value. 22.05's
``squeue --json`` ignores filters (docs/facts.md §7), so the caller picks its job from the full list. Both
schemas are read through ``slurm/parse.py``. Output paths: 22.05 and 26.05 give them unexpanded (``%j``),
24.11 expanded; 26.05's ``std*_expanded`` are used when present, else ``expand_std_path`` applies 22.05's
own substitution (``src/api/job_info.c`` ``_fname_format``), so ``stdout_path`` equals scontrol's ``StdOut``
on every version (checked against the recordings).

Confinement: every part of the request that limits where, under which rules and with what else the job may
run (reservation, nodes, QOS, account, WCKey, features, licenses, non-shard GRES, container, SELinux context,
MCS label, network, ``--contiguous``/``--exclusive``). The OOM rerun (``hooks/rerun.py``) carries each of
these or is not submitted; ``uncarried`` names what cannot be carried (GRES per job/task/socket, CPUs or
memory per GRES, a burst buffer, other het-job components).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from slurm_coloc.errors import SlurmError
from slurm_coloc.slurm.parse import (
    FINAL_STATES,
    exit_pair,
    expand_hostlist,
    integer,
    job_state,
    parse_tres_per_node,
    script_args_in_submit_line,
    text,
)
from slurm_coloc.slurm.run import SlurmVersion, version_from_meta

NO_VAL = 0xFFFFFFFE  # Slurm's "not set" for 32-bit fields (an array task id outside an array prints as this)


@dataclass(frozen=True)
class JobInfo:
    """A job as slurmctld knows it. Times are Unix seconds, durations seconds; None = not set/unknown.
    ``job_id`` is the job's own id (an array task's differs from ``array_job_id``); ``name``, ``comment``,
    ``work_dir``, ``command``, ``account`` are user text, kept opaque. ``state`` is the base ``job_state``: in
    the epilogs 22.05 says ``COMPLETING``, 24.11+ the final state with ``COMPLETING`` in ``state_flags``.
    ``exit_code``/``signal``: scontrol's ``ExitCode``; ``run_s``: its ``RunTime``; ``time_limit_s`` None:
    unlimited or the partition's. ``gres``: counts per name from ``tres_per_node``. ``cpus_per_task``: 22.05
    prints null even when given (``min_cpus_per_node`` keeps what it implies). ``mem_per_node_mib``/
    ``mem_per_cpu_mib``: ``--mem``/``--mem-per-cpu``. ``slurm_release``: ``meta``'s (``"24.11.5"``), or
    ``""``."""

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
    state_flags: Tuple[str, ...] = ()
    slurm_release: str = ""
    mem_per_cpu_mib: Optional[int] = None
    raw: Dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def shards(self) -> Optional[int]:
        """Shards per node the job asked for (``--gres=shard:N``), None without shard GRES."""
        return self.gres.get("shard")

    @property
    def final(self) -> bool:
        """Whether ``state`` is final (``parse.FINAL_STATES``; ``COMPLETING`` is not)."""
        return self.state in FINAL_STATES

    @property
    def completing(self) -> bool:
        """Whether the job is ending (epilogs running): 22.05's ``COMPLETING`` state or 24.11+'s flag."""
        return self.state == "COMPLETING" or "COMPLETING" in self.state_flags

    def recorded_script_args(self) -> Tuple[Optional[List[str]], bool]:
        """The batch script's arguments as Slurm recorded them, and whether the words are exact. 22.05/23.x:
        ``command``'s words after the first; 26.05: ``submit_line``; 24.11 keeps only the script: ``(None,
        False)`` (docs/slurm-versions.md); ``--wrap``: ``([], True)``. Inexact where an argument holds
        whitespace."""
        words = self.command.split()
        if not words:
            return [], True
        line = self.raw.get("submit_line")
        if isinstance(line, str) and line:
            rest, exact = script_args_in_submit_line(line, self.command, self.work_dir)
            return (rest.split(), exact) if rest is not None else (None, False)
        if len(words) == 1 and self.slurm_release and not self.slurm_release.startswith(("22.", "23.")):
            return None, False  # 24.11: the script alone
        return words[1:], "  " not in self.command.strip()

    @property
    def slurm_ref(self) -> str:
        """How Slurm commands name this one job: ``<array_job_id>_<array_task_id>`` for an array task (a bare
        array id addresses every task), else ``<job_id>``."""
        if self.array_job_id and self.array_task_id is not None:
            return f"{self.array_job_id}_{self.array_task_id}"
        return str(self.job_id)


def expand_std_path(pattern: str, job_id: int, array_job_id: Optional[int], array_task_id: Optional[int],
                    user_name: str, job_name: str, work_dir: str) -> str:
    """An output path pattern as Slurm 22.05 expands it (module docstring): ``%A`` array job id (else the job
    id), ``%a`` array task id (4294967294 outside an array), ``%j``, ``%u``, then ``%x``; relative: joined to
    ``work_dir``. Text for display and an as-user open; nothing in it is interpreted."""
    text = pattern.replace("%A", str(array_job_id if array_task_id is not None and array_job_id else job_id))
    text = text.replace("%a", str(array_task_id if array_task_id is not None else NO_VAL))
    text = text.replace("%j", str(job_id)).replace("%u", user_name).replace("%x", job_name)
    return text if text.startswith("/") else f"{work_dir}/{text}"


def _std_paths(j: Mapping[str, object], job_id: int, array_job_id: Optional[int],
               array_task_id: Optional[int], user_name: str, name: str,
               work_dir: str) -> Tuple[str, str, str]:
    """(stdout, stderr, stdin) as 22.05's ``slurm_get_job_stdout/stderr/stdin`` give them."""
    def fmt(p: str) -> str:
        return expand_std_path(p, job_id, array_job_id, array_task_id, user_name, name, work_dir)

    out_p, err_p, in_p = (text(j, k) for k in ("standard_output", "standard_error", "standard_input"))
    if not j.get("batch_flag", True):
        return (fmt(out_p) if out_p else "", fmt(err_p) if err_p else "", fmt(in_p) if in_p else "")
    if out_p:
        stdout = fmt(out_p)
    elif array_job_id:
        task = array_task_id if array_task_id is not None else NO_VAL
        stdout = f"{work_dir}/slurm-{array_job_id}_{task}.out"
    else:
        stdout = f"{work_dir}/slurm-{job_id}.out"
    return stdout, fmt(err_p) if err_p else stdout, fmt(in_p) if in_p else "/dev/null"


def _paths(j: Mapping[str, object], job_id: int, array_job_id: Optional[int], array_task_id: Optional[int],
           user_name: str, name: str, work_dir: str) -> Tuple[str, str, str]:
    """(stdout, stderr, stdin): 26.05's ``*_expanded`` fields when all present, else ``_std_paths``."""
    given = tuple(j.get(k) for k in ("stdout_expanded", "stderr_expanded", "stdin_expanded"))
    if all(isinstance(v, str) and v for v in given):
        return given  # type: ignore[return-value]
    return _std_paths(j, job_id, array_job_id, array_task_id, user_name, name, work_dir)


def _ts(j: Mapping[str, object], key: str) -> Optional[float]:
    v = integer(j, key)
    return float(v) if v else None


def _run_s(j: Mapping[str, object], state: str, now: float) -> Optional[int]:
    """scontrol's ``RunTime`` (22.05 ``slurm_sprint_job_info``): 0 while pending, ``pre_sus_time`` while
    suspended, else end (now while running) minus start, counting suspensions."""
    start, end = integer(j, "start_time") or 0, integer(j, "end_time") or 0
    pre_sus, suspend = integer(j, "pre_sus_time") or 0, integer(j, "suspend_time") or 0
    if state == "PENDING":
        return 0
    if state == "SUSPENDED":
        return pre_sus
    if not start:
        return None
    stop = now if state in ("RUNNING", "CONFIGURING") or not end else end
    return int(stop - suspend + pre_sus) if suspend else int(stop - start)


def job_info_from_json(j: Mapping[str, Any], now: Optional[float] = None, release: str = "") -> JobInfo:
    """One ``jobs[]`` entry (any schema: module docstring) -> ``JobInfo``; ``now`` (Unix s, None: the clock)
    ends a running job's ``run_s``. An unreadable ``nodes`` list gives empty ``node_names``. SlurmError: no
    integer ``job_id``."""
    job_id = integer(j, "job_id")
    if job_id is None:
        raise SlurmError(f"squeue --json entry without a job_id: {str(dict(j))[:120]}")
    array_job_id = integer(j, "array_job_id") or None
    array_task_id = integer(j, "array_task_id") if array_job_id else None
    state, flags = job_state(j.get("job_state"))
    code, sig = exit_pair(j.get("exit_code"))
    limit_min = integer(j, "time_limit")
    tres = text(j, "tres_per_node")
    nodes = text(j, "nodes")
    try:
        node_names = tuple(expand_hostlist(nodes))
    except SlurmError:
        node_names = ()
    name, user_name, work_dir = text(j, "name"), text(j, "user_name"), text(j, "current_working_directory")
    stdout, stderr, stdin = _paths(j, job_id, array_job_id, array_task_id, user_name, name, work_dir)
    return JobInfo(
        job_id=job_id, array_job_id=array_job_id, array_task_id=array_task_id, name=name, user_name=user_name,
        uid=integer(j, "user_id"), gid=integer(j, "group_id"), state=state, reason=text(j, "state_reason"),
        exit_code=code, signal=sig, submit_ts=_ts(j, "submit_time"), start_ts=_ts(j, "start_time"),
        end_ts=_ts(j, "end_time"), run_s=_run_s(j, state, time.time() if now is None else now),
        time_limit_s=limit_min * 60 if limit_min is not None else None, tres_per_node=tres,
        gres=parse_tres_per_node(tres), gres_detail=tuple(str(x) for x in (j.get("gres_detail") or [])),
        nodes=nodes, node_names=node_names, batch_host=text(j, "batch_host"), partition=text(j, "partition"),
        account=text(j, "account"), work_dir=work_dir, stdout_path=stdout, stderr_path=stderr,
        stdin_path=stdin,
        comment=text(j, "comment"), admin_comment=text(j, "admin_comment"), command=text(j, "command"),
        restart_count=integer(j, "restart_cnt") or 0, num_nodes=integer(j, "node_count"),
        num_tasks=integer(j, "tasks"), cpus_per_task=integer(j, "cpus_per_task"),
        min_cpus_per_node=integer(j, "minimum_cpus_per_node"),
        mem_per_node_mib=integer(j, "memory_per_node") or None, state_flags=flags, slurm_release=release,
        mem_per_cpu_mib=integer(j, "memory_per_cpu") or None, raw=dict(j),
    )


def parse_job_json(text_: str, now: Optional[float] = None) -> Tuple[List[JobInfo], Optional[SlurmVersion]]:
    """``(jobs in output order, meta's release or None)`` of ``squeue --json`` / ``scontrol show job --json``
    output; entries without an integer ``job_id`` are skipped. SlurmError: not JSON or no ``jobs`` list."""
    try:
        data = json.loads(text_)
    except json.JSONDecodeError as exc:
        raise SlurmError(f"squeue --json printed invalid JSON: {exc}") from None
    jobs = data.get("jobs") if isinstance(data, dict) else None
    if not isinstance(jobs, list):
        raise SlurmError("squeue --json output has no 'jobs' list")
    version = version_from_meta(data.get("meta"))
    release = version.release if version else ""
    out = [job_info_from_json(j, now, release) for j in jobs
           if isinstance(j, dict) and integer(j, "job_id") is not None]
    return out, version


def parse_squeue_json(text_: str, now: Optional[float] = None) -> List[JobInfo]:
    """Every job of ``squeue --json`` output (22.05 ignores its filters); SlurmError as ``parse_job_json``."""
    return parse_job_json(text_, now)[0]


#: (JSON field, sbatch option): text fields carried verbatim as ``<option>=<value>``, one argv word each.
TEXT_OPTIONS: Tuple[Tuple[str, str], ...] = (
    ("resv_name", "--reservation"), ("excluded_nodes", "--exclude"), ("required_nodes", "--nodelist"),
    ("qos", "--qos"), ("features", "--constraint"), ("prefer", "--prefer"), ("batch_features", "--batch"),
    ("cluster_features", "--cluster-constraint"), ("licenses", "--licenses"), ("wckey", "--wckey"),
    ("mcs_label", "--mcs-label"), ("container", "--container"), ("selinux_context", "--context"),
    ("network", "--network"),
)
#: GRES per job/task/socket and CPUs/memory per GRES: the rerun asks for its GPU per node, beside which
#: these cannot be rebuilt faithfully (``cpu:N`` in ``tres_per_task`` is ``--cpus-per-task``, carried).
_TRES_ELSEWHERE = ("tres_per_job", "tres_per_task", "tres_per_socket", "cpus_per_tres", "memory_per_tres")


@dataclass(frozen=True)
class Confinement:
    """A job's confinement as sbatch option words (values verbatim), its non-shard GRES (``("nic:1",)``), and
    one phrase per part the rerun cannot carry."""

    options: Tuple[str, ...]
    other_gres: Tuple[str, ...]
    uncarried: Tuple[str, ...]


def _value(j: Mapping[str, object], key: str) -> str:
    """A text field with Slurm's "not set" spellings (``(null)``, WCKey's ``*`` default marker) removed."""
    v = text(j, key).strip()
    if key == "wckey" and v.startswith("*"):
        return ""  # "*name": the user's default WCKey, applied again by slurmctld
    return "" if v in ("(null)", "None") else v


def _gres_entries(tres: str) -> List[Tuple[str, str]]:
    """``"gres:shard:2,gres/nic:1"`` -> ``[("shard", "shard:2"), ("nic", "nic:1")]``; others skipped."""
    out = []
    for part in tres.split(","):
        part = part.strip().replace("gres/", "gres:", 1)
        if part.startswith("gres:") and len(part) > 5:
            word = part[5:]
            out.append((word.split(":", 1)[0], word))
    return out


def _exclusive(j: Mapping[str, object]) -> bool:
    """Whether the record says the job asked for its nodes exclusively: 22.05 ``shared: "none"``, a
    data_parser ``shared``/``exclusive`` list holding ``none``/``true``/``user``/``mcs``. 26.05 prints
    ``shared: []`` for an ``--exclusive`` job too: there the record does not tell, and the rerun is not
    exclusive."""
    shared, excl = j.get("shared"), j.get("exclusive")
    words = [shared] if isinstance(shared, str) else list(shared) if isinstance(shared, list) else []
    words += [excl] if isinstance(excl, str) else list(excl) if isinstance(excl, list) else []
    return any(str(w).lower() in ("none", "exclusive", "true", "user", "mcs") for w in words)


def confinement_of(j: Mapping[str, object], rerun_gres: Sequence[str] = ("shard",)) -> Confinement:
    """The confinement of one ``jobs[]`` entry; ``rerun_gres``: GRES the rerun replaces by its own request."""
    options = [f"{opt}={v}" for key, opt in TEXT_OPTIONS for v in [_value(j, key)] if v]
    if j.get("contiguous") is True:
        options.append("--contiguous")
    if _exclusive(j):
        options.append("--exclusive")
    entries = _gres_entries(text(j, "tres_per_node"))
    other = tuple(word for name, word in entries if name not in rerun_gres)
    uncarried = [f"{key} {word}" for key in _TRES_ELSEWHERE[:3] for _, word in _gres_entries(text(j, key))]
    uncarried += [f"{key} {v}" for key in _TRES_ELSEWHERE[3:] for v in [_value(j, key)] if v]
    if _value(j, "burst_buffer"):
        uncarried.append("a burst buffer")
    if integer(j, "het_job_id"):
        uncarried.append("the other components of a heterogeneous job")
    return Confinement(tuple(options), other, tuple(uncarried))


def refusal(c: Confinement) -> Optional[str]:
    """The reason a rerun is refused for ``c`` (one line), or None when everything can be carried."""
    if not c.uncarried:
        return None
    return "the rerun could not carry what the job asked for (" + "; ".join(c.uncarried) + "): not rerun"
