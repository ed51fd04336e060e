"""Machine output of coloc-report views: JSON and CSV (stdlib only)."""
from __future__ import annotations

import csv
import json
from typing import IO, Dict, List, Sequence


def to_json(view: str, rows: Sequence[Dict[str, object]], problems: Sequence[str], file: IO[str]) -> None:
    """Write ``{"<view>": rows, "problems": [...]}`` to ``file``, one row per line.

    Each row goes through json's C encoder (``indent`` would switch to the pure-Python one: 4268 jobs took 1 s).
    """
    file.write(f"{{{json.dumps(view)}: [\n")
    file.write(",\n".join(json.dumps(r, default=str) for r in rows))
    file.write(f"\n], \"problems\": {json.dumps(list(problems))}}}\n")


def to_csv(rows: Sequence[Dict[str, object]], file: IO[str]) -> None:
    """Write rows as CSV with a header (columns of the first row, then any new ones); lists joined by ``; ``."""
    cols: List[str] = []
    for r in rows:
        cols.extend(k for k in r if k not in cols)
    writer = csv.DictWriter(file, fieldnames=cols, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: ("; ".join(map(str, v)) if isinstance(v, list) else v) for k, v in r.items()})
