"""Node Prolog, Epilog and TaskProlog: record the job on this node (GPUs, shards, start/end). Prolog and
Epilog run as root by slurmd; TaskProlog runs as the job's user and only prints the ``export`` lines the
Prolog prepared (it writes nothing)."""
from __future__ import annotations

import time
from typing import Any, Dict, List, Optional

from sqlite_utils import Database

from slurm_coloc.config import Config
from slurm_coloc.errors import ColocError
from slurm_coloc.hooks.context import HookContext, final_state, infer_final_state
from slurm_coloc.node import lifecycle
from slurm_coloc.slurm import jobs as slurm_jobs
from slurm_coloc.slurm.jobinfo import JobInfo
from slurm_coloc.slurm.run import slurm_env
from slurm_coloc.store import jobs as store_jobs
from slurm_coloc.store.db import open_node_db


def prolog(ctx: HookContext, cfg: Config, env: Dict[str, str]) -> Dict[str, Any]:
    """Record the job start on this node (GPUs of ``SLURM_JOB_GPUS``, shards of slurmctld's ``tres_per_node``,
    user); set up sharing; the hook log's detail. Raises SlurmError, StoreError (hooks/runner.py logs every
    error and exits 0: the node is never drained)."""
    job = (slurm_jobs.show_job(ctx.job, cfg.slurm_bin_dir, slurm_env(base=env),
                               timeout_s=cfg.hook_timeout_s / 2))
    start = store_jobs.JobStart(job_id=ctx.job, node=ctx.node, user_name=job.user_name or ctx.user_name,
                               uid=ctx.uid, gpus=",".join(str(g) for g in ctx.gpus), shards=job.shards,
                               gres=job.tres_per_node, start_ts=job.start_ts or time.time())
    db = open_node_db(cfg.node_db_path(ctx.node), cfg.db_busy_timeout_s)
    store_jobs.record_node_start(db, start)
    guard = place_guard(cfg, db, job, ctx)
    if guard:
        return {"gpus": start.gpus, "shards": start.shards, **guard}
    sharing = lifecycle.prolog_sharing(cfg, db, ctx.job, ctx.node, ctx.gpus, start.shards, ctx.spank_share,
                                       env, ctx.uid)
    return {"gpus": start.gpus, "shards": start.shards, **sharing}


GUARD_KEY = "COLOC_PLACE_GUARD"


def place_guard(cfg: Config, db: Database, job: JobInfo, ctx: HookContext) -> Dict[str, Any]:
    """No GPU for a coloc-placer job (``"place": true`` in its comment) started without GRES: where
    ``ConstrainDevices`` is off it could reach every GPU unfenced, so its env file sets
    ``CUDA_VISIBLE_DEVICES`` empty and ``COLOC_PLACE_GUARD=1`` (the TaskProlog says so in the job's output).
    The detail, or ``{}`` for any other job. Raises OSError (env file), sqlite3.Error (the ``place-guard``
    node event)."""

    from slurm_coloc.comment import JobComment
    from slurm_coloc.store import samples as store_samples

    if not JobComment.read(job.comment, ctx.job).place or ctx.gpus \
            or (job.tres_per_node or "").replace("gres:", "").strip():
        return {}
    path = lifecycle.write_env(cfg, ctx.job, [("CUDA_VISIBLE_DEVICES", ""), (GUARD_KEY, "1")])
    store_samples.record_node_event(db, ctx.job, "place-guard", {"why": "held for coloc-placer, started "
                                                                        "without GRES"})
    return ({"share": "none", "place_guard": "no GPU: started without the placer's GRES",
             "env_file": str(path)})


def epilog(ctx: HookContext, cfg: Config, env: Dict[str, str]) -> Dict[str, Any]:
    """Release the job's share of its GPUs, then record its end with its final state (hooks/context.py). The
    local teardown (env file, MPS, sampler flush, usage summary) comes first and needs no Slurm answer (the
    query can time out under load, docs/reliability.md "Load"); without it the state is inferred and
    ``detail["slurm"]`` says why. Last, the AdminComment figures (hooks/figures.py ``record``, never raises);
    no diagnosis runs as root. Raises StoreError, HookTimeout (hooks/runner.py logs every error and exits 0).
    """
    db = open_node_db(cfg.node_db_path(ctx.node), cfg.db_busy_timeout_s)
    run = (next((r for r in store_jobs.load_job_runs(db) if r.job_id == ctx.job_id and r.node == ctx.node),
                None))
    sharing = (lifecycle.epilog_sharing(cfg, db, ctx.job, ctx.node, ctx.gpus, run.start_ts if run else None,
                                        env))
    out: Dict[str, Any] = {}
    try:
        job = (slurm_jobs.show_job(ctx.job, cfg.slurm_bin_dir, slurm_env(base=env),
                                   timeout_s=cfg.hook_timeout_s / 2))
    except ColocError as exc:
        job, out["slurm"] = None, exc.one_line()
    code: Optional[int]
    sig: Optional[int]
    if job is not None and job.exit_code is not None:
        code, sig, state, end_ts = job.exit_code, job.signal, final_state(job, env)[0], job.end_ts
    else:
        code, sig, end_ts = ctx.exit_code, ctx.signal, None
        state = infer_final_state("", code, sig, None, None)
    end = store_jobs.JobEnd(job_id=ctx.job, node=ctx.node, state=state, exit_code=code, signal=sig,
                            end_ts=end_ts or time.time())
    store_jobs.record_node_end(db, end)
    from slurm_coloc.hooks import figures  # here: the controller hooks never load even report/facts.py

    # never raises
    out["figures"] = figures.record(cfg, db, ctx.job, ctx.node, job.nodes if job is not None else "")
    return {"state": state, "exit_code": code, "signal": sig, **out, **sharing}


def task_prolog(ctx: HookContext, cfg: Config, env: Dict[str, str]) -> List[str]:
    """The ``export KEY=VALUE`` lines TaskProlog prints: the safe pairs the Prolog prepared for the job.
    The job is the one of the slurmstepd the TaskProlog runs under (``lifecycle.stepd_job_id``): in a
    heterogeneous job each component's tasks get their own component's file, not the leader's that
    ``SLURM_JOB_ID`` names (used only where no slurmstepd is found above). None when the job has no env file
    or it is not trusted."""
    job_id = lifecycle.stepd_job_id() or ctx.job_id
    if job_id is None:
        return []
    # Slurm reads TaskProlog lines ``export NAME=value`` literally (no shell quoting); ``print`` goes to the
    # task's standard output.
    pairs = lifecycle.read_env(cfg, job_id)
    lines = [f"export {k}={v}" for k, v in pairs]
    if (GUARD_KEY, "1") in pairs:
        lines.append(f"print coloc: job {job_id} was submitted for coloc-placer but started without its GPU "
                     "(released before the placer steered it): it has no GPU (CUDA_VISIBLE_DEVICES is "
                     "empty). Resubmit it with coloc-sbatch.")
    return lines
