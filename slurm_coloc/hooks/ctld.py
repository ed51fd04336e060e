"""PrologSlurmctld and EpilogSlurmctld: record what a job asked for, its estimate and how it ended,
in the controller database. Run as root by slurmctld; read only Slurm's view of the job (never the
user's files or code).
"""
from __future__ import annotations

import time
from typing import Any, Dict, Optional

from slurm_coloc.config import Config
from slurm_coloc.errors import ColocError
from slurm_coloc.hooks import oom
from slurm_coloc.hooks.context import HookContext
from slurm_coloc.hooks.state import infer_final_state, parse_exit_pair, parse_slurm_duration_s
from slurm_coloc.report import admin_comment
from slurm_coloc.slurm import jobs as slurm_jobs
from slurm_coloc.slurm.parse import decode_exit_code, parse_tres_per_node
from slurm_coloc.slurm.run import slurm_env
from slurm_coloc.store import jobs as store_jobs
from slurm_coloc.store.db import open_ctld_db
from slurm_coloc.comment import parse_comment


def parse_slurm_time(text: str) -> Optional[float]:
    """``2026-11-22T07:43:08`` (slurmctld's local time) -> Unix seconds; ``Unknown``/``None`` -> None."""
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except (TypeError, ValueError):
        return None


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
    """Record the job's request and estimate (``jobs`` row). Returns a detail dict for the hook log."""
    import json

    senv = slurm_env(base=env)
    kv = slurm_jobs.show_job(ctx.job_id, cfg.slurm_bin_dir, senv, timeout_s=cfg.hook_timeout_s / 2)
    tres = parse_tres_per_node(kv.get("TresPerNode", ""))
    coloc = _clean_coloc(parse_comment(ctx.comment))
    spec = coloc.get("spec")
    sub = store_jobs.JobSubmission(
        job_id=ctx.job_id, user_name=ctx.user_name, uid=ctx.uid, job_name=ctx.job_name,
        partition=ctx.partition, cluster=env.get("SLURM_CLUSTER_NAME", ""),
        submit_ts=parse_slurm_time(kv.get("SubmitTime", "")), gres_req=kv.get("TresPerNode", ""),
        shards_req=tres.get("shard"), gpus_req=tres.get("gpu"), share_mode=share_mode_of(tres, cfg),
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
        slurm_jobs.set_admin_comment(ctx.job_id, json.dumps(start_note, separators=(",", ":")),
                                     cfg.slurm_bin_dir, senv, timeout_s=cfg.hook_timeout_s / 4)
        detail["admin_comment"] = "provisional"
    except ColocError as exc:
        detail["admin_comment"] = f"not set: {exc.one_line()}"
    return detail


def epilog_slurmctld(ctx: HookContext, cfg: Config, env: Dict[str, str]) -> Dict[str, Any]:
    """Record how the job ended (final state inferred: epilogs see COMPLETING, see hooks/state.py)."""
    senv = slurm_env(base=env)
    kv = slurm_jobs.show_job(ctx.job_id, cfg.slurm_bin_dir, senv, timeout_s=cfg.hook_timeout_s / 3)
    code, sig = parse_exit_pair(kv.get("ExitCode", ""))
    rec = slurm_jobs.job_record(ctx.job_id, cfg.slurm_bin_dir, senv, timeout_s=cfg.hook_timeout_s / 3)
    if rec is not None:  # squeue keeps the signal of a cancelled job that scontrol shows as 0:0 here
        code, sig = decode_exit_code(rec.exit_code)
    state = infer_final_state(kv.get("JobState", ""), code, sig, parse_slurm_duration_s(kv.get("RunTime", "")),
                              parse_slurm_duration_s(kv.get("TimeLimit", "")), kv.get("Reason", ""))
    end = store_jobs.JobEnd(job_id=ctx.job_id, end_ts=parse_slurm_time(kv.get("EndTime", "")) or time.time(),
                            state=state, exit_code=code, signal=sig)
    db = open_ctld_db(cfg.ctld_db_path, cfg.db_busy_timeout_s)
    store_jobs.record_ctld_end(db, end, node_list=kv.get("NodeList", ""),
                               start_ts=parse_slurm_time(kv.get("StartTime", "")))
    detail: Dict[str, Any] = {"state": state, "exit_code": code, "signal": sig}
    try:  # OOM detection and the one rerun (hooks/oom.py); the end above is recorded whatever happens here
        share_mode = share_mode_of(parse_tres_per_node(kv.get("TresPerNode", "")), cfg)
        detail["oom"] = oom.handle_job_end(ctx, cfg, env, kv, rec, state, share_mode, db)
    except ColocError as exc:
        detail["oom"] = {"error": exc.one_line()}
        store_jobs.record_event(db, ctx.job_id, "oom-error", {"error": exc.one_line()})
    detail["admin_comment"] = admin_comment.write_admin_comment(ctx.job_id, cfg, env)  # never raises
    return detail
