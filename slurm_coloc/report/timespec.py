"""Parsing ``--since``/``--until`` values (pure)."""
from __future__ import annotations

import datetime
import math
import re
import time
from typing import Optional

from slurm_coloc.errors import ColocError

_REL = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_FORMATS = ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S")


def parse_when(text: Optional[str], now: Optional[float] = None) -> Optional[float]:
    """A time as Unix seconds: ``now``, ``7d``/``12h``/``30m``/``90s``/``2w`` ago, a local date/time
    (``2026-11-01``, ``2026-11-01T10:00[:00]``) or Unix seconds (``@1700000000``). None stays None.

    Raises:
        ColocError: none of these forms.
    """
    if text is None:
        return None
    now = time.time() if now is None else now
    t = text.strip()
    if t == "now":
        return now
    m = _REL.match(t)
    value: Optional[float] = None
    if m:
        value = now - float(m.group(1)) * _UNIT_S[m.group(2)]
    elif t.startswith("@"):
        try:
            value = float(t[1:])
        except ValueError:
            pass
    if value is not None:
        if not math.isfinite(value) or abs(value) > 1e11:  # ~ year 5138: beyond any job; inf/nan broke SQL
            raise ColocError(f"invalid time {text!r}: out of range", hint="use e.g. 7d, 2026-11-01 or @<unix s>")
        return value
    for fmt in _FORMATS:
        try:
            return datetime.datetime.strptime(t, fmt).timestamp()
        except ValueError:
            continue
    raise ColocError(f"invalid time {text!r}", hint="use e.g. 7d, 12h, 2026-11-01, 2026-11-01T10:00 or @<unix s>")
