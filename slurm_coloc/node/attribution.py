"""pid -> Slurm job id for the node sampler, through /proc (read as root).

``/proc/<pid>/environ`` (``SLURM_JOB_ID``) or, failing that, ``/proc/<pid>/cgroup`` (``.../job_<id>/...``). The
answer is cached per (pid, start time): each tick costs one read of ``/proc/<pid>/stat`` per GPU process (the guard
against a reused pid), and environ/cgroup are read once per process start.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Dict, Optional, Tuple

_CGROUP_JOB = re.compile(r"/job_(\d+)(?:/|$)")


class JobAttributor:
    """pid -> Slurm job id via /proc, cached per (pid, start time) so a reused pid is looked up again.

    Args:
        proc_root: the proc filesystem (``/proc``).
    """

    def __init__(self, proc_root: str = "/proc") -> None:
        self.proc = Path(proc_root)
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
        job = self._from_environ(pid)
        if job is None:
            job = self._from_cgroup(pid)
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
