"""What the node Prolog/Epilog do for sharing: MPS per shared GPU, the job's env file, the sampler, summaries.

Called from hooks/node.py after the job row is recorded. Every step returns a detail dict and records node
events; nothing here raises for an MPS or sampler problem (the job then runs without MPS: time-slicing).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Dict, Optional, Sequence

from sqlite_utils import Database

from slurm_coloc.config import Config
from slurm_coloc.node import jobenv, mps, sampler_daemon
from slurm_coloc.node.summary import summarize
from slurm_coloc.store import samples as store_samples
from slurm_coloc.store import summaries as store_summaries
from slurm_coloc.units import shards_to_mib

log = logging.getLogger("slurm_coloc.node")


def _uuid_of(index: int) -> Optional[str]:
    """The GPU UUID through NVML, or None where NVML is unavailable (fake-GPU cluster: keyed by index)."""
    try:
        from slurm_coloc.nvml import gpu_uuids
        return gpu_uuids().get(index)
    except Exception as exc:  # no NVML: key by index
        log.info("no NVML (%s): MPS directories keyed by GPU index", exc)
        return None


def share_mode(shards: Optional[int], cfg: Config) -> str:
    """``shard`` (fewer shards than a GPU has), ``whole-gpu`` (all of them) or ``none`` (None or 0 shards)."""
    if not shards:
        return "none"
    return "whole-gpu" if shards >= cfg.gpu_mem_gib else "shard"


def prolog_sharing(cfg: Config, db: Database, job_id: int, node: str, gpus: Sequence[int],
                   shards: Optional[int],
                   spank_share: Optional[str] = None, env: Optional[Dict[str, str]] = None,
                   uid: Optional[int] = None) -> Dict[str, Any]:
    """Set up a job's GPU sharing on this node; return what was done (for the hook_runs row).

    Shard job on one GPU: MPS daemon for that GPU (unless ``mps_mode`` off or ``--coloc-share=timeslice``) and
    the env file (``COLOC_SHARE=mps`` + MPS variables + fence, or ``COLOC_SHARE=timeslice``). Whole-GPU and
    non-GPU jobs: no env file, no MPS. Starts the sampler for any GPU job (``sampler_autostart``). ``shards``
    are GiB on this node; ``uid`` runs the daemon in ``mps_mode: per-user``.

    Returns ``{"share", "sampler_pid"?, "mps"?, "mps_key"?, "env_file"?, "coloc_share"?}``; an MPS problem is
    a value of ``mps`` (the job then runs time-sliced), never an exception.

    Raises:
        ValueError, OSError: the env file cannot be written safely (``jobenv.write_env``).
        sqlite3.Error: a node event cannot be recorded.
    """
    out: Dict[str, Any] = {"share": share_mode(shards, cfg)}
    if gpus and cfg.sampler_autostart:
        out["sampler_pid"] = sampler_daemon.ensure_running(cfg, node)
    if out["share"] != "shard":
        return out
    pairs = [("COLOC_SHARE", "timeslice")]
    if cfg.mps_mode == "off" or spank_share == "timeslice":
        out["mps"] = "off"
    elif len(gpus) != 1:
        out["mps"] = "shards-on-several-gpus"
        store_samples.record_node_event(db, job_id, "mps-skipped", {"gpus": list(gpus), "why": out["mps"]})
    else:
        res = mps.acquire(cfg, job_id, gpus[0], _uuid_of(gpus[0]), env, uid,
                          shards_to_mib(shards or 0) or None)
        store_samples.record_node_event(db, job_id, res.event, {"gpu": gpus[0], **res.detail})
        out["mps"] = res.event
        if res.ok and res.daemon is not None:
            pairs = jobenv.mps_env(res.daemon, int(shards or 0))
            out["mps_key"] = res.daemon.key
        else:
            log.warning("job %s: running without MPS (%s: %s)", job_id, res.event, res.detail)
    path = jobenv.write_env(cfg, job_id, pairs)
    out["env_file"] = str(path)
    out["coloc_share"] = pairs[0][1]
    return out


def epilog_sharing(cfg: Config, db: Database, job_id: int, node: str, gpus: Sequence[int],
                   start_ts: Optional[float], env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Remove the env file, release MPS (stopping an unused daemon), flush the sampler, write the usage
    summary.

    No ``gpus``: no flush and no summary; ``start_ts`` (Unix s) None: the summary reads the last 24 h. Returns
    ``{"env_file_removed", "mps"?: [events], "sampler_flush"?, "summary"?: {"peak_mem_mib", "n_samples"}}``.

    Raises:
        OSError: the env file exists but cannot be removed.
        sqlite3.Error: a node event or the summary cannot be recorded.
    """
    out: Dict[str, Any] = {"env_file_removed": jobenv.remove_env(cfg, job_id)}
    for res in mps.release(cfg, job_id, env):
        store_samples.record_node_event(db, job_id, res.event, res.detail)
        out.setdefault("mps", []).append(res.event)
    if gpus:
        out["sampler_flush"] = sampler_daemon.request_flush(cfg, node, sampler_daemon.running_pid(cfg, node))
        end = time.time()
        t0 = start_ts if start_ts else end - 86400
        summary = summarize(job_id, node, list(gpus), start_ts, end,
                            store_samples.load_gpu_samples(db, t0, end, list(gpus)),
                            store_samples.load_proc_samples(db, t0, end, list(gpus)),
                            idle_smact_pct=cfg.diag_idle_smact_pct,
                            cpu_rows=store_samples.load_job_cpu_samples(db, job_id, t0, end))
        store_summaries.record_summary(db, summary)
        out["summary"] = {"peak_mem_mib": summary.peak_mem_mib, "n_samples": summary.n_samples}
    return out
