"""Pure parsers of Slurm 22.05 machine output, by field name. Tested on verbatim recordings in
``tests/data/slurm-22.05/``.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from slurm_coloc.errors import SlurmError

#: Job states after which a job no longer runs (squeue ``job_state`` / scontrol ``JobState``).
FINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                          "PREEMPTED", "BOOT_FAIL", "DEADLINE"})
_KV_SPLIT = re.compile(r"\s+(?=[A-Za-z][A-Za-z0-9_/:.]*=)")
_GRES_DETAIL = re.compile(r"^(?P<name>[a-z]+)(?::(?P<type>[^:(]+))?:(?P<count>\d+)\(IDX:(?P<idx>[^)]*)\)$")


def parse_sbatch_parsable(stdout: str) -> Tuple[int, Optional[str]]:
    """``sbatch --parsable`` prints ``<jobid>[;<cluster>]``; return (job id, cluster or None).

    Raises:
        SlurmError: the output is not a job id.
    """
    line = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    head, _, cluster = line.partition(";")
    if not head.isdigit():
        raise SlurmError(f"cannot read a job id from sbatch output {stdout.strip()!r}")
    return int(head), (cluster or None)


def parse_scontrol_kv(line: str) -> Dict[str, str]:
    """Split one line of ``scontrol show job -o`` into ``{key: value}``.

    Values may contain spaces (``Comment``, ``JobName``, paths) and a user can put ``Key=value`` text
    into them. Keys that appear before ``Comment`` in 22.05's fixed field order keep their FIRST
    occurrence, keys after it their LAST, so text planted in a user-set field cannot override the
    real field that follows or precedes it. Free-text fields themselves (``Comment``) should be read
    from ``squeue --json`` instead.
    """
    tokens = _KV_SPLIT.split(line.strip())
    pairs: List[Tuple[str, str]] = []
    for tok in tokens:
        key, sep, value = tok.partition("=")
        if not sep:
            if pairs:
                pairs[-1] = (pairs[-1][0], pairs[-1][1] + " " + tok)
            continue
        pairs.append((key, value))
    comment_at = next((i for i, (k, _) in enumerate(pairs) if k == "Comment"), len(pairs))
    before = {k for k, _ in pairs[:comment_at]}
    out: Dict[str, str] = {}
    for key, value in pairs:
        if key in before:
            out.setdefault(key, value)
        else:
            out[key] = value
    return out


def parse_gres_detail(entries: List[str]) -> List[Tuple[str, int, List[int]]]:
    """``["shard:5(IDX:0)", "gpu:2(IDX:0-1)"]`` -> ``[("shard", 5, [0]), ("gpu", 2, [0, 1])]``."""
    out = []
    for entry in entries:
        m = _GRES_DETAIL.match(entry.strip())
        if m:
            out.append((m.group("name"), int(m.group("count")), parse_index_list(m.group("idx"))))
    return out


def parse_index_list(text: str) -> List[int]:
    """``"0-2,5"`` -> ``[0, 1, 2, 5]``; ``""``/``"N/A"`` -> ``[]``. Used for SLURM_JOB_GPUS and IDX."""
    out: List[int] = []
    for part in (text or "").split(","):
        part = part.strip()
        if not part or not part[0].isdigit():
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def parse_tres_per_node(text: str) -> Dict[str, int]:
    """``"gres:shard:5"`` / ``"gres:gpu:a100:2,gres:shard:3"`` -> ``{"shard": 5}`` / ``{"gpu": 2, "shard": 3}``."""
    out: Dict[str, int] = {}
    for part in (text or "").split(","):
        bits = part.strip().replace("gres/", "gres:").split(":")
        if len(bits) >= 3 and bits[0] == "gres" and bits[-1].isdigit():
            out[bits[1]] = out.get(bits[1], 0) + int(bits[-1])
        elif len(bits) == 2 and bits[0] == "gres" and bits[1]:
            out[bits[1]] = out.get(bits[1], 0) + 1
    return out


@dataclass(frozen=True)
class JobRecord:
    """One job as ``squeue --json`` (openapi v0.0.38) shows it. Times are Unix seconds (0 = unset)."""

    job_id: int
    name: str
    user_name: str
    user_id: int
    state: str
    exit_code: int
    partition: str
    nodes: str
    comment: str
    tres_per_node: str
    gres_detail: Tuple[str, ...]
    submit_time: int
    start_time: int
    end_time: int
    work_dir: str
    standard_output: str
    standard_error: str
    restart_cnt: int
    raw: Dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


def parse_squeue_json(text: str) -> List[JobRecord]:
    """Parse ``squeue --json`` output (which ignores every filter in 22.05: facts §7).

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
    return [_job_record(j) for j in jobs if isinstance(j, dict) and "job_id" in j]


def _job_record(j: Dict[str, Any]) -> JobRecord:
    def s(key: str) -> str:
        v = j.get(key)
        return "" if v is None else str(v)

    def n(key: str) -> int:
        v = j.get(key)
        return int(v) if isinstance(v, (int, float)) else 0

    return JobRecord(
        job_id=int(j["job_id"]), name=s("name"), user_name=s("user_name"), user_id=n("user_id"),
        state=s("job_state"), exit_code=n("exit_code"), partition=s("partition"), nodes=s("nodes"),
        comment=s("comment"), tres_per_node=s("tres_per_node"),
        gres_detail=tuple(str(x) for x in (j.get("gres_detail") or [])),
        submit_time=n("submit_time"), start_time=n("start_time"), end_time=n("end_time"),
        work_dir=s("current_working_directory"), standard_output=s("standard_output"),
        standard_error=s("standard_error"), restart_cnt=n("restart_cnt"), raw=j,
    )


def decode_exit_code(status: int) -> Tuple[int, int]:
    """Wait-status as Slurm reports it (``SLURM_JOB_EXIT_CODE``/squeue ``exit_code``) -> (exit code, signal).

    ``768`` -> ``(3, 0)``; ``9`` -> ``(0, 9)`` (facts §5).
    """
    return (status >> 8) & 0xFF, status & 0x7F
