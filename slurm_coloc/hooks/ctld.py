"""PrologSlurmctld and EpilogSlurmctld: record what a job asked for, its estimate and how it ended,
in the controller database. Run as root by slurmctld; read only Slurm's view of the job (never the
user's files or code).
"""
from __future__ import annotations

import json
import time
from typing import Any, Dict, Optional

from slurm_coloc.config import Config
from slurm_coloc.errors import ColocError
from slurm_coloc.hooks import admin_comment, oom
from slurm_coloc.hooks.context import HookContext
from slurm_coloc.hooks.state import final_state
from slurm_coloc.slurm import jobs as slurm_jobs
from slurm_coloc.slurm.run import slurm_env
from slurm_coloc.store import jobs as store_jobs
from slurm_coloc.store.db import open_ctld_db
from slurm_coloc.comment import parse_comment


def share_mode_of(tres: Dict[str, int], cfg: Config) -> str:
    """``shard`` / ``whole-gpu`` (all shards of one GPU) / ``gpu`` / ``none`` from a job's GRES counts."""
    if "shard" in tres:
        return "whole-gpu" if tres["shard"] >= cfg.gpu_mem_gib else "shard"
    return "gpu" if "gpu" in tres else "none"


def _clean_coloc(data: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """Keep only the expected keys and types of a user-supplied coloc comment."""
    if not data:
        return {}
    out: Dict[str, Any] = {}
    for key, kind in (("mem_mib", int), ("shards", int), ("method", str), ("sha256", str), ("mode", str)):
        value = data.get(key)
        if isinstance(value, kind) and not isinstance(value, bool):
            out[key] = value[:128] if isinstance(value, str) else value
    if isinstance(data.get("spec"), dict):
        out["spec"] = data["spec"]
    return out


def prolog_slurmctld(ctx: HookContext, cfg: Config, env: Dict[str, str]) -> Dict[str, Any]:
    """Record the job's request and estimate (``jobs`` row). Returns a detail dict for the hook log.

    GRES and submit time come from slurmctld's record (``slurm_jobs.show_job``); name, user, partition and
    comment from the hook's environment, each one opaque value.
    Raises: SlurmError (slurmctld unreachable or the job unknown), StoreError.
    """
    senv = slurm_env(base=env)
    job = slurm_jobs.show_job(ctx.job, cfg.slurm_bin_dir, senv, timeout_s=cfg.hook_timeout_s / 2)
    coloc = _clean_coloc(parse_comment(ctx.comment))
    spec = coloc.get("spec")
    sub = store_jobs.JobSubmission(
        job_id=ctx.job, user_name=ctx.user_name, uid=ctx.uid, job_name=ctx.job_name,
        partition=ctx.partition, cluster=env.get("SLURM_CLUSTER_NAME", ""),
        submit_ts=job.submit_ts, gres_req=job.tres_per_node,
        shards_req=job.gres.get("shard"), gpus_req=job.gres.get("gpu"), share_mode=share_mode_of(job.gres, cfg),
        estimate_mib=coloc.get("mem_mib"), estimate_method=coloc.get("method"),
        script_sha256=coloc.get("sha256"), spec_json=json.dumps(spec, sort_keys=True) if spec else None,
        coloc_json=json.dumps(coloc, sort_keys=True) if coloc else None,
    )
    db = open_ctld_db(cfg.ctld_db_path, cfg.db_busy_timeout_s)
    store_jobs.record_submission(db, sub)
    detail: Dict[str, Any] = {"share_mode": sub.share_mode, "shards": sub.shards_req,
                              "estimate_mib": sub.estimate_mib}
    # A provisional AdminComment while slurmctld still accepts updates (it refuses them once the job has
    # ended, i.e. in EpilogSlurmctld without slurmdbd): what was asked and estimated.
    start_note = {"coloc": {"mode": sub.share_mode, "shards": sub.shards_req, "est_mib": sub.estimate_mib,
                            "method": sub.estimate_method}}
    try:
        slurm_jobs.set_admin_comment(job.slurm_ref, json.dumps(start_note, separators=(",", ":")),
                                     cfg.slurm_bin_dir, senv, timeout_s=cfg.hook_timeout_s / 4)
        detail["admin_comment"] = "provisional"
    except ColocError as exc:
        detail["admin_comment"] = f"not set: {exc.one_line()}"
    return detail


def epilog_slurmctld(ctx: HookContext, cfg: Config, env: Dict[str, str]) -> Dict[str, Any]:
    """Record how the job ended (final state inferred: epilogs see COMPLETING, see hooks/state.py), run the OOM
    step (hooks/oom.py) and write the AdminComment summary (hooks/admin_comment.py).

    Raises: SlurmError (slurmctld unreachable or the job unknown), StoreError.
    """
    senv = slurm_env(base=env)
    job = slurm_jobs.show_job(ctx.job, cfg.slurm_bin_dir, senv, timeout_s=cfg.hook_timeout_s / 3)
    state = final_state(job)
    end = store_jobs.JobEnd(job_id=ctx.job, end_ts=job.end_ts or time.time(), state=state,
                            exit_code=job.exit_code, signal=job.signal)
    db = open_ctld_db(cfg.ctld_db_path, cfg.db_busy_timeout_s)
    store_jobs.record_ctld_end(db, end, node_list=job.nodes, start_ts=job.start_ts)
    detail: Dict[str, Any] = {"state": state, "exit_code": job.exit_code, "signal": job.signal}
    try:  # OOM detection and the one rerun; the end above is recorded whatever happens here
        detail["oom"] = oom.handle_job_end(ctx, cfg, env, job, state, share_mode_of(job.gres, cfg), db)
    except ColocError as exc:
        detail["oom"] = {"error": exc.one_line()}
        store_jobs.record_event(db, ctx.job_id, "oom-error", {"error": exc.one_line()})
    detail["admin_comment"] = admin_comment.write_admin_comment(job, cfg, env)  # never raises
    return detail
