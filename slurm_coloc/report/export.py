r"""Machine output of coloc-report views: each view's columns (the JSON/CSV keys; tests/test_report_output.py
checks they are what ``report/views.py`` writes, so ``-o`` is checked before any read), JSON and CSV (stdlib
only), and ``visible``: the one way user text (job names, the comment's ``method``, user names, paths)
reaches an admin's terminal or spreadsheet. User text may hold terminal escape sequences (ESC ``[2J``, OSC
``]0;`` titles, OSC 8 links), other C0/C1 controls or bidirectional overrides that reorder what is shown.
JSON escapes them itself (``\u001b``); tables, ``advise`` and CSV write ``visible(text)``.
"""
from __future__ import annotations

import csv
import datetime
import json
import re
from dataclasses import fields
from typing import IO, Dict, List, Sequence, Tuple

from slurm_coloc.errors import ColocError
from slurm_coloc.report.summarize import JobView

JOB_COLUMNS: Tuple[str, ...] = tuple(f.name for f in fields(JobView)) + ("runtime_s",)
USER_COLUMNS = ("user", "jobs", "gpu_hours", "energy_kwh", "smact_mean", "smocc_mean", "util_mean",
                "unused_gib_hours", "estimate_abs_error_pct_mean", "ooms", "wasteful_jobs",
                "jobs_without_samples")
GPU_COLUMNS = ("node", "gpu", "jobs", "busy_hours", "collocation_factor", "util_mean", "smact_mean",
               "smact_p95", "smocc_mean", "smocc_p95", "mem_used_mean_mib", "mem_used_max_mib",
               "saturated_hours", "saturated_pct", "mem_total_mib", "energy_kwh", "sampled_hours")
_FOLD = ("gpus", "busy_gpu_hours", "collocation_factor", "util_mean", "smact_mean", "smocc_mean",
         "energy_kwh")
NODE_COLUMNS = ("node",) + _FOLD
CLUSTER_COLUMNS = _FOLD + ("jobs", "users", "gpu_hours", "job_energy_kwh", "ooms", "oom_retries_completed",
                           "wasteful_jobs", "estimate_abs_error_pct_mean")
VIEW_COLUMNS: Dict[str, Tuple[str, ...]] = {"jobs": JOB_COLUMNS, "users": USER_COLUMNS, "gpus": GPU_COLUMNS,
                                            "nodes": NODE_COLUMNS, "cluster": CLUSTER_COLUMNS}


def select_columns(view: str, spec: str) -> List[str]:
    """The columns named by ``-o/--format`` (comma-separated, case-insensitive; ``jobid`` may leave out the
    underscore, ``peak_mib`` names ``peak_mem_mib``), in order; ``view`` is the caller's, not user text.
    ColocError: an empty list or an unknown column (one line listing the valid ones)."""
    valid = VIEW_COLUMNS[view]
    squashed = {c.replace("_", ""): c for c in valid}
    aliases = {"peak_mib": "peak_mem_mib", "est_mib": "estimate_mib", "req_mib": "requested_mib",
               "mode": "share_mode", "jobid": "job_id"}
    out: List[str] = []
    for word in (w.strip().lower() for w in spec.split(",")):
        if not word:
            continue
        col = word if word in valid else aliases.get(word) or squashed.get(word.replace("_", ""))
        if col is None or col not in valid:
            raise ColocError(f"-o/--format: no column {word!r} in the {view} view; valid: {','.join(valid)}")
        out.append(col)
    if not out:
        raise ColocError(f"-o/--format: no column given; valid: {','.join(valid)}")
    return out


def iso_time(ts: object) -> object:
    """Unix s (int or float) -> ISO 8601 local time with UTC offset; other values as they are."""
    if isinstance(ts, (int, float)) and not isinstance(ts, bool):
        return datetime.datetime.fromtimestamp(float(ts)).astimezone().isoformat(timespec="seconds")
    return ts


def cell(key: str, value: object) -> object:
    """A CSV cell: times (``*_ts`` columns) in ISO 8601, lists joined by ``; ``, findings by their names."""
    if key.endswith("_ts"):
        return iso_time(value)
    if isinstance(value, list):
        return "; ".join(str(v.get("name", v)) if isinstance(v, dict) else str(v) for v in value)
    return value


def project(rows: Sequence[Dict[str, object]], cols: Sequence[str]) -> List[Dict[str, object]]:
    """Rows reduced to ``cols`` (in that order); a row without one gets None."""
    return [{c: r.get(c) for c in cols} for r in rows]


# C0 controls (tab and newline included: one cell, one line), DEL, C1 controls, and the Unicode format
# characters that reorder or hide text: ALM, LRM/RLM, LS/PS, the bidi embeddings/overrides/isolates, BOM.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
                     "\ufeff]")
_FORMULA = ("=", "+", "-", "@")  # a spreadsheet reads a cell starting so as a formula


def _escape(m: "re.Match[str]") -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str) -> str:
    r"""``text`` (user text) with every control and reordering character written as a visible escape (the four
    characters ``\x1b`` for ESC, ``\u202e`` for RLO); printable text, other non-ASCII letters included,
    unchanged. ``visible("a\x1b[2Jb") == "a\\x1b[2Jb"``. Pure, never raises."""
    return _UNSAFE.sub(_escape, text)


def csv_text(value: object) -> object:
    """A CSV cell made safe: strings through ``visible``, one starting with ``=``, ``+``, ``-`` or ``@`` (a
    spreadsheet formula) behind a ``'``."""
    if not isinstance(value, str):
        return value
    text = visible(value)
    return "'" + text if text.startswith(_FORMULA) else text


def to_json(view: str, rows: Sequence[Dict[str, object]], problems: Sequence[str], file: IO[str]) -> None:
    """Write ``{"<view>": rows, "problems": [...]}`` to ``file``, one row per line, unencodable values as
    ``str``; json's C encoder per row (``indent`` would switch to the pure-Python one: 4268 jobs took 1 s)."""
    file.write(f"{{{json.dumps(view)}: [\n")
    file.write(",\n".join(json.dumps(r, default=str) for r in rows))
    file.write(f"\n], \"problems\": {json.dumps(list(problems))}}}\n")


def to_csv(rows: Sequence[Dict[str, object]], file: IO[str], columns: Sequence[str] = ()) -> None:
    """Write rows as CSV under the header ``columns`` (none: the rows' keys, first seen order; written even
    without a row), other keys left out; each cell through ``cell`` and ``csv_text``."""
    cols: List[str] = list(columns)
    for r in rows:
        cols.extend(k for k in r if k not in cols and not columns)
    writer = csv.DictWriter(file, fieldnames=cols, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: csv_text(cell(k, r.get(k))) for k in cols})
