r"""Machine output of coloc-report views: JSON and CSV (stdlib only), and ``visible``: the one way user text
(job names, the comment's ``method``, user names, paths) reaches an admin's terminal or spreadsheet.

Job names and comments are the user's text and may hold terminal escape sequences (ESC ``[2J``, OSC ``]0;``
titles, OSC 8 links), other C0/C1 control characters or bidirectional overrides that reorder what is shown.
JSON escapes them itself (``\u001b``); tables, ``advise`` and CSV write ``visible(text)``.
"""
from __future__ import annotations

import csv
import json
import re
from typing import IO, Dict, List, Sequence

from slurm_coloc.report.columns import cell

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
    unchanged. ``visible("a\x1b[2Jb") == "a\\x1b[2Jb"``. Pure, never raises.
    """
    return _UNSAFE.sub(_escape, text)


def csv_text(value: object) -> object:
    """A CSV cell made safe: strings through ``visible``, and one starting with ``=``, ``+``, ``-`` or ``@``
    (a spreadsheet formula: ``=HYPERLINK(...)``) behind a ``'``; other values unchanged.
    """
    if not isinstance(value, str):
        return value
    text = visible(value)
    return "'" + text if text.startswith(_FORMULA) else text


def to_json(view: str, rows: Sequence[Dict[str, object]], problems: Sequence[str], file: IO[str]) -> None:
    """Write ``{"<view>": rows, "problems": [...]}`` to ``file``, one row per line; values json cannot encode
    as ``str``. Each row goes through json's C encoder (``indent`` would switch to the pure-Python one: 4268
    jobs took 1 s).
    """
    file.write(f"{{{json.dumps(view)}: [\n")
    file.write(",\n".join(json.dumps(r, default=str) for r in rows))
    file.write(f"\n], \"problems\": {json.dumps(list(problems))}}}\n")


def to_csv(rows: Sequence[Dict[str, object]], file: IO[str], columns: Sequence[str] = ()) -> None:
    """Write rows as CSV: the header is ``columns`` (none given: the rows' keys, first seen order), written
    even without a row, other keys left out; times (``*_ts``) in ISO 8601, lists joined by ``; ``; text
    through ``csv_text``.
    """
    cols: List[str] = list(columns)
    for r in rows:
        cols.extend(k for k in r if k not in cols and not columns)
    writer = csv.DictWriter(file, fieldnames=cols, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: csv_text(cell(k, r.get(k))) for k in cols})
