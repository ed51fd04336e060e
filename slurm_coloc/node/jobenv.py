"""The per-job task environment file ``<run_dir>/jobs/<job_id>.env`` (root-owned, 0644, ``KEY=VALUE`` lines).

This module owns the file: its path (``env_path``), which jobs have one (``env_job_ids``), its one writer
(``write_env``, by the Prolog for shard jobs and placer-guarded jobs), its one reader (``read_env``, which
checks owner, mode and keys: the TaskProlog and the root watchdog use it) and its removal (``remove_env``, by
the Epilog). The SPANK plugin (C) reads the same path. Whole-GPU jobs get no file. The file carries the task's
variables only; the job's grant is its recorded shards (``job_runs.shards``), never re-read from the fence
text.
"""
from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import FrozenSet, List, Optional, Tuple

from slurm_coloc.atomic import write_atomic
from slurm_coloc.config import Config
from slurm_coloc.node.mps_daemon import MpsDaemon, root_dir
from slurm_coloc.slurm.parse import parse_stepd_title

_VALUE_OK = re.compile(r"^[A-Za-z0-9_./=:,+-]*$")
ENV_KEY_RE = re.compile(r"^(CUDA_MPS_[A-Z_]+|COLOC_[A-Z_]+|CUDA_VISIBLE_DEVICES)$")  # CVD: MPS remaps to 0
MAX_ENV_LINE = 4096
MAX_ENV_BYTES = 64 * 1024


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
    """The job ids that have an env file now (names ``<job_id>.env``; temporary ``.``-files are not listed);
    empty when the jobs directory is absent or unreadable.
    """
    try:
        names = os.listdir(Path(cfg.run_dir) / "jobs")
    except OSError:
        return frozenset()
    return frozenset(int(n[:-4]) for n in names if n.endswith(".env") and n[:-4].isdigit())


def remove_env(cfg: Config, job_id: int) -> bool:
    """Delete the job's env file; True when there was one.

    Raises:
        OSError: the file exists but cannot be removed.
    """
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


MAX_ANCESTORS = 12


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
