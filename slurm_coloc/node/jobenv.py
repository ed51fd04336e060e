"""The per-job task environment file ``<run_dir>/jobs/<job_id>.env`` (root-owned, 0644, ``KEY=VALUE`` lines).

Written by the Prolog for shard jobs, read by TaskProlog (hooks/node.py ``read_job_env``) and the SPANK plugin,
removed by the Epilog. Whole-GPU jobs get no file.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from slurm_coloc.config import Config
from slurm_coloc.node.mps import MpsDaemon, _mkdir
from slurm_coloc.slurm.parse import parse_stepd_title

_VALUE_OK = re.compile(r"^[A-Za-z0-9_./=:,+-]*$")


def env_path(cfg: Config, job_id: int) -> Path:
    """``<run_dir>/jobs/<job_id>.env``."""
    return Path(cfg.run_dir) / "jobs" / f"{int(job_id)}.env"


def mps_env(d: MpsDaemon, shards: int) -> List[Tuple[str, str]]:
    """Task variables of a shard job under MPS on daemon ``d``.

    The daemon sees only its GPU, so the client addresses it as device 0 (``CUDA_VISIBLE_DEVICES=0``, which also
    overrides Slurm's global index under task/none) and the fence is ``0=<shards>G``: 1 shard = 1 GiB, the CUDA
    context included (the estimator counts it in the shard request too).
    """
    return [("COLOC_SHARE", "mps"), ("CUDA_MPS_PIPE_DIRECTORY", str(d.pipe_dir)),
            ("CUDA_MPS_LOG_DIRECTORY", str(d.log_dir)), ("CUDA_VISIBLE_DEVICES", "0"),
            ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", f"0={int(shards)}G")]


def write_env(cfg: Config, job_id: int, pairs: List[Tuple[str, str]]) -> Path:
    """Atomically write the job's env file (root-owned 0644, no symlink followed).

    Raises:
        ValueError: a value holds characters outside ``[A-Za-z0-9_./=:,+-]``.
        OSError / PermissionError: the jobs directory cannot be made safely.
    """
    for k, v in pairs:
        if not _VALUE_OK.match(v) or not re.match(r"^[A-Z_]+$", k):
            raise ValueError(f"refusing env pair {k}={v!r}")
    jobs = Path(cfg.run_dir) / "jobs"
    _mkdir(Path(cfg.run_dir))
    _mkdir(jobs)
    final = env_path(cfg, job_id)
    tmp = jobs / f".{int(job_id)}.env.{os.getpid()}"
    tmp.unlink(missing_ok=True)
    fd = os.open(str(tmp), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        os.fchmod(fh.fileno(), 0o644)
        fh.write("".join(f"{k}={v}\n" for k, v in pairs))
    os.replace(tmp, final)
    return final


def remove_env(cfg: Config, job_id: int) -> bool:
    """Delete the job's env file; True when there was one."""
    try:
        env_path(cfg, job_id).unlink()
        return True
    except FileNotFoundError:
        return False


def read_pairs(path: Path) -> Optional[Dict[str, str]]:
    """The file's pairs as a dict (tests and diagnostics), None when absent."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


MAX_ANCESTORS = 12


def stepd_job_id(start_pid: Optional[int] = None, proc: str = "/proc") -> Optional[int]:
    """The job id of the slurmstepd this process runs under, or None where none is found.

    Walks up from ``start_pid`` (default: the parent) to the first ancestor owned by root, at most
    ``MAX_ANCESTORS`` steps; that process must be titled ``slurmstepd: [<job id>.<step>]``
    (``slurm.parse.parse_stepd_title``). The TaskProlog runs as the job's user under a user-owned fork of
    slurmstepd, whose root-owned parent is slurmstepd itself: its title is Slurm's, which no user process can
    change. In a heterogeneous job this is the component's own id (the task environment names the leader's).
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
