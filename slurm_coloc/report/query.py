"""One coloc-report question and its answer, the same for a direct read and for the reader service.

``collect`` computes a view's rows from the databases for a ``Viewer``; ``answer`` is what the reader service
(``report/reader.py``, run by root) does with a request from a peer whose uid the kernel gave it: the request
only filters, the viewer always comes from that uid, so a user never gets another user's job names, script
SHA-256s or any other row of theirs. Pure data: no click, no rich, no sockets.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from slurm_coloc.config import Config
from slurm_coloc.errors import ColocError
from slurm_coloc.report import findings, views
from slurm_coloc.report.series import job_series
from slurm_coloc.report.summarize import JobView, Report, load_report
from slurm_coloc.report.timespec import parse_window
from slurm_coloc.report.usage import add_usage

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
        """The request body the reader service takes (``from_json`` reads it back)."""
        return {"view": self.view, "since": self.since, "until": self.until, "users": list(self.users),
                "nodes": list(self.nodes), "job_ids": list(self.job_ids), "sort_key": self.sort_key,
                "desc": self.desc}


def _text(data: Mapping[str, Any], key: str) -> Optional[str]:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_TEXT_CHARS:
        raise ColocError(f"bad request: {key} must be text of at most {MAX_TEXT_CHARS} characters")
    return value


def _items(data: Mapping[str, Any], key: str, kind: type) -> Tuple[Any, ...]:
    value = data.get(key) or []
    if not isinstance(value, list) or len(value) > MAX_LIST_ITEMS:
        raise ColocError(f"bad request: {key} must be a list of at most {MAX_LIST_ITEMS} items")
    for item in value:
        if not isinstance(item, kind) or isinstance(item, bool) or (
                isinstance(item, str) and len(item) > MAX_TEXT_CHARS):
            raise ColocError(f"bad request: every item of {key} must be a {kind.__name__}")
    return tuple(value)


def query_from_json(data: Any) -> Query:
    """A ``Query`` from a request body (untrusted JSON, of any type).

    Raises:
        ColocError: not an object, an unknown view, or a field of the wrong type or size.
    """
    if not isinstance(data, dict):
        raise ColocError("bad request: expected a JSON object")
    view = data.get("view", "jobs")
    if view not in VIEWS:
        raise ColocError(f"bad request: unknown view {view!r}", hint=f"views: {', '.join(VIEWS)}")
    return Query(view=view, since=_text(data, "since"), until=_text(data, "until"),
                 users=_items(data, "users", str), nodes=_items(data, "nodes", str),
                 job_ids=_items(data, "job_ids", int), sort_key=_text(data, "sort_key"),
                 desc=bool(data.get("desc", False)))


def collect(cfg: Config, q: Query, viewer: views.Viewer,
            now: Optional[float] = None) -> Tuple[Report, List[JobView], List[Dict[str, object]]]:
    """(the report with its problems, the selected jobs, ``q.view``'s rows sorted by ``q.sort_key``) as
    ``viewer`` may see them; ``now`` (Unix s, default the clock) anchors relative times and running jobs'
    ends.

    Raises:
        ColocError: a bad time spec, an end before the start, or a sort column the view does not have.
    """
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
    return report, jobs, rows


def _history(cfg: Config, request: Mapping[str, Any], uid: int) -> Dict[str, Any]:
    """``{"ok": true, "history_mib": [...]}``: ``store.summaries.script_history_mib`` for the request's script
    SHA-256 and the asking process's ``uid`` (the kernel's, never a request field): MiB figures of that user's
    own runs only, no job id, name or user.
    """
    from slurm_coloc.store.summaries import script_history_mib

    sha = request.get("sha256")
    if not isinstance(sha, str) or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise ColocError("bad request: sha256 must be 64 lower-case hex digits")
    return {"ok": True, "history_mib": [int(v) for v in script_history_mib(cfg, sha, uid=uid)]}


def advise(cfg: Config, job_id: int, viewer: views.Viewer, now: Optional[float] = None) -> Dict[str, Any]:
    """``coloc-report advise``'s data for one job ``viewer`` may see: ``{"ok": true, "job": JobView JSON with
    its findings, "series": its samples, "notes": what a rule could not judge, "problems"}``; ``now`` (Unix s)
    ends a running job.

    Raises:
        ColocError: the job is not recorded, or is another user's and ``viewer`` does not see all jobs.
    """
    from slurm_coloc.report import diagnose

    now = time.time() if now is None else now
    report = load_report(cfg)
    job = next((j for j in report.jobs if j.job_id == job_id), None)
    if job is None or not (viewer.sees_all or job.user == viewer.name):
        whose = "" if viewer.sees_all else f" as one of {viewer.name}'s"
        raise ColocError(f"job {job_id} is not recorded" + whose,
                         hint="coloc-report jobs --since 30d lists the jobs you can see")
    job = findings.flag_waste(add_usage(job, report, cfg, None), cfg)
    series = job_series(report, job, now)
    job = findings.add_findings(job, cfg, series)
    notes = list(diagnose.diagnose(job, cfg, series).notes)
    return {"ok": True, "job": job.to_json(), "series": series, "notes": notes, "problems": report.problems}


def answer(cfg: Config, request: Any, uid: int) -> Dict[str, Any]:
    """The reader service's answer to ``request`` (untrusted JSON) from the process of ``uid``
    (``SO_PEERCRED``).

    ``{"op": "history", "sha256": ...}`` asks for the estimator's history of a script (coloc-sbatch, whose
    user cannot read the databases); ``{"op": "advise", "job_id": N}`` one job's findings and samples, only
    for the caller's own jobs unless the caller sees all; any other request is a report ``Query``. Answer:
    ``{"ok": true, "view", "rows", "problems", "jobs"}`` (``jobs`` as ``JobView.to_json``) or ``{"ok": false,
    "error": <one line>, "exit_code": n}``. Never raises: any error (a damaged database too) becomes ``ok:
    false``.
    """
    try:
        if isinstance(request, dict) and request.get("op") == "history":
            return _history(cfg, request, uid)
        if isinstance(request, dict) and request.get("op") == "advise":
            job_id = request.get("job_id")
            if not isinstance(job_id, int) or isinstance(job_id, bool) or job_id < 0:
                raise ColocError("bad request: job_id must be a non-negative integer")
            return advise(cfg, job_id, views.current_viewer(cfg, uid=uid))
        q = query_from_json(request)
        report, jobs, rows = collect(cfg, q, views.current_viewer(cfg, uid=uid))
    except ColocError as exc:
        return {"ok": False, "error": exc.one_line(), "exit_code": exc.exit_code}
    except Exception as exc:  # sqlite errors of a damaged file: one line back, the service goes on
        return {"ok": False, "error": " ".join(f"{type(exc).__name__}: {exc}".split()), "exit_code": 1}
    return {"ok": True, "view": q.view, "rows": rows, "problems": report.problems,
            "jobs": [j.to_json() for j in jobs] if q.view == "jobs" else []}


_JOB_FIELDS = {f.name for f in fields(JobView)}


def jobs_from_json(items: Sequence[Mapping[str, Any]]) -> List[JobView]:
    """``JobView``s back from ``answer``'s ``jobs`` (unknown keys such as ``runtime_s`` dropped).

    Raises:
        ColocError: an item lacks a required field.
    """
    try:
        return [JobView(**{k: v for k, v in item.items() if k in _JOB_FIELDS}) for item in items]
    except TypeError as exc:
        raise ColocError(f"the reader's answer has a malformed job: {exc}") from None
