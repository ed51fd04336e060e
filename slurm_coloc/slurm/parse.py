"""Pure parsers of Slurm text: exit codes, host lists, GRES strings, sbatch output, slurmstepd titles, and the
values of ``--json`` job records in either schema (the records themselves: ``slurm/jobinfo.py``).

Tested on verbatim recordings of 22.05.8, 24.11.5 and 26.05.5 (``tests/data/slurm-<version>/``); where the
text differs (``gres_detail``, ``TresPerNode``) both forms are read. JSON (``docs/slurm-versions.md``):
22.05's ``openapi/v0.0.38`` has plain numbers with ``NO_VAL``/``INFINITE`` markers, ``job_state`` one string,
``exit_code`` the wait status; data_parser v0.0.40+ (24.11 v0.0.42, 26.05 v0.0.45) has ``{"set", "infinite",
"number"}`` objects, ``job_state`` a list (base state, then flags), ``exit_code`` ``{"return_code", "signal":
{"id"}}`` numbers. Each JSON reader takes either form.
"""
from __future__ import annotations

import os
import re
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from slurm_coloc.errors import SlurmError

#: Job states after which a job no longer runs (squeue ``job_state`` / scontrol ``JobState``).
FINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                          "PREEMPTED", "BOOT_FAIL", "DEADLINE"})
_GRES_DETAIL = re.compile(r"^(?P<name>[a-z]+)(?::(?P<type>[^:(]+))?:(?P<count>\d+)\((?P<body>[^)]*)\)$")
_PER_DEVICE = re.compile(r"^\d+/\d+(?:,\d+/\d+)*$")
_BRACKET = re.compile(r"\[([^\]]+)\]")
MAX_HOSTS = 65536  # bound on one expansion: a hostlist from Slurm never names more nodes than this


def parse_sbatch_parsable(stdout: str) -> Tuple[int, Optional[str]]:
    """``(job id, cluster or None)`` from the last line of ``sbatch --parsable``: ``<jobid>[;<cluster>]``.
    SlurmError: not a job id."""
    line = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    head, _, cluster = line.partition(";")
    if not head.isdigit():
        raise SlurmError(f"cannot read a job id from sbatch output {stdout.strip()!r}")
    return int(head), (cluster or None)


def decode_exit_code(status: int) -> Tuple[int, int]:
    """Wait status (``SLURM_JOB_EXIT_CODE``) -> (exit 0-255, signal 0-127): ``768`` -> (3, 0)."""
    return (status >> 8) & 0xFF, status & 0x7F


def expand_hostlist(text: Optional[str]) -> List[str]:
    """``gpu[01-02,05]`` -> gpu01 gpu02 gpu05; ``a[1-2]b,c`` -> a1b a2b c; None or ``""`` -> ``[]``. Zero
    padding kept, bracket groups multiply, paths expand too (``/dev/nvidia[0-1]``), order and duplicates kept.
    SlurmError: unbalanced brackets, a bad range (``n[3-1]``, ``n[a-b]``) or more than ``MAX_HOSTS`` names."""
    items, depth, cur = [], 0, ""
    for ch in text or "":
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        depth += ch == "["
        depth -= ch == "]"
        if depth not in (0, 1):
            raise SlurmError(f"unbalanced brackets in host list {text!r}")
        cur += ch
    if depth:
        raise SlurmError(f"unbalanced brackets in host list {text!r}")
    items.append(cur)
    out: List[str] = []
    for item in (i.strip() for i in items if i.strip()):
        _expand_item(item, out, text or "")
    return out


def _expand_item(item: str, out: List[str], whole: str) -> None:
    m = _BRACKET.search(item)
    if not m:
        out.append(item)
        if len(out) > MAX_HOSTS:
            raise SlurmError(f"host list {whole[:80]!r} names more than {MAX_HOSTS} hosts")
        return
    head, tail = item[:m.start()], item[m.end():]
    for part in m.group(1).split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise SlurmError(f"bad range {part!r} in host list {whole[:80]!r}")
        if not dash:
            _expand_item(f"{head}{lo}{tail}", out, whole)
            continue
        if int(hi) < int(lo) or int(hi) - int(lo) > MAX_HOSTS:
            raise SlurmError(f"bad range {part!r} in host list {whole[:80]!r}")
        width = len(lo) if lo.startswith("0") else 0
        for n in range(int(lo), int(hi) + 1):
            _expand_item(f"{head}{str(n).zfill(width)}{tail}", out, whole)


def gres_detail_counts(entries: Sequence[str]) -> List[Tuple[str, str, Dict[int, int]]]:
    """``gres_detail`` (JSON) / ``GRES=`` (``scontrol show job -od``) -> ``[(name, type or "", {device:
    count})]``.  22.05 names the device indices, each with the entry's count (``shard:5(IDX:0)`` ->
    ``("shard", "", {0: 5})``; ``gpu:2(IDX:0-1)`` -> ``{0: 2, 1: 2}``); 24.11+ print a shard as
    ``<held>/<total>`` per device in index order (``shard:5(5/80,0/80)`` -> ``{0: 5}``, devices holding none
    left out), a whole GPU as ``gpu:1(IDX:0)``. Typed GRES keep their type (``shard:g0:4(IDX:0)`` ->
    ``("shard", "g0", {0: 4})``); entries in neither form are skipped."""
    out: List[Tuple[str, str, Dict[int, int]]] = []
    for entry in entries:
        for part in re.split(r",(?=[a-z])", entry or ""):
            m = _GRES_DETAIL.match(part.strip())
            if not m:
                continue
            body, count = m.group("body"), int(m.group("count"))
            if body.startswith("IDX:"):
                per = {i: count for i in parse_index_list(body[4:])}
            elif _PER_DEVICE.match(body):
                held = (int(pair.split("/")[0]) for pair in body.split(","))
                per = {i: n for i, n in enumerate(held) if n}
            else:
                continue
            out.append((m.group("name"), m.group("type") or "", per))
    return out


def parse_index_list(text: Optional[str]) -> List[int]:
    """``"0-2,5"`` -> ``[0, 1, 2, 5]``; None, ``""``, ``"N/A"`` and non-numeric parts are skipped."""
    out: List[int] = []
    for part in (text or "").split(","):
        part = part.strip()
        if not part or not part[0].isdigit():
            continue
        lo, _, hi = part.partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()):
            out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def parse_tres_per_node(text: Optional[str]) -> Dict[str, int]:
    """``"gres:gpu:a100:2,gres:shard:3"`` -> ``{"gpu": 2, "shard": 3}`` (22.05 ``gres:``, 24.11+ ``gres/``). A
    GRES without a count counts 1, the same name twice is summed, other parts are skipped."""
    out: Dict[str, int] = {}
    for part in (text or "").split(","):
        bits = part.strip().replace("gres/", "gres:").split(":")
        if len(bits) >= 3 and bits[0] == "gres" and bits[-1].isdigit():
            out[bits[1]] = out.get(bits[1], 0) + int(bits[-1])
        elif len(bits) == 2 and bits[0] == "gres" and bits[1]:
            out[bits[1]] = out.get(bits[1], 0) + 1
    return out


def script_args_in_submit_line(submit_line: str, command: str, work_dir: str) -> Tuple[Optional[str], bool]:
    """``(arguments text or None, exact)``: the script's arguments in 26.05's ``submit_line`` (sbatch's argv
    joined by single spaces), as 22.05's ``command`` gives them.  ``command`` is the script as 26.05 records
    it: the path as given when it held a ``/``, else the path sbatch resolved (checked on 26.05.5). The script
    is the first word after word 0 naming that file (equal to ``command``, to it joined to ``work_dir``, or
    its basename), not directly after an option word without ``=``: ``sbatch -J s.sh ./s.sh 200`` -> ``("200",
    True)``. Inexact where several words name the script or spaces are doubled."""
    if not command:
        return None, False
    words = submit_line.split(" ")
    target = os.path.normpath(os.path.join(work_dir, command))
    hits = [i for i, w in enumerate(words) if i > 0 and w and (
        w == command or os.path.normpath(os.path.join(work_dir, w)) == target
        or ("/" not in w and w == os.path.basename(command)))]
    if not hits:
        return None, False
    chosen = next((i for i in hits if not (words[i - 1].startswith("-") and "=" not in words[i - 1])),
                  hits[0])
    rest = " ".join(words[chosen + 1:])
    return rest, len(hits) == 1 and "  " not in rest


_STEPD_TITLE = re.compile(rb"^slurmstepd: \[(\d+)\.[A-Za-z0-9_]+\]")


def parse_stepd_title(cmdline: bytes) -> Optional[int]:
    """``slurmstepd: [6.1]`` (``/proc/<pid>/cmdline``) -> 6, else None: slurmstepd titles itself with its
    component's job id (a step of het component 1 of job 5 shows ``[6.1]``, its tasks ``SLURM_JOB_ID=5``)."""
    m = _STEPD_TITLE.match(cmdline)
    return int(m.group(1)) if m else None


BIG = 0xFFFFFFF0  # 32-bit values at or above this are Slurm's NO_VAL/INFINITE markers (v0.0.38)


def number(value: object) -> Optional[float]:
    """A number field in either schema; None when absent, unset, infinite, a 22.05 marker or not a number."""
    if isinstance(value, Mapping):
        if not value.get("set") or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if 0 <= value < BIG else None


def integer(j: Mapping[str, object], key: str) -> Optional[int]:
    """``number`` of ``j[key]`` as an int."""
    v = number(j.get(key))
    return None if v is None else int(v)


def job_state(value: object) -> Tuple[str, Tuple[str, ...]]:
    """``job_state`` -> (state, flags), normalised here (first word, upper case); ("", ()) if unreadable.
    22.05: one string, a flag such as ``COMPLETING`` in place of the base state; data_parser: a list, base
    state first."""
    if isinstance(value, str):
        return _word(value), ()
    if isinstance(value, list) and value and all(isinstance(x, str) for x in value):
        return _word(value[0]), tuple(_word(x) for x in value[1:])
    return "", ()


def _word(text: str) -> str:
    words = text.split()
    return words[0].upper() if words else ""


def exit_pair(value: object) -> Tuple[Optional[int], Optional[int]]:
    """``exit_code`` / ``derived_exit_code`` -> scontrol's ``ExitCode=<code>:<signal>``, (None, None) when
    unreadable; 22.05: the wait status (``768`` -> (3, 0))."""
    if isinstance(value, bool):
        return None, None
    if isinstance(value, int):
        if not 0 <= value < BIG:
            return None, None
        return (value >> 8) & 0xFF, value & 0x7F
    if isinstance(value, Mapping):
        rc = value.get("return_code")
        sig = value.get("signal")
        sig_id = sig.get("id") if isinstance(sig, Mapping) else None
        if rc is None and sig_id is None:
            return None, None
        code, signo = number(rc), number(sig_id)
        return int(code or 0), int(signo or 0)
    return None, None


def text(j: Mapping[str, object], key: str) -> str:
    """A string field; ``""`` when absent or null (user text stays one opaque value)."""
    v = j.get(key)
    return "" if v is None else str(v)
