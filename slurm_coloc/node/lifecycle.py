"""The node side of a job's sharing, for the node Prolog/Epilog (root): MPS per shared GPU, the job's env
file, the sampler, the usage summary.

``prolog_sharing``/``epilog_sharing`` are called from hooks/node.py after the job row is recorded. Every step
returns a detail dict and records node events; nothing here raises for an MPS or sampler problem (the job then
runs without MPS: time-slicing).

The per-job task environment file ``<run_dir>/jobs/<job_id>.env`` (root-owned, 0644, ``KEY=VALUE`` lines) is
owned here: its path (``env_path``), which jobs have one (``env_job_ids``), its one writer (``write_env``, by
the Prolog for shard jobs and placer-guarded jobs), its one reader (``read_env``, which checks owner, mode and
keys: the TaskProlog and the root watchdog use it) and its removal (``remove_env``, by the Epilog). The SPANK
plugin (C) reads the same path. Whole-GPU jobs get no file. The file carries the task's variables only; the
job's grant is its recorded shards (``job_runs.shards``), never re-read from the fence text.
"""
from __future__ import annotations

import logging
import os
import re
import stat
import time
from pathlib import Path
from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Tuple

from sqlite_utils import Database

from slurm_coloc.atomic import write_atomic
from slurm_coloc.config import Config
from slurm_coloc.node import mps, sampler_daemon
from slurm_coloc.node.mps_daemon import MpsDaemon, root_dir
from slurm_coloc.node.summary import summarize
from slurm_coloc.slurm.parse import parse_stepd_title
from slurm_coloc.store import samples as store_samples
from slurm_coloc.store import summaries as store_summaries
from slurm_coloc.units import shards_to_mib

log = logging.getLogger("slurm_coloc.node")

_VALUE_OK = re.compile(r"^[A-Za-z0-9_./=:,+-]*$")
ENV_KEY_RE = re.compile(r"^(CUDA_MPS_[A-Z_]+|COLOC_[A-Z_]+|CUDA_VISIBLE_DEVICES)$")  # CVD: MPS remaps to 0
MAX_ENV_LINE = 4096
MAX_ENV_BYTES = 64 * 1024
MAX_ANCESTORS = 12


def env_path(cfg: Config, job_id: int) -> Path:
    """``<run_dir>/jobs/<job_id>.env``."""
    return Path(cfg.run_dir) / "jobs" / f"{int(job_id)}.env"


def mps_env(d: MpsDaemon, shards: int) -> List[Tuple[str, str]]:
    """Task variables of a shard job with ``shards`` (GiB) under MPS daemon ``d``.

    The daemon sees only its GPU, so the client addresses it as device 0 (``CUDA_VISIBLE_DEVICES=0``, which
    also overrides Slurm's global index under task/none) and the fence is ``0=<shards>G``: 1 shard = 1 GiB,
    the CUDA context included (the estimator counts it in the shard request too).
    """
    return [("COLOC_SHARE", "mps"), ("CUDA_MPS_PIPE_DIRECTORY", str(d.pipe_dir)),
            ("CUDA_MPS_LOG_DIRECTORY", str(d.log_dir)), ("CUDA_VISIBLE_DEVICES", "0"),
            ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", f"0={int(shards)}G")]


def write_env(cfg: Config, job_id: int, pairs: List[Tuple[str, str]]) -> Path:
    """Atomically write ``(KEY, VALUE)`` pairs, in order, to the job's env file (root-owned 0644, no symlink
    followed).

    Raises:
        ValueError: a value holds characters outside ``[A-Za-z0-9_./=:,+-]``.
        OSError / PermissionError: the jobs directory cannot be made safely.
    """
    for k, v in pairs:
        if not _VALUE_OK.match(v) or not re.match(r"^[A-Z_]+$", k):
            raise ValueError(f"refusing env pair {k}={v!r}")
    jobs = Path(cfg.run_dir) / "jobs"
    root_dir(Path(cfg.run_dir))
    root_dir(jobs)
    final = env_path(cfg, job_id)
    write_atomic(final, "".join(f"{k}={v}\n" for k, v in pairs).encode("utf-8"), 0o644)
    return final


def env_job_ids(cfg: Config) -> FrozenSet[int]:
    """The job ids that have an env file now (``<job_id>.env``; not temporary ``.``-files); empty when the
    jobs directory is absent or unreadable."""
    try:
        names = os.listdir(Path(cfg.run_dir) / "jobs")
    except OSError:
        return frozenset()
    return frozenset(int(n[:-4]) for n in names if n.endswith(".env") and n[:-4].isdigit())


def remove_env(cfg: Config, job_id: int) -> bool:
    """Delete the job's env file; True when there was one. Raises OSError: it exists but cannot be removed."""
    try:
        env_path(cfg, job_id).unlink()
        return True
    except FileNotFoundError:
        return False


def read_env(cfg: Config, job_id: int) -> List[Tuple[str, str]]:
    """The job's env file as ``(KEY, VALUE)`` pairs in file order; ``[]`` when absent or unsafe.

    Trusted only as a regular file owned by root, not group/other-writable, opened without following symlinks
    or blocking; at most ``MAX_ENV_BYTES`` read, only lines under ``MAX_ENV_LINE`` bytes whose key matches
    ``ENV_KEY_RE`` (``CUDA_MPS_*``, ``COLOC_*``, ``CUDA_VISIBLE_DEVICES``) kept.
    """
    try:
        fd = os.open(str(env_path(cfg, job_id)), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
            return []
        data = fh.read(MAX_ENV_BYTES)
    out = []
    for raw in data.split(b"\n"):
        if not raw or len(raw) > MAX_ENV_LINE:
            continue
        key, sep, value = raw.decode("utf-8", "replace").partition("=")
        if sep and ENV_KEY_RE.match(key) and "\n" not in value:
            out.append((key, value))
    return out


def stepd_job_id(start_pid: Optional[int] = None, proc: str = "/proc") -> Optional[int]:
    """The job id of the slurmstepd this process runs under (``start_pid`` None: from our parent), or None.

    Walks up to the first root-owned ancestor, at most ``MAX_ANCESTORS`` steps, which must be titled
    ``slurmstepd: [<job id>.<step>]``. The TaskProlog runs as the user under a user-owned fork of slurmstepd
    whose root-owned parent is slurmstepd itself: its title is Slurm's, which no user process can change. In a
    heterogeneous job this is the component's own id (the task environment names the leader's). Never raises.
    """
    pid = os.getppid() if start_pid is None else int(start_pid)
    for _ in range(MAX_ANCESTORS):
        if pid <= 1:
            return None
        try:
            owner = os.stat(f"{proc}/{pid}").st_uid
            with open(f"{proc}/{pid}/cmdline", "rb") as fh:
                title = fh.read(256)
            with open(f"{proc}/{pid}/stat", "rb") as fh:
                ppid = int(fh.read(4096).rpartition(b")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            return None
        if owner == 0:
            return parse_stepd_title(title)
        pid = ppid
    return None


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
        ValueError, OSError: the env file cannot be written safely (``write_env``).
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
            pairs = mps_env(res.daemon, int(shards or 0))
            out["mps_key"] = res.daemon.key
        else:
            log.warning("job %s: running without MPS (%s: %s)", job_id, res.event, res.detail)
    path = write_env(cfg, job_id, pairs)
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
    out: Dict[str, Any] = {"env_file_removed": remove_env(cfg, job_id)}
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
