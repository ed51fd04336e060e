"""CPU use of each job with a process on a GPU, for the node sampler (through /proc and the job's cgroup).

Per tick and job, from the job's CUDA processes (the pids NVML lists, attributed by node/attribution.py):

- ``train_cores``: cores the CUDA process(es) used since the job's previous reading (utime + stime of
  ``/proc/<pid>/stat``, all threads, over the wall time between readings);
- ``workers`` / ``workers_cores``: how many processes descend from them (DataLoader workers and their
  children, found through ``/proc/<pid>/task/<tid>/children`` every ``tree_refresh_s`` and whenever the CUDA
  pids change) and the cores they used. A worker first seen counts its whole CPU time; one that exited between
  readings loses its last interval. None without ``children`` files (CONFIG_PROC_CHILDREN);
- ``job_cores``: cores used by the job's whole cgroup (v2 ``cpu.stat`` ``usage_usec``, v1
  ``cpuacct.usage``), None without one (proctrack/linuxproc);
- ``cpus``: the job's CPUs here: the CUDA process's ``SLURM_CPUS_ON_NODE`` (its user could change it, which
  only changes the advice on their own job) capped by its ``sched_getaffinity``; the affinity alone where the
  variable is missing or unreadable (a sampler not running as root).

A job's first reading only sets its baseline. Cost per tick and job: one ``stat`` read per process and one
cgroup read; every ``tree_refresh_s`` one ``children`` read per thread (a PyTorch process has a few dozen:
most of the cost, hence not every tick). Measured figures: docs/node.md.
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

CLK_TCK = os.sysconf("SC_CLK_TCK")
MAX_TREE = 512  # processes followed per job and tick (a fork bomb costs the sampler no more than this)
TREE_REFRESH_S = 5.0
PidKey = Tuple[int, bytes]  # (pid, start time): a reused pid is another process


@dataclass(frozen=True)
class JobCpu:
    """One job's CPU use over the interval ending at a reading (cores = CPU seconds per wall second)."""

    job_id: int
    train_pids: int
    train_cores: float
    workers: Optional[int]
    workers_cores: Optional[float]
    job_cores: Optional[float]
    cpus: Optional[int]


@dataclass
class _JobState:
    t: float
    cgroup_usage_s: Optional[float]


def _stat(proc: str, pid: int) -> Optional[Tuple[bytes, float]]:
    """(start time, utime + stime in s) of ``pid`` from ``/proc/<pid>/stat``; None when gone or unreadable."""
    try:
        fd = os.open(f"{proc}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    i = raw.rfind(b")")
    rest = raw[i + 1:].split() if i >= 0 else []
    if len(rest) < 20:
        return None
    try:
        return rest[19], (int(rest[11]) + int(rest[12])) / CLK_TCK
    except ValueError:
        return None


class CpuReader:
    """Reads the CPU use of jobs' process trees; keeps each process's and job's previous reading.

    ``clock``: monotonic seconds; ``tree_refresh_s``: how often a tree is walked again for new workers (0:
    every reading).
    """

    def __init__(self, proc_root: str = "/proc", cgroup_root: str = "/sys/fs/cgroup",
                 clock: Callable[[], float] = time.monotonic, tree_refresh_s: float = TREE_REFRESH_S) -> None:
        self.proc, self.cgroup_root, self.clock = proc_root, cgroup_root, clock
        self.tree_refresh_s = tree_refresh_s
        self._tree: Dict[int, Tuple[float, Tuple[int, ...], Optional[List[int]]]] = {}
        self._cpu: Dict[PidKey, float] = {}
        self._jobs: Dict[int, _JobState] = {}
        self._cgroup_file: Dict[int, Optional[str]] = {}
        self._cpus: Dict[int, Optional[int]] = {}
        self.children_supported: Optional[bool] = None

    def read(self, job_pids: Mapping[int, Sequence[int]]) -> List[JobCpu]:
        """A ``JobCpu`` per job also seen last time (cores = CPU seconds per wall second since then)."""
        now = self.clock()
        cpu_now: Dict[PidKey, float] = {}
        out: List[JobCpu] = []
        for job_id, pids in job_pids.items():
            row = self._read_job(job_id, sorted(set(pids)), now, cpu_now)
            if row is not None:
                out.append(row)
        for gone in set(self._jobs) - set(job_pids):
            del self._jobs[gone]
            self._cgroup_file.pop(gone, None)
            self._tree.pop(gone, None)
            self._cpus.pop(gone, None)
        self._cpu = cpu_now
        return out

    def _read_job(self, job_id: int, pids: List[int], now: float,
                  cpu_now: Dict[PidKey, float]) -> Optional[JobCpu]:
        prev = self._jobs.get(job_id)
        train_s = 0.0
        train: Set[int] = set()
        for pid in pids:
            st = _stat(self.proc, pid)
            if st is None:
                continue
            train.add(pid)
            cpu_now[(pid, st[0])] = st[1]
            train_s += st[1] - self._cpu.get((pid, st[0]), st[1])  # first seen: baseline
        workers_s: Optional[float] = 0.0
        n_workers: Optional[int] = 0
        fresh, tree = self._workers_of(job_id, train, now)
        if tree is None:
            workers_s = n_workers = None
        else:
            for pid in tree:
                st = _stat(self.proc, pid)
                if st is None:
                    continue
                old = self._cpu.get((pid, st[0]))
                if old is None and not fresh:
                    continue  # the pid was reused since the walk: not the worker it found
                cpu_now[(pid, st[0])] = st[1]
                n_workers += 1  # type: ignore[operator]
                if old is not None:
                    workers_s += st[1] - old  # type: ignore[operator]
                elif prev is not None:
                    workers_s += st[1]  # type: ignore[operator]  # started since the previous walk
        usage = self._cgroup_usage_s(job_id, pids)
        self._jobs[job_id] = _JobState(now, usage)
        if prev is None or not train:
            return None
        dt = now - prev.t
        if dt <= 0:
            return None
        job_cores = None
        if usage is not None and prev.cgroup_usage_s is not None and usage >= prev.cgroup_usage_s:
            job_cores = round((usage - prev.cgroup_usage_s) / dt, 3)
        return JobCpu(job_id=job_id, train_pids=len(train), train_cores=round(max(0.0, train_s) / dt, 3),
                      workers=n_workers,
                      workers_cores=None if workers_s is None else round(max(0.0, workers_s) / dt, 3),
                      job_cores=job_cores, cpus=self._allowed_cpus(job_id, min(train)))

    def _workers_of(self, job_id: int, train: Set[int], now: float) -> Tuple[bool, Optional[List[int]]]:
        """(walked now, the job's descendant pids): walked again every ``tree_refresh_s`` or when its CUDA
        pids changed, else the last walk's pids (those still alive and not reused count)."""
        key = tuple(sorted(train))
        hit = self._tree.get(job_id)
        if hit is None or hit[1] != key or now - hit[0] >= self.tree_refresh_s:
            self._tree[job_id] = (now, key, self._descendants(train))
            return True, self._tree[job_id][2]
        return False, hit[2]

    def _descendants(self, roots: Set[int]) -> Optional[List[int]]:
        """Pids descending from ``roots`` (not the roots; other CUDA pids among them count as roots), at most
        ``MAX_TREE``; None when ``/proc/<pid>/task/<tid>/children`` does not exist on this kernel."""
        out: List[int] = []
        seen = set(roots)
        todo = list(roots)
        while todo and len(out) < MAX_TREE:
            pid = todo.pop()
            try:
                tids = os.listdir(f"{self.proc}/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                try:
                    with open(f"{self.proc}/{pid}/task/{tid}/children", "rb") as fh:
                        kids = fh.read().split()
                    self.children_supported = True
                except FileNotFoundError:
                    if self.children_supported is None and os.path.isdir(f"{self.proc}/{pid}/task/{tid}"):
                        self.children_supported = False
                    if self.children_supported is False:
                        return None
                    continue
                except OSError:
                    continue
                for k in kids:
                    child = int(k)
                    if child not in seen:
                        seen.add(child)
                        out.append(child)
                        todo.append(child)
        return out[:MAX_TREE]

    def _cgroup_usage_s(self, job_id: int, pids: Sequence[int]) -> Optional[float]:
        """CPU seconds used so far by the job's cgroup (``.../job_<id>``), None without one."""
        if job_id not in self._cgroup_file:
            self._cgroup_file[job_id] = next((f for f in (self._find_cgroup(job_id, p) for p in pids) if f),
                                             None)
        path = self._cgroup_file[job_id]
        if path is None:
            return None
        try:
            with open(path, "rb") as fh:
                data = fh.read(4096)
        except OSError:
            return None
        if path.endswith("cpuacct.usage"):
            return int(data.strip() or b"0") / 1e9
        for line in data.splitlines():
            if line.startswith(b"usage_usec "):
                return int(line.split()[1]) / 1e6
        return None

    def _find_cgroup(self, job_id: int, pid: int) -> Optional[str]:
        """The usage file of ``pid``'s ``job_<id>`` cgroup: v2 ``cpu.stat`` or v1 ``cpuacct.usage``."""
        try:
            with open(f"{self.proc}/{pid}/cgroup", "r", encoding="utf-8", errors="replace") as fh:
                lines = fh.read(65536).splitlines()
        except OSError:
            return None
        job_dir = re.compile(rf"^(.*/job_{job_id})(?:/|$)")
        for line in lines:
            hier, _, rest = line.partition(":")
            controllers, _, path = rest.partition(":")
            m = job_dir.match(path)
            if m is None:
                continue
            if hier == "0" and controllers == "":
                candidates = [f"{self.cgroup_root}{m.group(1)}/cpu.stat"]
            elif "cpuacct" in controllers.split(","):
                candidates = [f"{self.cgroup_root}/{d}{m.group(1)}/cpuacct.usage"
                              for d in (controllers, "cpuacct")]
            else:
                continue
            for f in candidates:
                if os.path.exists(f):
                    return f
        return None

    def _allowed_cpus(self, job_id: int, pid: int) -> Optional[int]:
        if job_id not in self._cpus:
            try:
                allowed: Optional[int] = len(os.sched_getaffinity(pid)) if self.proc == "/proc" else None
            except OSError:
                allowed = None
            slurm = self._slurm_cpus(pid)
            self._cpus[job_id] = min(x for x in (allowed, slurm) if x) if (allowed or slurm) else None
        return self._cpus[job_id]

    def _slurm_cpus(self, pid: int) -> Optional[int]:
        """``SLURM_CPUS_ON_NODE`` of ``pid``'s environment (a positive integer), else None."""
        try:
            with open(f"{self.proc}/{pid}/environ", "rb") as fh:
                data = fh.read(1 << 20)
        except OSError:
            return None
        for item in data.split(b"\0"):
            if item.startswith(b"SLURM_CPUS_ON_NODE="):
                value = item[19:]
                return int(value) if value.isdigit() and 0 < int(value) < 1 << 20 else None
        return None
