"""pid -> Slurm job id for the node sampler, through /proc (read as root).

The answer decides whose grant a process counts against and whom the watchdog stops, so only evidence Slurm
created counts, most trusted first:

1. **Slurm's cgroup of the job.** A line of ``/proc/<pid>/cgroup`` counts only when its path is in Slurm's own
   tree, as Slurm's cgroup plugins name it: cgroup v2 ``/system.slice/slurmstepd.scope/job_<N>/...`` (or
   ``/system.slice/<node>_slurmstepd.scope/...`` with several slurmd per host; ``src/plugins/cgroup/v2``),
   cgroup v1 ``/slurm/uid_<U>/job_<N>/...`` (or ``/slurm_<node>/...``; ``src/plugins/cgroup/v1``). The path
   alone is not enough (a user's delegated systemd subtree can hold ``.../app.slice/job_29``; a v1
   ``uid_<U>`` directory is the user's own): the ``job_<N>`` directory on the cgroup filesystem must be owned
   by root or job N's uid, v1's ``uid_<U>`` must be job N's uid, and, job N's uid unknown, only a root-owned
   directory counts. v2's line (``0::``) is read first, then v1 hierarchies in ``/proc/<pid>/cgroup`` order.
   Heterogeneous jobs: each component has its own job id, cgroup and ``slurmstepd: [<N>.<step>]``, so its
   processes count against that component, as its node Prolog recorded it.
2. **A root-owned ``slurmstepd: [<N>.<step>]`` ancestor** (proctrack without cgroups; a het step's component
   suffix ``+<k>`` is accepted after the step).
3. **No Slurm evidence** (a process that left its job: ``setsid`` and re-parented to init, without cgroups): a
   root process's own ``SLURM_JOB_ID`` counts (root is trusted). For any other process its ``SLURM_JOB_ID``
   (which its owner writes) never chooses a job: it is attributed only when the uid runs exactly one job on
   this node (``uid_jobs``) and the claim names that job; a user with several jobs here cannot bill one with
   another's processes, and another user's job is never reachable (its uid differs).

Cached per (pid, start time): a tick reads ``/proc/<pid>/stat`` per GPU process (the guard against a reused
pid); the sources are read once per process start.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence, Tuple

_V2_JOB = re.compile(r"^(?P<base>/system\.slice/(?:[^/]+_)?slurmstepd\.scope/job_(?P<job>\d+))(?:/|$)")
_V1_JOB = re.compile(r"^(?P<base>/slurm(?:_[^/]+)?/uid_(?P<uid>\d+)/job_(?P<job>\d+))(?:/|$)")
_STEPD = re.compile(rb"^slurmstepd: \[(\d+)\.[^\]\s]*\]")
MAX_ANCESTORS = 64


def cgroup_mounts(mountinfo: str = "/proc/self/mountinfo") -> Dict[str, str]:
    """Controller -> cgroup mount (``""``: v2, ``name=systemd``: named v1) from ``mountinfo``; {} if none."""
    out: Dict[str, str] = {}
    try:
        lines = Path(mountinfo).read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        left, _, right = line.partition(" - ")
        parts, rparts = left.split(), right.split()
        if len(parts) < 5 or len(rparts) < 3:
            continue
        point = parts[4].replace("\\040", " ")
        if rparts[0] == "cgroup2":
            out.setdefault("", point)
        elif rparts[0] == "cgroup":
            for opt in rparts[2].split(","):
                if opt not in ("rw", "ro", "relatime", "noatime", "nosuid", "nodev", "noexec",
                               "clone_children", "xattr") and not opt.startswith("release_agent="):
                    out.setdefault(opt, point)
    return out


class JobAttributor:
    """pid -> Slurm job id (module rules), cached per (pid, start time). ``job_uid`` and ``uid_jobs`` (this
    node's jobs of a uid) come from the node database, None when unknown."""

    def __init__(self, proc_root: str = "/proc", job_uid: Optional[Callable[[int], Optional[int]]] = None,
                 uid_jobs: Optional[Callable[[int], Optional[Sequence[int]]]] = None,
                 mounts: Optional[Dict[str, str]] = None) -> None:
        self.proc = Path(proc_root)
        self.job_uid = job_uid
        self.uid_jobs = uid_jobs
        self.mounts = mounts if mounts is not None else cgroup_mounts()
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
        """The job id of ``pid``, or None (not a Slurm job, gone, unreadable, or no evidence that counts)."""
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
                return int(value) if value.isdigit() and len(value) <= 10 else None
        return None

    def _uid_of(self, job: int) -> Optional[int]:
        return self.job_uid(job) if self.job_uid is not None else None

    def _slurm_cgroup_job(self, controllers: str, path: str) -> Optional[int]:
        """The job of one ``/proc/<pid>/cgroup`` line when it is Slurm's cgroup of that job (rule 1)."""
        m = _V2_JOB.match(path) if controllers == "" else _V1_JOB.match(path)
        if not m:
            return None
        job = int(m.group("job"))
        owner_uid = self._uid_of(job)
        if controllers != "" and (owner_uid is None or int(m.group("uid")) != owner_uid):
            return None
        mount = self.mounts.get(controllers) if controllers == "" else \
            next((self.mounts[c] for c in controllers.split(",") if c in self.mounts), None)
        if mount is None:
            return None
        try:
            st = os.stat(mount + m.group("base"), follow_symlinks=False)
        except OSError:
            return None
        return job if st.st_uid == 0 or (owner_uid is not None and st.st_uid == owner_uid) else None

    def _from_cgroup(self, pid: int) -> Optional[int]:
        try:
            text = (self.proc / str(pid) / "cgroup").read_text()
        except OSError:
            return None
        lines = [(p[1], p[2]) for p in (line.split(":", 2) for line in text.splitlines()) if len(p) == 3]
        lines.sort(key=lambda cp: cp[0] != "")  # v2 first, then v1 in file order (stable sort)
        return next((j for j in (self._slurm_cgroup_job(c, p) for c, p in lines) if j is not None), None)

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
        """The job of the nearest root-owned ``slurmstepd: [<id>.<step>]`` ancestor (rule 2)."""
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
        """The process's own ``SLURM_JOB_ID`` where it cannot choose among jobs (rule 3)."""
        job = self._from_environ(pid)
        if job is None:
            return None
        uid, _ = self._status(pid)
        if uid == 0:
            return job
        if uid is None or self._uid_of(job) != uid or self.uid_jobs is None:
            return None
        return job if list(self.uid_jobs(uid) or ()) == [job] else None
