"""PrologSlurmctld and EpilogSlurmctld: record what a job asked for, its estimate and how it ended, in the
controller database. Run as root by slurmctld; read only Slurm's view of the job (never the user's files
or code).

What root computes itself: the script's identity (``script_sha256``, the SHA-256 of the batch script Slurm
stored, ``scontrol write batch_script``, which keys the estimator's history with the job's uid), and the
final state (``hooks/state.py``). Each controller hook also settles earlier records from the job list it
reads anyway (``settle``): inferred final states and ends of OOM reruns (a rerun cancelled while pending has
no epilog).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from slurm_coloc.comment import JobComment
from slurm_coloc.config import Config
from slurm_coloc.errors import ColocError, SlurmError
from slurm_coloc.hooks import admin_comment, oom
from slurm_coloc.hooks.context import HookContext
from slurm_coloc.hooks.state import final_state
from slurm_coloc.slurm import jobs as slurm_jobs
from slurm_coloc.slurm.jobinfo import JobInfo
from slurm_coloc.slurm.run import slurm_env
from slurm_coloc.store import jobs as store_jobs
from slurm_coloc.store.db import open_ctld_db

log = logging.getLogger(__name__)
# The line prefix submit/plan.py ``_rewrite`` gives a GPU ``#SBATCH`` line it moved to the command line (in
# place of its leading ``#`` characters); ``script_identity`` restores one ``#`` so the hash is that of the
# user's own file.
REWRITE_PREFIX = b"# coloc-sbatch moved this GPU request to the command line: "
MAX_SCRIPT_BYTES = 4 << 20


def script_identity(raw: bytes) -> str:
    """Hex SHA-256 of a batch script as the user wrote it (pure, never raises).

    ``raw`` (what Slurm stored) with coloc-sbatch's rewritten GPU lines restored, so it equals
    ``submit.directives.ParsedScript.sha256`` of the user's file.
    """
    lines = raw.splitlines(keepends=True)
    fixed = [b"#" + ln[len(REWRITE_PREFIX):] if ln.startswith(REWRITE_PREFIX) else ln for ln in lines]
    return hashlib.sha256(b"".join(fixed)).hexdigest()


def stored_script_sha256(job_id: int, cfg: Config, senv: Dict[str, str]) -> Tuple[Optional[str], str]:
    """``(script_identity, "ok")`` of the batch script slurmctld holds for ``job_id``, or ``(None, why)``.

    Written by ``scontrol write batch_script`` into a root-only directory under ``run_dir``, removed at once;
    ``hook_timeout_s``/4 bounds scontrol. None: not a batch job, scontrol failing, a directory that is not
    private, a script over ``MAX_SCRIPT_BYTES``; never raises ``ColocError`` or ``OSError``.
    """
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


def settle(db: Any, jobs: Sequence[JobInfo]) -> Dict[str, List[int]]:
    """Replace inferred final states by Slurm's own and record OOM reruns' ends, from slurmctld's job list.

    A job slurmctld no longer knows keeps its inference. Returns ``{"settled": [job ids], "reruns": [job
    ids]}``. Never raises (errors are logged; what was done before the error is kept).
    """
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
    """``shard`` / ``whole-gpu`` (all shards of one GPU) / ``gpu`` / ``none`` from a job's GRES counts.

    Pure, never raises.

    ``tres``: ``{"shard": 8}``; a shard is 1 GiB, ``cfg.gpu_mem_gib`` of them a whole GPU.
    """
    if "shard" in tres:
        return "whole-gpu" if tres["shard"] >= cfg.gpu_mem_gib else "shard"
    return "gpu" if "gpu" in tres else "none"


def coloc_record(coloc: JobComment) -> Tuple[Optional[str], Optional[str]]:
    """``(coloc_json, spec_json)`` root records: sorted-key JSON of a validated comment's fields, spec.

    Pure, never raises. None where the comment (an unannotated job) or the spec has no field.
    """
    data, spec = coloc.to_json(), coloc.spec.to_json() if coloc.spec is not None else None
    return (json.dumps(data, sort_keys=True) if data else None,
            json.dumps(spec, sort_keys=True) if spec else None)


def prolog_slurmctld(ctx: HookContext, cfg: Config, env: Dict[str, str]) -> Dict[str, Any]:
    """Record the job's request and estimate (``jobs`` row); a detail dict for the hook log.

    GRES and submit time come from slurmctld's record (``slurm_jobs.show_job``); name, user, partition and
    comment from the hook's environment, each one opaque value.

    Raises:
        SlurmError: slurmctld unreachable or the job unknown.
        StoreError: the controller database unusable. (``hooks/runner.py`` catches every error, logs it and
            exits 0.)
    """
    senv = slurm_env(base=env)
    jobs = slurm_jobs.squeue_all(cfg.slurm_bin_dir, senv, timeout_s=cfg.hook_timeout_s / 3)
    job = _pick(jobs, ctx.job)
    sha, sha_note = stored_script_sha256(ctx.job, cfg, senv)
    coloc = JobComment.read(ctx.comment, ctx.job)
    coloc_json, spec_json = coloc_record(coloc)
    sub = store_jobs.JobSubmission(
        job_id=ctx.job, user_name=ctx.user_name, uid=job.uid if job.uid is not None else ctx.uid,
        job_name=ctx.job_name,
        partition=ctx.partition, cluster=env.get("SLURM_CLUSTER_NAME", ""),
        submit_ts=job.submit_ts, gres_req=job.tres_per_node,
        shards_req=job.gres.get("shard"), gpus_req=job.gres.get("gpu"),
        share_mode=share_mode_of(job.gres, cfg),
        estimate_mib=coloc.mem_mib, estimate_method=coloc.method,
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
    note = admin_comment.merge_admin_comment(job.admin_comment, json.dumps(start_note, separators=(",", ":")),
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
    """Record how the job ended, settle earlier records, run the OOM step (hooks/oom.py), write AdminComment.

    Final state: ``hooks/state.py``; 22.05's epilogs see COMPLETING, so it is inferred and settled by a later
    controller hook. AdminComment: hooks/admin_comment.py. Returns the hook log's detail: ``state``,
    ``state_source``, ``exit_code``, ``signal``, the jobs settled, ``oom`` and ``admin_comment``.

    Raises:
        SlurmError: slurmctld unreachable or the job unknown.
        StoreError: the controller database unusable. (``hooks/runner.py`` catches every error, logs it and
            exits 0.)
    """
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
    detail["admin_comment"] = admin_comment.write_admin_comment(job, cfg, env)  # never raises
    return detail
