"""pid -> Slurm job id for the node sampler, through /proc (read as root).

Sources, most trusted first, since the answer decides whose grant a process counts against (and whom the watchdog
stops): the process's cgroup (``.../job_<id>/...``, set by slurmd), then its nearest root-owned ``slurmstepd:
[<id>.<step>]`` ancestor (proctrack without cgroups), and only then its own ``SLURM_JOB_ID`` environment variable,
which its owner can write: that claim counts only for a root process or when the job's uid (``job_uid``, from the
node database) is the process's real uid. The answer is cached per (pid, start time): each tick costs one read of
``/proc/<pid>/stat`` per GPU process (the guard against a reused pid); the sources are read once per process start.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

_CGROUP_JOB = re.compile(r"/job_(\d+)(?:/|$)")
_STEPD = re.compile(rb"^slurmstepd: \[(\d+)\.")
MAX_ANCESTORS = 64


class JobAttributor:
    """pid -> Slurm job id via /proc, cached per (pid, start time) so a reused pid is looked up again.

    Args:
        proc_root: the proc filesystem (``/proc``).
        job_uid: job id -> the uid Slurm runs it as (None: unknown); without it only root processes' own
            ``SLURM_JOB_ID`` claims count.
    """

    def __init__(self, proc_root: str = "/proc", job_uid: Optional[Callable[[int], Optional[int]]] = None) -> None:
        self.proc = Path(proc_root)
        self.job_uid = job_uid
        self._prefix = f"{self.proc}/"
        self._cache: Dict[int, Tuple[bytes, Optional[int]]] = {}

    def _start_time(self, pid: int) -> Optional[bytes]:
        """Field 22 (starttime) of ``/proc/<pid>/stat``: one open/read/close, no pathlib (read every tick)."""
        try:
            fd = os.open(f"{self._prefix}{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            stat = os.read(fd, 4096)
        except OSError:
            return None
        finally:
            os.close(fd)
        i = stat.rfind(b")")
        if i < 0:
            return None
        rest = stat[i + 1:].split()
        return rest[19] if len(rest) > 19 else None

    def job_of(self, pid: int) -> Optional[int]:
        """The job id of ``pid``, or None (not a Slurm job, gone, or unreadable)."""
        start = self._start_time(pid)
        if start is None:
            return None
        hit = self._cache.get(pid)
        if hit and hit[0] == start:
            return hit[1]
        job = self._from_cgroup(pid)
        if job is None:
            job = self._from_stepd_ancestor(pid)
        if job is None:
            job = self._claimed(pid)
        self._cache[pid] = (start, job)
        if len(self._cache) > 10_000:
            self._cache.clear()
        return job

    def _from_environ(self, pid: int) -> Optional[int]:
        try:
            with open(self.proc / str(pid) / "environ", "rb") as fh:
                data = fh.read(1 << 20)
        except OSError:
            return None
        for item in data.split(b"\0"):
            if item.startswith(b"SLURM_JOB_ID="):
                value = item[13:]
                return int(value) if value.isdigit() else None
        return None

    def _from_cgroup(self, pid: int) -> Optional[int]:
        try:
            text = (self.proc / str(pid) / "cgroup").read_text()
        except OSError:
            return None
        m = _CGROUP_JOB.search(text)
        return int(m.group(1)) if m else None

    def _status(self, pid: int) -> Tuple[Optional[int], Optional[int]]:
        """(real uid, parent pid) from ``/proc/<pid>/status``; (None, None) when unreadable."""
        uid = ppid = None
        try:
            with open(self.proc / str(pid) / "status", "rb") as fh:
                for line in fh.read(8192).splitlines():
                    if line.startswith(b"Uid:"):
                        uid = int(line.split()[1])
                    elif line.startswith(b"PPid:"):
                        ppid = int(line.split()[1])
        except (OSError, ValueError, IndexError):
            return None, None
        return uid, ppid

    def _from_stepd_ancestor(self, pid: int) -> Optional[int]:
        """The job of the nearest root-owned ``slurmstepd: [<id>.<step>]`` ancestor (at most ``MAX_ANCESTORS``)."""
        _, cur = self._status(pid)
        for _ in range(MAX_ANCESTORS):
            if not cur or cur <= 1:
                return None
            uid, parent = self._status(cur)
            if uid == 0:
                try:
                    with open(self.proc / str(cur) / "cmdline", "rb") as fh:
                        m = _STEPD.match(fh.read(256))
                except OSError:
                    m = None
                if m:
                    return int(m.group(1))
            cur = parent
        return None

    def _claimed(self, pid: int) -> Optional[int]:
        """The process's own ``SLURM_JOB_ID``, when its owner may claim that job: root, or the job's uid."""
        job = self._from_environ(pid)
        if job is None:
            return None
        uid, _ = self._status(pid)
        if uid == 0:
            return job
        owner = self.job_uid(job) if self.job_uid is not None else None
        return job if owner is not None and uid == owner else None
