"""The job-end summary in AdminComment (the jobstats convention), written by EpilogSlurmctld.

Format: one line of compact JSON, ``{"coloc":1, ...}``; keys (units in docs/report.md): ``est_mib`` estimate,
``method``, ``mode`` share mode, ``shards``, ``req_mib`` memory reserved, ``peak_mib`` measured peak,
``err_pct`` (estimate - peak) / peak, ``util`` coarse utilization %, ``smact``/``smact_p95``,
``smocc``/``smocc_p95`` SM activity/occupancy %, ``kwh``, ``gpu_h``, ``oom``, ``retry`` (retry job id),
``watchdog`` (why the sampler's watchdog stopped the job, in words), ``waste`` (codes ``low-smact``,
``unused-mem``), ``finding`` (the top finding of report/diagnose.py: ``input-bound``, ``no-tensor-cores``,
``low-occupancy``, ``over-request``), ``measured`` (false: the node summary was not there yet or no samples).
Absent keys were not recorded. Kept under ``MAX_CHARS``.

Other tools write AdminComment too (jobstats: ``JS1:<base64 gzip JSON>``). ``merge_admin_comment`` never drops
their text (config ``admin_comment``): ``merge`` keeps it and puts ours after it, separated by one space (our
part is everything from its ``{"coloc":`` on, replaced on every write); a field starting with ``JS1:`` is left
as it is, because jobstats decodes the whole field after the prefix; ``if-empty`` writes only into an empty
field or one holding only ours; ``off`` never writes. Two writers at the same moment can still lose one update:
the field is read just before it is written, there is no lock in Slurm.
"""
from __future__ import annotations

import json
import time
from typing import Any, Dict, List, Mapping, Optional

from slurm_coloc.config import Config
from slurm_coloc.errors import SlurmError
from slurm_coloc.report.summarize import JobView, Report, add_usage, spec_fields
from slurm_coloc.report.views import add_findings, flag_waste
from slurm_coloc.slurm import jobs as slurm_jobs
from slurm_coloc.slurm.jobinfo import JobInfo
from slurm_coloc.slurm.parse import expand_hostlist
from slurm_coloc.slurm.run import slurm_env
from slurm_coloc.store import jobs as store_jobs
from slurm_coloc.store import oom as store_oom
from slurm_coloc.store import report_queries as rq
from slurm_coloc.store import samples as store_samples
from slurm_coloc.store.db import open_ctld_db

MAX_CHARS = 1000
OUR_MARK = '{"coloc":'  # our part of AdminComment starts here (the start note and the end summary)
WHOLE_FIELD_PREFIXES = ("JS1:",)  # formats their readers decode as the whole field: never appended to
WASTE_CODES = {"low SM activity": "low-smact", "memory far below request": "unused-mem"}  # no spaces: scontrol -o


def _nodes(node_list: str) -> List[str]:
    """The node names of a recorded Slurm host list (``gpu[01-02]`` -> gpu01 gpu02); [] when unreadable."""
    try:
        return expand_hostlist(node_list)
    except SlurmError:
        return []


def _job_view(cfg: Config, job_id: int) -> "tuple[Optional[JobView], Report]":
    """The job's report view from the controller row and every node database of its node list."""
    report = Report()
    ctld = rq.open_for_report(cfg.ctld_db_path)
    row = rq.load_job_row(ctld, job_id) or {}
    o = store_oom.load_oom_event(ctld, job_id)
    if o is not None:
        report.oom_by_job[job_id] = o
    runs = []
    for node in _nodes(str(row.get("node_list") or "")):
        path = cfg.node_db_path(node)
        if not path.exists():
            continue
        db = rq.open_for_report(path)
        report.node_dbs[node] = db
        report.node_paths[node] = str(path)
        runs.extend(rq.load_job_run_rows(db, job_id))
        report.summaries.setdefault(job_id, []).extend(store_samples.load_summaries(db, job_id))
    if not row and not runs:
        return None, report
    def times(key: str) -> List[float]:
        return [float(t) for t in [r.get(key) for r in runs] + [row.get(key)] if isinstance(t, (int, float)) and t]

    starts, ends = times("start_ts"), times("end_ts")
    view = JobView(
        job_id=job_id, user=row.get("user_name"), name=row.get("job_name"),  # type: ignore[arg-type]
        nodes=",".join(str(r["node"]) for r in runs), gpus=";".join(f"{r['node']}:{r['gpus']}" for r in runs
                                                                    if r.get("gpus")),
        shards=row.get("shards_req"), share_mode=row.get("share_mode"),  # type: ignore[arg-type]
        estimate_mib=row.get("estimate_mib"), estimate_method=row.get("estimate_method"),  # type: ignore[arg-type]
        state=row.get("state"), exit_code=row.get("exit_code"), signal=row.get("signal"),  # type: ignore[arg-type]
        start_ts=min(starts) if starts else None, end_ts=max(ends) if ends else None,
        **spec_fields(row.get("spec_json")))  # type: ignore[arg-type]
    return view, report


def _int(x: Optional[float]) -> Optional[int]:
    return None if x is None else int(round(x))


def summary_dict(view: JobView) -> Dict[str, Any]:
    """The compact AdminComment dict of a job view (None values left out, floats rounded)."""
    def r(x: Optional[float], nd: int = 1) -> Optional[float]:
        return None if x is None else round(float(x), nd)

    d: Dict[str, Any] = {
        "coloc": 1, "est_mib": view.estimate_mib, "method": (view.estimate_method or "").replace(" ", "_") or None,
        "mode": view.share_mode,
        "shards": view.shards, "req_mib": _int(view.requested_mib), "peak_mib": _int(view.peak_mem_mib),
        "err_pct": r(view.estimate_error_pct), "util": r(view.util_mean), "smact": r(view.smact_mean),
        "smact_p95": r(view.smact_p95), "smocc": r(view.smocc_mean), "smocc_p95": r(view.smocc_p95),
        "kwh": r(view.energy_kwh, 5), "gpu_h": r(view.gpu_hours, 6), "oom": view.oom or None,
        "retry": view.retry_job_id, "watchdog": view.watchdog,
        "measured": view.peak_mem_mib is not None or view.smact_mean is not None,
        "waste": [WASTE_CODES.get(w.split(":")[0], "other") for w in view.waste] or None,
        "finding": view.findings[0]["name"] if view.findings else None}
    return {k: v for k, v in d.items() if v is not None}


def build(cfg: Config, job_id: int, wait_s: float = 3.0) -> Optional[str]:
    """The AdminComment text of ``job_id``: waits up to ``wait_s`` for the node Epilog's summary (the node
    Epilog and EpilogSlurmctld run at the same time), then summarises what exists. None: job unknown."""
    deadline = time.monotonic() + wait_s
    while True:
        view, report = _job_view(cfg, job_id)
        if view is None or report.summaries.get(job_id) or time.monotonic() >= deadline:
            break
        time.sleep(0.25)
    if view is None:
        return None
    full = add_findings(flag_waste(add_usage(view, report, cfg), cfg), cfg)
    d = summary_dict(full)
    text = json.dumps(d, separators=(",", ":"))
    if len(text) > MAX_CHARS:  # long job names cannot get here; only the waste list can grow: drop it
        d.pop("waste", None)
        text = json.dumps(d, separators=(",", ":"))
    return text


def merge_admin_comment(existing: str, ours: str, mode: str) -> Optional[str]:
    """The AdminComment to write so that ``existing`` (the field now) keeps every other tool's text and holds
    ``ours``; None: write nothing (``mode`` ``off``, a ``JS1:`` field, or ``if-empty`` with foreign text).

    ``mode`` is the config's ``admin_comment`` (``merge``, ``if-empty``, ``off``); see the module docstring.
    """
    current = (existing or "").strip()
    at = current.find(OUR_MARK)
    foreign = (current[:at] if at >= 0 else current).rstrip()
    if mode == "off" or current.startswith(WHOLE_FIELD_PREFIXES):
        return None
    if not foreign:
        return ours
    if mode == "if-empty":
        return None
    return f"{foreign} {ours}"


def write_admin_comment(job: JobInfo, cfg: Config, env: Mapping[str, str]) -> Dict[str, Any]:
    """Build and store the job's AdminComment. Never raises (EpilogSlurmctld): returns ``{"ok": bool, ...}`` for
    the hook log.

    Where it goes: ``scontrol update`` first (works while slurmctld still counts the job as unfinished); when
    slurmctld answers ``Job has already finished`` (22.05 in EpilogSlurmctld), ``sacctmgr`` into slurmdbd (the
    jobstats way, shown by ``sacct -o AdminComment``). Both name the job as ``job.slurm_ref``
    (``<array_job_id>_<array_task_id>`` for an array task, so one task's summary never lands on its siblings).
    The text is also recorded as an ``admin-comment`` event in the controller database, so it exists even on a
    cluster with neither. What is there already is kept (``merge_admin_comment``, config ``admin_comment``): the
    field is read from slurmctld (``job.admin_comment``) and, before ``sacctmgr``, from slurmdbd.
    """
    try:
        text = build(cfg, job.job_id, wait_s=min(3.0, cfg.hook_timeout_s / 5))
        if text is None:
            return {"ok": False, "error": f"job {job.job_id} not recorded"}
        senv = slurm_env(base=dict(env))
        limit = min(5.0, cfg.hook_timeout_s / 5)
        result: Dict[str, Any] = {"chars": len(text), "job": job.slurm_ref}
        merged = merge_admin_comment(job.admin_comment, text, cfg.admin_comment)
        try:
            if merged is None:
                raise SlurmError(f"left as it is (admin_comment: {cfg.admin_comment}; the field holds "
                                 f"{(job.admin_comment or '')[:20]!r}...)")
            slurm_jobs.set_admin_comment(job.slurm_ref, merged, cfg.slurm_bin_dir, senv, timeout_s=limit)
            result.update(ok=True, via="scontrol")
        except SlurmError as exc:
            result["scontrol"] = exc.one_line()[:200]
            try:
                acct = slurm_jobs.admin_comment_accounting(job.slurm_ref, cfg.slurm_bin_dir, senv, timeout_s=limit)
                merged = merge_admin_comment(acct or job.admin_comment, text, cfg.admin_comment)
                if merged is None:
                    raise SlurmError(f"left as it is (admin_comment: {cfg.admin_comment})")
                slurm_jobs.set_admin_comment_accounting(job.slurm_ref, merged, cfg.slurm_bin_dir, senv,
                                                        timeout_s=limit)
                result.update(ok=True, via="sacctmgr")
            except SlurmError as exc2:
                result.update(ok=False, via="ctld.db only", sacctmgr=exc2.one_line()[:200])
        store_jobs.record_event(open_ctld_db(cfg.ctld_db_path, cfg.db_busy_timeout_s), job.job_id, "admin-comment",
                                {"text": text, "job": job.slurm_ref,
                                 "via": result["via"] if result.get("ok") else "ctld.db only"})
        return result
    except Exception as exc:  # noqa: BLE001 - a hook must never fail because of this summary
        return {"ok": False, "error": " ".join(f"{type(exc).__name__}: {exc}".split())[:300]}
