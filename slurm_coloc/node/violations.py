"""What the GPU watchdog (node/watchdog.py, which states the rules) finds in one frame, as pure functions: the
shard jobs on this node (``Tenant``), a job over its grant or with a process outside MPS (``Finding``),
whether a job is near its grant, and the line the job's stderr gets.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from slurm_coloc.nvml.readings import ProcLists


@dataclass(frozen=True)
class Tenant:
    """A shard job on this node: the GPU it holds shards of (NVML index), its grant (MiB),
    ``mps``/``timeslice``."""

    job_id: int
    gpu_index: int
    grant_mib: float
    share: str
    uid: Optional[int] = None


@dataclass(frozen=True)
class Finding:
    """A tenant over its grant (``over-grant``) or outside MPS (``outside-mps``) on GPU ``gpu_index`` in one
    frame.

    ``used_mib``: the job's summed NVML memory on that GPU; ``pids``: its processes there (for outside-mps:
    the processes outside MPS).
    """

    job_id: int
    gpu_index: int
    reason: str
    share: str
    grant_mib: float
    used_mib: float
    pids: Tuple[int, ...]

    @property
    def key(self) -> Tuple[int, int, str]:
        return (self.job_id, self.gpu_index, self.reason)


def find_violations(lists: Sequence[ProcLists], job_of: Mapping[int, Optional[int]],
                    tenants: Mapping[int, Tenant],
                    tolerance_mib: float) -> List[Finding]:
    """Tenants over grant + ``tolerance_mib`` on a GPU, and MPS tenants with a process outside MPS (pure).

    ``job_of`` gives None for a pid of no Slurm job (e.g. the MPS server).
    """
    out: List[Finding] = []
    for gl in lists:
        if gl.compute is None and gl.mps is None:
            continue
        mem: Dict[int, float] = {}
        pids: Dict[int, List[int]] = {}
        for pid, mib in _per_pid(gl).items():
            job = job_of.get(pid)
            if job is None or job not in tenants:
                continue
            mem[job] = mem.get(job, 0.0) + (mib or 0.0)
            pids.setdefault(job, []).append(pid)
        mps_pids = None if gl.mps is None else {pid for pid, _ in gl.mps}
        for job, used in sorted(mem.items()):
            t = tenants[job]
            grant = t.grant_mib if t.gpu_index == gl.gpu_index else 0.0
            if used > grant + tolerance_mib:
                out.append(Finding(job, gl.gpu_index, "over-grant", t.share, grant, round(used, 1),
                                   tuple(sorted(pids[job]))))
            if t.share == "mps" and t.gpu_index == gl.gpu_index and mps_pids is not None \
                    and gl.compute is not None:
                outside = tuple(sorted(pid for pid, _ in gl.compute if job_of.get(pid) == job
                                       and pid not in mps_pids))
                if outside:
                    out.append(Finding(job, gl.gpu_index, "outside-mps", t.share, grant, round(used, 1),
                                       outside))
    return out


def _per_pid(gl: ProcLists) -> Dict[int, Optional[float]]:
    """pid -> MiB over both lists of one GPU: the compute list's figure, else the MPS list's (as
    nvml/reader.py)."""
    out: Dict[int, Optional[float]] = {pid: mib for pid, mib in gl.compute or ()}
    for pid, mib in gl.mps or ():
        if out.get(pid) is None:
            out[pid] = mib
    return out


def near_grant(lists: Sequence[ProcLists], job_of: Mapping[int, Optional[int]], tenants: Mapping[int, Tenant],
               near_pct: float) -> bool:
    """Whether a tenant's memory on its GPU is above ``near_pct`` % of its grant (pure; MiB)."""
    for gl in lists:
        used: Dict[int, float] = {}
        for pid, mib in _per_pid(gl).items():
            job = job_of.get(pid)
            if job is not None and job in tenants and tenants[job].gpu_index == gl.gpu_index:
                used[job] = used.get(job, 0.0) + (mib or 0.0)
        if any(u > tenants[j].grant_mib * near_pct / 100.0 for j, u in used.items()):
            return True
    return False


def user_message(f: Finding, tolerance_mib: float, action: str) -> str:
    """The one line the job's stderr gets for a confirmed finding."""
    did = "stopped" if action == "stop" else "recorded"
    if f.reason == "outside-mps":
        what = (f"process(es) {', '.join(map(str, f.pids))} ran on shared GPU {f.gpu_index} outside the "
                "job's MPS "
                f"server (CUDA_MPS_PIPE_DIRECTORY changed or unset)")
    else:
        what = (f"its processes used {f.used_mib:,.0f} MiB of shared GPU {f.gpu_index}, over its grant of "
                f"{f.grant_mib:,.0f} MiB (+{tolerance_mib:,.0f} MiB tolerance)")
    return (f"slurm-coloc: job {f.job_id} {did} by the GPU watchdog: {what}; a job on a shared GPU must stay "
            "within "
            f"its memory request (#COLOC mem / --gres=shard). It is not rerun.")
