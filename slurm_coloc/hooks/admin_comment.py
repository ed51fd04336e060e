"""The job-end summary in AdminComment (the jobstats convention), written by EpilogSlurmctld.

EpilogSlurmctld only records: the measured figures are computed by the node Epilog (hooks/figures.py, stored
in the node database's ``job_figures``); here they are read, completed with the controller's OOM record (or,
when no node stored figures within the wait, with what was asked and estimated and ``measured`` false) and
written.

Format: one line of compact JSON, ``{"coloc":1, ...}``; keys (units in docs/report.md): ``est_mib`` estimate,
``method``, ``mode`` share mode, ``shards``, ``req_mib`` memory reserved, ``peak_mib`` measured peak,
``err_pct`` (estimate - peak) / peak, ``util`` coarse utilization %, ``smact``/``smact_p95``,
``smocc``/``smocc_p95`` SM activity/occupancy %, ``kwh``, ``gpu_h``, ``oom``, ``retry`` (retry job id),
``watchdog`` (why the sampler's watchdog stopped the job, in words), ``measured`` (false: the node summary was
not there yet or no samples). Measured facts only: findings and advice are ``coloc-report``'s, computed as the
user who asks. Absent keys were not recorded. Kept under ``MAX_CHARS``.

Other tools write AdminComment too (jobstats: ``JS1:<base64 gzip JSON>``). ``merge_admin_comment`` never drops
their text (config ``admin_comment``): ``merge`` keeps it and puts ours after it, separated by one space (our
part is everything from its ``{"coloc":`` on, replaced on every write); a field starting with ``JS1:`` is left
as it is, because jobstats decodes the whole field after the prefix; ``if-empty`` writes only into an empty
field or one holding only ours; ``off`` never writes. Two writers at the same moment can still lose one
update: the field is read just before it is written, there is no lock in Slurm.
"""
from __future__ import annotations

import json
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

from slurm_coloc.config import Config
from slurm_coloc.errors import SlurmError
from slurm_coloc.slurm import jobs as slurm_jobs
from slurm_coloc.slurm.jobinfo import JobInfo
from slurm_coloc.slurm.parse import expand_hostlist
from slurm_coloc.slurm.run import slurm_env
from slurm_coloc.store import jobs as store_jobs
from slurm_coloc.store import oom as store_oom
from slurm_coloc.store import report_queries as rq
from slurm_coloc.store import summaries as store_summaries
from slurm_coloc.store.db import open_ctld_db
from slurm_coloc.units import shards_to_mib

MAX_CHARS = 1000
OUR_MARK = '{"coloc":'  # our part of AdminComment starts here (the start note and the end summary)
WHOLE_FIELD_PREFIXES = ("JS1:",)  # formats their readers decode as the whole field: never appended to
KEYS = ("coloc", "est_mib", "method", "mode", "shards", "req_mib", "peak_mib", "err_pct", "util", "smact",
        "smact_p95",
        "smocc", "smocc_p95", "kwh", "gpu_h", "oom", "retry", "watchdog", "measured")
"""The AdminComment keys, in the order they are written (module docstring)."""


def _nodes(node_list: str) -> List[str]:
    try:
        return expand_hostlist(node_list)
    except SlurmError:
        return []


def node_figures(cfg: Config, job_id: int, node_list: str) -> Optional[Dict[str, Any]]:
    """The latest summary figures the node Epilogs stored for the job (hooks/figures.py); None when none yet.

    Read from every node database of ``node_list`` (Slurm hostlist; a node without one is skipped); the latest
    saw the most nodes' summaries.

    Raises:
        StoreError: a node database that exists but cannot be read (``write_admin_comment`` catches it).
    """
    found: List[Tuple[float, Dict[str, Any]]] = []
    for node in _nodes(node_list):
        path = cfg.node_db_path(node)
        if path.exists():
            got = store_summaries.load_figures(rq.open_for_report(path), job_id)
            if got is not None:
                found.append(got)
    return max(found, key=lambda f: f[0])[1] if found else None


def compose(row: Mapping[str, Any], figures: Optional[Mapping[str, Any]],
            oom: Optional[Any]) -> Dict[str, Any]:
    """The AdminComment dict (MiB), in ``KEYS`` order, None values left out (pure, never raises).

    The node's figures (``figures["summary"]``) with what only the controller knows when its Epilog runs: the
    OOM and its rerun (``oom``: ``store.oom`` record or None). Without figures: what was asked and estimated
    (controller ``row``: ``shards_req``, ``estimate_mib``, ``estimate_method``, ``share_mode``) and
    ``measured`` false.
    """
    if figures is not None and isinstance(figures.get("summary"), dict):
        d: Dict[str, Any] = dict(figures["summary"])
    else:
        shards = row.get("shards_req")
        d = {"coloc": 1, "est_mib": row.get("estimate_mib"),
             "method": (row.get("estimate_method") or "").replace(" ", "_") or None,
             "mode": row.get("share_mode"),
             "shards": shards, "req_mib": shards_to_mib(shards) if shards else None, "measured": False}
        figures = None
    if oom is not None:
        d.update(oom=True, retry=oom.retry_job_id)
    return {k: d[k] for k in KEYS if d.get(k) is not None}


def build(cfg: Config, job_id: int, wait_s: float = 3.0) -> Optional[str]:
    """The AdminComment text of ``job_id`` (compact JSON, about ``MAX_CHARS`` at most); None: job unknown.

    Waits up to ``wait_s`` seconds for the node Epilog's figures (it runs alongside EpilogSlurmctld), then
    records what exists; past ``MAX_CHARS`` the watchdog's words are dropped. Reads only the controller's row
    and OOM record and the figures rows (no report pipeline here).

    Raises:
        StoreError: a database that cannot be read (``write_admin_comment`` catches it).
    """
    ctld = rq.open_for_report(cfg.ctld_db_path)
    row = rq.load_job_row(ctld, job_id)
    if not row:
        return None
    deadline = time.monotonic() + wait_s
    while True:
        figures = node_figures(cfg, job_id, str(row.get("node_list") or ""))
        if figures is not None or time.monotonic() >= deadline:
            break
        time.sleep(0.25)
    d = compose(row, figures, store_oom.load_oom_event(ctld, job_id))
    text = json.dumps(d, separators=(",", ":"))
    if len(text) > MAX_CHARS:  # only the watchdog's words can grow: drop them
        d.pop("watchdog", None)
        text = json.dumps(d, separators=(",", ":"))
    return text


def merge_admin_comment(existing: str, ours: str, mode: str) -> Optional[str]:
    """The AdminComment that keeps every other tool's text in ``existing`` and holds ``ours``.

    Pure, never raises. None: write nothing (``mode`` ``off``, a ``JS1:`` field, or ``if-empty`` with foreign
    text); modes as in the module docstring; ``existing`` None counts as "".
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
    """Build and store the job's AdminComment; ``{"ok": bool, ...}`` for the hook log.

    ``scontrol update`` first (works while slurmctld counts the job unfinished); on ``Job has already
    finished`` (22.05 in EpilogSlurmctld), ``sacctmgr`` into slurmdbd (the jobstats way, ``sacct -o
    AdminComment``). Both name the job as ``job.slurm_ref`` (``<array_job_id>_<array_task_id>`` for an array
    task, so one task's summary never lands on its siblings). The text is also recorded as an
    ``admin-comment`` event in the controller database. What is there is kept (``merge_admin_comment``): the
    field is read from slurmctld (``job.admin_comment``) and, before ``sacctmgr``, from slurmdbd.
    ``hook_timeout_s``/5, at most 3-5 s, bounds each step; scontrol and sacctmgr run with ``env``.

    Never raises (EpilogSlurmctld): every error is returned as ``error``.
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
                acct = (slurm_jobs.admin_comment_accounting(job.slurm_ref, cfg.slurm_bin_dir, senv,
                                                            timeout_s=limit))
                merged = merge_admin_comment(acct or job.admin_comment, text, cfg.admin_comment)
                if merged is None:
                    raise SlurmError(f"left as it is (admin_comment: {cfg.admin_comment})")
                slurm_jobs.set_admin_comment_accounting(job.slurm_ref, merged, cfg.slurm_bin_dir, senv,
                                                        timeout_s=limit)
                result.update(ok=True, via="sacctmgr")
            except SlurmError as exc2:
                result.update(ok=False, via="ctld.db only", sacctmgr=exc2.one_line()[:200])
        store_jobs.record_event(open_ctld_db(cfg.ctld_db_path, cfg.db_busy_timeout_s), job.job_id,
                                "admin-comment",
                                {"text": text, "job": job.slurm_ref,
                                 "via": result["via"] if result.get("ok") else "ctld.db only"})
        return result
    except Exception as exc:  # a hook must never fail because of this summary
        return {"ok": False, "error": " ".join(f"{type(exc).__name__}: {exc}".split())[:300]}
