"""Machine output of coloc-report views: JSON and CSV (stdlib only)."""
from __future__ import annotations

import csv
import json
from typing import IO, Dict, List, Sequence

from slurm_coloc.report.columns import cell


def to_json(view: str, rows: Sequence[Dict[str, object]], problems: Sequence[str], file: IO[str]) -> None:
    """Write ``{"<view>": rows, "problems": [...]}`` to ``file``, one row per line.

    Each row goes through json's C encoder (``indent`` would switch to the pure-Python one: 4268 jobs took 1
    s).

    Args:
        view: the view's name, the top-level key.
        rows: the view's rows; values json cannot encode are written as ``str``.
        problems: the report's problem lines.
        file: a text stream opened for writing.
    """
    file.write(f"{{{json.dumps(view)}: [\n")
    file.write(",\n".join(json.dumps(r, default=str) for r in rows))
    file.write(f"\n], \"problems\": {json.dumps(list(problems))}}}\n")


def to_csv(rows: Sequence[Dict[str, object]], file: IO[str], columns: Sequence[str] = ()) -> None:
    """Write rows as CSV: the header is ``columns``, written even without a row; times (``*_ts``) in ISO 8601,
    lists joined by ``; ``.

    Args:
        rows: the view's rows; keys outside ``columns`` are left out.
        file: a text stream opened for writing.
        columns: the view's or the ``-o`` ones (``report/columns.py``); none given: the rows' keys, in first
            seen order.
    """
    cols: List[str] = list(columns)
    for r in rows:
        cols.extend(k for k in r if k not in cols and not columns)
    writer = csv.DictWriter(file, fieldnames=cols, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: cell(k, r.get(k)) for k in cols})
