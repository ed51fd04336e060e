"""Parsing ``--since``/``--until`` values (pure): Slurm's time forms, as ``sacct -S/-E`` reads them, and short
ones.

Slurm's forms (sacct(1) "-S", parse_time.c with ``past`` set, as sacct calls it): ``now``,
``now[{+|-}count[seconds|minutes|hours|days|weeks]]`` (count alone: seconds), ``today`` and ``midnight``
(00:00 today), ``tomorrow`` (00:00 tomorrow), ``noon``, ``elevenses`` (11:00), ``fika`` (15:00), ``teatime``
(16:00), ``HH:MM[:SS]``, ``YYYY-MM-DD[THH:MM[:SS]]``, ``MM/DD[/YY]``. A time of day without a date that is
still to come today means yesterday (sacct's rule: a window start lies in the past). Short forms: ``7d``,
``12h``, ``30m``, ``90s``, ``2w`` ago; ``@<unix s>``. Times are local, as Slurm's.
"""
from __future__ import annotations

import datetime
import math
import re
import time
from typing import Optional, Tuple

from slurm_coloc.errors import ColocError

_REL = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_NOW = re.compile(r"^now\s*(?:([+-])\s*(\d+)\s*(s|sec|secs|seconds?|m|min|mins|minutes?|h|hours?|d|days?|"
                  r"w|weeks?)?)?$", re.IGNORECASE)
_DAY_WORDS = {"today": 0, "midnight": 0, "tomorrow": 1}
_HOUR_WORDS = {"noon": 12, "elevenses": 11, "fika": 15, "teatime": 16}
_CLOCK = re.compile(r"^(\d{1,2}):(\d{2})(?::(\d{2}))?$")
_FORMATS = ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S",
            "%m/%d/%y", "%m/%d/%Y")
HINT = "use e.g. now-7days, now-2hours, today, midnight, 7d, 2026-11-01, 2026-11-01T10:00 or @<unix s>"


def _local_midnight(now: float, days: int = 0) -> float:
    d = datetime.datetime.fromtimestamp(now).date() + datetime.timedelta(days=days)
    return datetime.datetime.combine(d, datetime.time()).timestamp()


def _past_clock(now: float, h: int, m: int, s: int = 0) -> float:
    """Today at h:m:s, or yesterday when that is still to come (sacct's ``past`` rule)."""
    day = datetime.datetime.fromtimestamp(now).date()
    t = datetime.datetime.combine(day, datetime.time(h, m, s)).timestamp()
    if t > now:
        t = datetime.datetime.combine(day - datetime.timedelta(days=1), datetime.time(h, m, s)).timestamp()
    return t


def parse_when(text: Optional[str], now: Optional[float] = None) -> Optional[float]:
    """Unix seconds from one of the module docstring's forms (None stays None); ``now`` (Unix s, default the
    clock) anchors relative forms.

    Raises:
        ColocError: none of these forms, or out of range.
    """
    if text is None:
        return None
    now = time.time() if now is None else now
    t = text.strip()
    value = _offset(t, now)
    if value is not None:
        if not math.isfinite(value) or abs(value) > 1e11:  # ~ year 5138: beyond any job; inf/nan broke SQL
            raise ColocError(f"invalid time {text!r}: out of range", hint=HINT)
        return value
    value = _time_of_day(t, now, text)
    if value is not None:
        return value
    for fmt in _FORMATS:
        try:
            return datetime.datetime.strptime(t, fmt).timestamp()
        except ValueError:
            continue
    raise ColocError(f"invalid time {text!r}", hint=HINT)


def _offset(t: str, now: float) -> Optional[float]:
    """``now[{+|-}count[unit]]``, a short form (``7d``: that long ago) or ``@<unix s>`` as Unix seconds (not
    yet range-checked); None for another form."""
    m = _NOW.match(t)
    if m:
        sign, count, unit = m.groups()
        if not sign:
            return now
        return now + (1 if sign == "+" else -1) * int(count) * _UNIT_S[(unit or "s")[0].lower()]
    r = _REL.match(t)
    if r:
        return now - float(r.group(1)) * _UNIT_S[r.group(2)]
    if t.startswith("@"):
        try:
            return float(t[1:])
        except ValueError:
            return None
    return None


def _time_of_day(t: str, now: float, text: str) -> Optional[float]:
    """A day word (``today``, ``tomorrow``: local midnight), an hour word (``noon``) or ``HH:MM[:SS]`` (the
    last such time not to come, sacct's ``past`` rule) as Unix seconds; None for another form. ``text``: as
    given, for the error.

    Raises:
        ColocError: ``HH:MM[:SS]`` that is no time of day (``25:00``).
    """
    low = t.lower()
    if low in _DAY_WORDS:
        return _local_midnight(now, _DAY_WORDS[low])
    if low in _HOUR_WORDS:
        return _past_clock(now, _HOUR_WORDS[low], 0)
    c = _CLOCK.match(t)
    if c is None:
        return None
    h, mi, s = int(c.group(1)), int(c.group(2)), int(c.group(3) or 0)
    if h > 23 or mi > 59 or s > 59:
        raise ColocError(f"invalid time {text!r}: no such time of day", hint=HINT)
    return _past_clock(now, h, mi, s)


def parse_window(since: Optional[str], until: Optional[str],
                 now: Optional[float] = None) -> Tuple[Optional[float], Optional[float]]:
    """``(since, until)`` in Unix seconds (each None when not given); both ends use the same ``now``.

    Raises:
        ColocError: a bad form (``parse_when``), or an end before the start.
    """
    t0, t1 = parse_when(since, now), parse_when(until, now)
    if t0 is not None and t1 is not None and t1 < t0:
        raise ColocError(f"--until {until!r} ({_iso(t1)}) is before --since {since!r} ({_iso(t0)})",
                         hint="give the window's start first")
    return t0, t1


def _iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts).isoformat(timespec="seconds")
