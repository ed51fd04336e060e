"""PrologSlurmctld and EpilogSlurmctld: record what a job asked for, its estimate and how it ended in the
controller database, and write the job's AdminComment. Run as root by slurmctld; read only Slurm's view of the
job (never the user's files or code). Root computes the script's identity (``script_sha256`` of the batch
script Slurm stored, ``scontrol write batch_script``; with the job's uid it keys the estimator's history) and
the final state (hooks/context.py). Each controller hook also settles earlier records from the job list it
reads anyway (``settle``): inferred final states and ends of OOM reruns (a rerun cancelled while pending has
no epilog). AdminComment (the jobstats convention): the figures the node Epilog stored (hooks/figures.py,
``job_figures``) completed with the OOM record (else what was asked and estimated, ``measured`` false), as one
line of compact JSON ``{"coloc":1, ...}`` under ``MAX_CHARS``; keys and units in docs/report.md. Measured
facts only: findings are ``coloc-report``'s, computed as the user who asks. ``merge_admin_comment`` never
drops other tools' text (config ``admin_comment``): ``merge`` puts ours after theirs (ours: from ``{"coloc":``
on, replaced each write); a ``JS1:`` field is left as it is (jobstats decodes the whole field); ``if-empty``
writes only into an empty field or one holding only ours; ``off`` never writes. Two writers at once can still
lose one update (no lock in Slurm)."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from sqlite_utils import Database

from slurm_coloc.comment import JobComment
from slurm_coloc.config import Config
from slurm_coloc.errors import ColocError, SlurmError
from slurm_coloc.hooks import oom
from slurm_coloc.hooks.context import HookContext, final_state
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
        "smact_p95", "smocc", "smocc_p95", "kwh", "gpu_h", "oom", "retry", "watchdog", "measured")
"""The AdminComment keys, in the order they are written (module docstring)."""


def _nodes(node_list: str) -> List[str]:
    """The node names of a recorded Slurm host list (``gpu[01-02]`` -> gpu01 gpu02); [] when unreadable."""
    try:
        return expand_hostlist(node_list)
    except SlurmError:
        return []


def node_figures(cfg: Config, job_id: int, node_list: str) -> Optional[Dict[str, Any]]:
    """The latest summary figures the node Epilogs stored for the job (hooks/figures.py); None when none yet.
    Read from every node database of ``node_list`` (Slurm hostlist; a node without one is skipped); the latest
    saw the most nodes' summaries. Raises StoreError (a node database that exists but cannot be read
    (``write_admin_comment`` catches it))."""
    found: List[Tuple[float, Dict[str, Any]]] = []
    for node in _nodes(node_list):
        path = cfg.node_db_path(node)
        if path.exists():
            got = store_summaries.load_figures(rq.open_for_report(path), job_id)
            if got is not None:
                found.append(got)
    return max(found, key=lambda f: f[0])[1] if found else None


def compose(row: Mapping[str, Any], figures: Optional[Mapping[str, Any]],
            oom: Optional[store_oom.OomRecord]) -> Dict[str, Any]:
    """The AdminComment dict (MiB), in ``KEYS`` order, None values left out (pure, never raises). The node's
    figures (``figures["summary"]``) with what only the controller knows when its Epilog runs: the OOM and its
    rerun (``oom``: ``store.oom`` record or None). Without figures: what was asked and estimated (controller
    ``row``: ``shards_req``, ``estimate_mib``, ``estimate_method``, ``share_mode``) and ``measured`` false."""
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
    Waits up to ``wait_s`` s for the node Epilog's figures, then records what exists; past ``MAX_CHARS`` the
    watchdog's words are dropped. Raises StoreError (``write_admin_comment`` catches it)."""
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
    """The AdminComment that keeps every other tool's text in ``existing`` and holds ``ours``. Pure, never
    raises. None: write nothing (``mode`` ``off``, a ``JS1:`` field, or ``if-empty`` with foreign text); modes
    as in the module docstring; ``existing`` None counts as ""."""
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
    """Build and store the job's AdminComment; ``{"ok": bool, ...}`` for the hook log. ``scontrol update``
    first (works while slurmctld counts the job unfinished); on ``Job has already finished`` (22.05 in
    EpilogSlurmctld), ``sacctmgr`` into slurmdbd (the jobstats way, ``sacct -o AdminComment``). Both name the
    job as ``job.slurm_ref`` (``<array_job_id>_<array_task_id>`` for an array task, so one task's summary
    never lands on its siblings). The text is also recorded as an ``admin-comment`` event in the controller
    database. What is there is kept (``merge_admin_comment``): the field is read from slurmctld
    (``job.admin_comment``) and, before ``sacctmgr``, from slurmdbd. ``hook_timeout_s``/5, at most 3-5 s,
    bounds each step; scontrol and sacctmgr run with ``env``. Never raises (EpilogSlurmctld): every error is
    returned as ``error``."""

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


log = logging.getLogger(__name__)
# The line prefix submit/plan.py ``_rewrite`` gives a GPU ``#SBATCH`` line it moved to the command line (in
# place of its leading ``#`` characters); ``script_identity`` restores one ``#`` so the hash is that of the
# user's own file.
REWRITE_PREFIX = b"# coloc-sbatch moved this GPU request to the command line: "
MAX_SCRIPT_BYTES = 4 << 20


def script_identity(raw: bytes) -> str:
    """Hex SHA-256 of a batch script as the user wrote it (pure, never raises). ``raw`` (what Slurm stored)
    with coloc-sbatch's rewritten GPU lines restored, so it equals ``submit.directives.ParsedScript.sha256``
    of the user's file."""
    lines = raw.splitlines(keepends=True)
    fixed = [b"#" + ln[len(REWRITE_PREFIX):] if ln.startswith(REWRITE_PREFIX) else ln for ln in lines]
    return hashlib.sha256(b"".join(fixed)).hexdigest()


def stored_script_sha256(job_id: int, cfg: Config, senv: Dict[str, str]) -> Tuple[Optional[str], str]:
    """``(script_identity, "ok")`` of the batch script slurmctld holds for ``job_id``, or ``(None, why)``.
    Written by ``scontrol write batch_script`` into a root-only directory under ``run_dir``, removed at once;
    ``hook_timeout_s``/4 bounds scontrol. None: not a batch job, scontrol failing, a directory that is not
    private, a script over ``MAX_SCRIPT_BYTES``; never raises ``ColocError`` or ``OSError``."""
    work = Path(cfg.run_dir) / "scripts"
    path = work / f"{int(job_id)}.sh"
    try:
        work.mkdir(parents=True, mode=0o700, exist_ok=True)
        st = os.lstat(work)
        if work.is_symlink() or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            return None, f"{work} is not a private directory of this hook's user"
        path.unlink(missing_ok=True)
        slurm_jobs.write_batch_script(job_id, str(path), cfg.slurm_bin_dir, senv,
                                      timeout_s=cfg.hook_timeout_s / 4)
        with open(path, "rb") as fh:
            raw = fh.read(MAX_SCRIPT_BYTES + 1)
        if len(raw) > MAX_SCRIPT_BYTES:
            return None, f"batch script over {MAX_SCRIPT_BYTES} bytes"
        return script_identity(raw), "ok"
    except (ColocError, OSError) as exc:
        return None, exc.one_line() if isinstance(exc, ColocError) else str(exc)
    finally:
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass


def _pick(jobs: Sequence[JobInfo], job_id: int) -> JobInfo:
    for info in jobs:
        if info.job_id == int(job_id):
            return info
    raise SlurmError(f"slurmctld does not know job {int(job_id)}")


def settle(db: Database, jobs: Sequence[JobInfo]) -> Dict[str, List[int]]:
    """Replace inferred final states by Slurm's own and record OOM reruns' ends, from slurmctld's job list. A
    job slurmctld no longer knows keeps its inference. Returns ``{"settled": [job ids], "reruns": [job
    ids]}``. Never raises (errors are logged; what was done before the error is kept)."""
    by_id = {j.job_id: j for j in jobs}
    out: Dict[str, List[int]] = {"settled": [], "reruns": []}
    try:
        for job_id in store_jobs.inferred_job_ids(db):
            info = by_id.get(job_id)
            if info is None:
                store_jobs.settle_state(db, job_id, None)
            elif info.final:
                store_jobs.settle_state(db, job_id, info.state)
                out["settled"].append(job_id)
        out["reruns"] = oom.record_rerun_ends(db, jobs)
    except Exception as exc:  # settling earlier records never fails this job's hook
        log.warning("cannot settle earlier records: %s", exc)
    return out


def share_mode_of(tres: Dict[str, int], cfg: Config) -> str:
    """``shard`` / ``whole-gpu`` (all shards of one GPU) / ``gpu`` / ``none`` from a job's GRES counts. Pure,
    never raises. ``tres``: ``{"shard": 8}``; a shard is 1 GiB, ``cfg.gpu_mem_gib`` of them a whole GPU."""
    if "shard" in tres:
        return "whole-gpu" if tres["shard"] >= cfg.gpu_mem_gib else "shard"
    return "gpu" if "gpu" in tres else "none"


def coloc_record(coloc: JobComment) -> Tuple[Optional[str], Optional[str]]:
    """``(coloc_json, spec_json)`` root records: sorted-key JSON of a validated comment's fields, spec. Pure,
    never raises. None where the comment (an unannotated job) or the spec has no field."""
    data, spec = coloc.to_json(), coloc.spec.to_json() if coloc.spec is not None else None
    return (json.dumps(data, sort_keys=True) if data else None,
            json.dumps(spec, sort_keys=True) if spec else None)


def prolog_slurmctld(ctx: HookContext, cfg: Config, env: Dict[str, str]) -> Dict[str, Any]:
    """Record the job's request and estimate (``jobs`` row); the hook log's detail. GRES and submit time from
    slurmctld's record, name, user, partition and comment from the environment (opaque values). Raises
    SlurmError, StoreError (hooks/runner.py logs every error and exits 0)."""
    senv = slurm_env(base=env)
    jobs = slurm_jobs.squeue_all(cfg.slurm_bin_dir, senv, timeout_s=cfg.hook_timeout_s / 3)
    job = _pick(jobs, ctx.job)
    sha, sha_note = stored_script_sha256(ctx.job, cfg, senv)
    coloc = JobComment.read(ctx.comment, ctx.job)
    coloc_json, spec_json = coloc_record(coloc)
    sub = store_jobs.JobSubmission(
        job_id=ctx.job, user_name=ctx.user_name, uid=job.uid if job.uid is not None else ctx.uid,
        job_name=ctx.job_name, partition=ctx.partition, cluster=env.get("SLURM_CLUSTER_NAME", ""),
        submit_ts=job.submit_ts, gres_req=job.tres_per_node,
        shards_req=job.gres.get("shard"), gpus_req=job.gres.get("gpu"),
        share_mode=share_mode_of(job.gres, cfg), estimate_mib=coloc.mem_mib, estimate_method=coloc.method,
        script_sha256=sha, spec_json=spec_json, coloc_json=coloc_json,
    )
    db = open_ctld_db(cfg.ctld_db_path, cfg.db_busy_timeout_s)
    store_jobs.record_submission(db, sub)
    detail: Dict[str, Any] = {"share_mode": sub.share_mode, "shards": sub.shards_req,
                              "estimate_mib": sub.estimate_mib, "script_sha256": sha_note}
    detail.update({k: v for k, v in settle(db, jobs).items() if v})
    # A provisional AdminComment while slurmctld still accepts updates (it refuses them once the job has
    # ended, i.e. in EpilogSlurmctld without slurmdbd): what was asked and estimated.
    start_note = {"coloc": {"mode": sub.share_mode, "shards": sub.shards_req, "est_mib": sub.estimate_mib,
                            "method": sub.estimate_method}}
    note = merge_admin_comment(job.admin_comment, json.dumps(start_note, separators=(",", ":")),
                               cfg.admin_comment)  # another tool's text is kept
    try:
        if note is None:
            detail["admin_comment"] = f"left as it is (admin_comment: {cfg.admin_comment})"
            return detail
        slurm_jobs.set_admin_comment(job.slurm_ref, note, cfg.slurm_bin_dir, senv,
                                     timeout_s=cfg.hook_timeout_s / 4)
        detail["admin_comment"] = "provisional"
    except ColocError as exc:
        detail["admin_comment"] = f"not set: {exc.one_line()}"
    return detail


def epilog_slurmctld(ctx: HookContext, cfg: Config, env: Dict[str, str]) -> Dict[str, Any]:
    """Record how the job ended, settle earlier records, run the OOM step (hooks/oom.py), write AdminComment;
    the hook log's detail. Raises SlurmError, StoreError (hooks/runner.py logs every error and exits 0)."""
    senv = slurm_env(base=env)
    jobs = slurm_jobs.squeue_all(cfg.slurm_bin_dir, senv, timeout_s=cfg.hook_timeout_s / 3)
    job = _pick(jobs, ctx.job)
    state, source = final_state(job, env)
    end = store_jobs.JobEnd(job_id=ctx.job, end_ts=job.end_ts or time.time(), state=state,
                            exit_code=job.exit_code, signal=job.signal, state_source=source)
    db = open_ctld_db(cfg.ctld_db_path, cfg.db_busy_timeout_s)
    store_jobs.record_ctld_end(db, end, node_list=job.nodes, start_ts=job.start_ts)
    detail: Dict[str, Any] = {"state": state, "state_source": source, "exit_code": job.exit_code,
                              "signal": job.signal}
    detail.update({k: v for k, v in settle(db, jobs).items() if v})  # this job is COMPLETING: left as is
    try:  # OOM detection and the one rerun; the end above is recorded whatever happens here
        detail["oom"] = oom.handle_job_end(ctx, cfg, env, job, state, share_mode_of(job.gres, cfg), db)
    except ColocError as exc:
        detail["oom"] = {"error": exc.one_line()}
        store_jobs.record_event(db, ctx.job_id, "oom-error", {"error": exc.one_line()})
    detail["admin_comment"] = write_admin_comment(job, cfg, env)  # never raises
    return detail
