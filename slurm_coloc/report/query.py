"""One coloc-report question and its answer, the same for a direct read and for the reader service, and the
``--since``/``--until`` time forms it reads.

``collect`` computes a view's rows from the databases for a ``Viewer``; ``answer`` is what the reader service
(``report/reader.py``, run by root) does with a request from a peer whose uid the kernel gave it: the request
only filters, the viewer always comes from that uid, so a user never gets another user's job names, script
SHA-256s or any other row of theirs. Pure data: no click, no rich, no sockets.

Time forms: Slurm's, as ``sacct -S/-E`` reads them (sacct(1) "-S", parse_time.c with ``past`` set): ``now``,
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
from dataclasses import dataclass, fields
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from slurm_coloc.config import Config
from slurm_coloc.errors import ColocError
from slurm_coloc.report import diagnose, views
from slurm_coloc.report.summarize import JobView, Report, load_report
from slurm_coloc.report.usage import add_usage, job_series

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
    """Unix seconds from one of the module docstring's forms (None stays None), relative to ``now`` (Unix s,
    default the clock); ColocError: none of these forms, or out of range."""
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
    """A day word (local midnight), an hour word (``noon``) or ``HH:MM[:SS]`` (sacct's ``past`` rule) as Unix
    seconds; None for another form. ColocError: ``HH:MM[:SS]`` that is no time of day (``25:00``)."""
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
    """``(since, until)`` in Unix seconds (None when not given), both ends on one ``now``; ColocError: a bad
    form, or an end before the start."""
    t0, t1 = parse_when(since, now), parse_when(until, now)
    if t0 is not None and t1 is not None and t1 < t0:
        raise ColocError(f"--until {until!r} ({_iso(t1)}) is before --since {since!r} ({_iso(t0)})",
                         hint="give the window's start first")
    return t0, t1


def _iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts).isoformat(timespec="seconds")


VIEWS = ("jobs", "users", "gpus", "nodes", "cluster")
MAX_LIST_ITEMS = 1000  # users/nodes/job ids one request may name
MAX_TEXT_CHARS = 256  # one time spec, user, node or sort key


@dataclass(frozen=True)
class Query:
    """A report question: ``view`` (one of ``VIEWS``), time specs as typed (``7d``, ``2026-11-01``; parsed
    where the answer is computed), filters, and the sort column."""

    view: str = "jobs"
    since: Optional[str] = None
    until: Optional[str] = None
    users: Tuple[str, ...] = ()
    nodes: Tuple[str, ...] = ()
    job_ids: Tuple[int, ...] = ()
    sort_key: Optional[str] = None
    desc: bool = False

    def to_json(self) -> Dict[str, Any]:
        return {"view": self.view, "since": self.since, "until": self.until, "users": list(self.users),
                "nodes": list(self.nodes), "job_ids": list(self.job_ids), "sort_key": self.sort_key,
                "desc": self.desc}


def _text(data: Mapping[str, object], key: str) -> Optional[str]:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_TEXT_CHARS:
        raise ColocError(f"bad request: {key} must be text of at most {MAX_TEXT_CHARS} characters")
    return value


def _items(data: Mapping[str, object], key: str, kind: type) -> Tuple[Any, ...]:
    value = data.get(key) or []
    if not isinstance(value, list) or len(value) > MAX_LIST_ITEMS:
        raise ColocError(f"bad request: {key} must be a list of at most {MAX_LIST_ITEMS} items")
    for item in value:
        if not isinstance(item, kind) or isinstance(item, bool) or (
                isinstance(item, str) and len(item) > MAX_TEXT_CHARS):
            raise ColocError(f"bad request: every item of {key} must be a {kind.__name__}")
    return tuple(value)


def query_from_json(data: object) -> Query:
    """A ``Query`` from an untrusted request body; ColocError: not an object, an unknown view, or a field of
    the wrong type or size."""
    if not isinstance(data, dict):
        raise ColocError("bad request: expected a JSON object")
    view = data.get("view", "jobs")
    if view not in VIEWS:
        raise ColocError(f"bad request: unknown view {view!r}", hint=f"views: {', '.join(VIEWS)}")
    return Query(view=view, since=_text(data, "since"), until=_text(data, "until"),
                 users=_items(data, "users", str), nodes=_items(data, "nodes", str),
                 job_ids=_items(data, "job_ids", int), sort_key=_text(data, "sort_key"),
                 desc=bool(data.get("desc", False)))


@dataclass(frozen=True)
class Collected:
    """A question's answer as ``viewer`` may see it: the report (with its problems), the selected jobs, and
    the view's rows sorted by the query's sort key."""

    report: Report
    jobs: List[JobView]
    rows: List[Dict[str, object]]


def collect(cfg: Config, q: Query, viewer: views.Viewer, now: Optional[float] = None) -> Collected:
    """``q``'s answer relative to ``now`` (Unix s); ColocError: a bad time spec or sort column."""
    now = time.time() if now is None else now
    since, until = parse_window(q.since, q.until, now)
    flt = views.Filters(since=since, until=until, users=q.users or None,
                        nodes=q.nodes or None, job_ids=q.job_ids or None)
    report = load_report(cfg)
    jobs = views.select_jobs(report, cfg, flt, viewer, with_util=q.view in ("jobs", "users"), now=now)
    if not viewer.sees_all:
        report.problems.append(f"showing only {viewer.name}'s jobs (root and group "
                               f"{cfg.admin_group or '<admin_group unset>'} see all)")
    if q.view == "jobs":
        rows = views.job_rows(jobs)
    elif q.view == "users":
        rows = views.user_rows(jobs)
    else:
        gpus = views.gpu_rows(report, jobs, flt, viewer, now, cfg)
        rows = {"gpus": lambda: views.public(gpus), "nodes": lambda: views.node_rows(gpus),
                "cluster": lambda: [views.cluster_row(gpus, jobs)]}[q.view]()
    try:
        rows = views.sort_rows(rows, q.sort_key, q.desc)
    except KeyError:
        cols = ", ".join(rows[0].keys()) if rows else ""
        raise ColocError(f"--sort: no column {q.sort_key!r} in the {q.view} view",
                         hint=f"columns: {cols}") from None
    return Collected(report, jobs, rows)


def _history(cfg: Config, request: Mapping[str, object], uid: int) -> Dict[str, Any]:
    """``{"ok": true, "history_mib": [...]}`` for the request's script SHA-256 and the asking process's
    ``uid`` (the kernel's, never a request field): MiB figures of that user's own runs only."""
    from slurm_coloc.store.summaries import script_history_mib

    sha = request.get("sha256")
    if not isinstance(sha, str) or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise ColocError("bad request: sha256 must be 64 lower-case hex digits")
    return {"ok": True, "history_mib": [int(v) for v in script_history_mib(cfg, sha, uid=uid)]}


def advise(cfg: Config, job_id: int, viewer: views.Viewer, now: Optional[float] = None) -> Dict[str, Any]:
    """``coloc-report advise``'s data for one job ``viewer`` may see: ``{"ok": true, "job" (with findings),
    "series", "notes" (what a rule could not judge), "problems"}``. ColocError: not recorded, or not the
    viewer's."""
    now = time.time() if now is None else now
    report = load_report(cfg)
    job = next((j for j in report.jobs if j.job_id == job_id), None)
    if job is None or not (viewer.sees_all or job.user == viewer.name):
        whose = "" if viewer.sees_all else f" as one of {viewer.name}'s"
        raise ColocError(f"job {job_id} is not recorded" + whose,
                         hint="coloc-report jobs --since 30d lists the jobs you can see")
    job = diagnose.flag_waste(add_usage(job, report, cfg, None), cfg)
    series = job_series(report, job, now)
    job = diagnose.add_findings(job, cfg, series)
    notes = list(diagnose.diagnose(job, cfg, series).notes)
    return {"ok": True, "job": job.to_json(), "series": series, "notes": notes, "problems": report.problems}


def answer(cfg: Config, request: object, uid: int) -> Dict[str, Any]:
    """The reader service's answer to ``request`` (untrusted JSON) from the process of ``uid``
    (``SO_PEERCRED``).  ``{"op": "history", "sha256": ...}``: the estimator's history of a script; ``{"op":
    "advise", "job_id": N}``: one job's findings and samples, the caller's own jobs only unless it sees all;
    else a report ``Query``. Answer: ``{"ok": true, "view", "rows", "problems", "jobs"}`` or ``{"ok": false,
    "error": <one line>, "exit_code": n}``; never raises (a damaged database too becomes ``ok: false``)."""
    try:
        if isinstance(request, dict) and request.get("op") == "history":
            return _history(cfg, request, uid)
        if isinstance(request, dict) and request.get("op") == "advise":
            job_id = request.get("job_id")
            if not isinstance(job_id, int) or isinstance(job_id, bool) or job_id < 0:
                raise ColocError("bad request: job_id must be a non-negative integer")
            return advise(cfg, job_id, views.current_viewer(cfg, uid=uid))
        q = query_from_json(request)
        got = collect(cfg, q, views.current_viewer(cfg, uid=uid))
    except ColocError as exc:
        return {"ok": False, "error": exc.one_line(), "exit_code": exc.exit_code}
    except Exception as exc:  # sqlite errors of a damaged file: one line back, the service goes on
        return {"ok": False, "error": " ".join(f"{type(exc).__name__}: {exc}".split()), "exit_code": 1}
    return {"ok": True, "view": q.view, "rows": got.rows, "problems": got.report.problems,
            "jobs": [j.to_json() for j in got.jobs] if q.view == "jobs" else []}


_JOB_FIELDS = {f.name for f in fields(JobView)}


def jobs_from_json(items: Sequence[Mapping[str, Any]]) -> List[JobView]:
    """``JobView``s back from ``answer``'s ``jobs`` (unknown keys dropped); ColocError: a field missing."""
    try:
        return [JobView(**{k: v for k, v in item.items() if k in _JOB_FIELDS}) for item in items]
    except TypeError as exc:
        raise ColocError(f"the reader's answer has a malformed job: {exc}") from None
