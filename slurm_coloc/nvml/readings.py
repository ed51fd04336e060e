"""What one sampling step reads (shared by the live NVML reader and the replay), and the replay of an NVML
recording for machines without a GPU (CI and demos, never production).

A recording (``coloc-sampler record``) is JSON lines: a header ``{"recording": "<what/where>", ...}``, then
one frame per line ``{"t": s since start, "gpus": [...], "procs": [...]}`` (``"error"``: the read failed).
Replay serves the frames in order at the current wall time, starting over at the end.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from slurm_coloc.errors import ColocError


@dataclass(frozen=True)
class GpuReading:
    """One GPU at one instant; None: NVML lacks the metric (NULL, never 0). Percentages 0..100 (``smact_pct``,
    ``smocc_pct``, ``tensor_pct``, ``dram_bw_pct``: GPM's since the previous sample, Hopper+); memory MiB;
    ``energy_j``: the counter since driver load."""

    index: int
    uuid: Optional[str] = None
    name: Optional[str] = None
    util_pct: Optional[float] = None
    mem_util_pct: Optional[float] = None
    mem_used_mib: Optional[float] = None
    mem_total_mib: Optional[float] = None
    power_w: Optional[float] = None
    energy_j: Optional[float] = None
    temp_c: Optional[float] = None
    sm_clock_mhz: Optional[float] = None
    smact_pct: Optional[float] = None
    smocc_pct: Optional[float] = None
    tensor_pct: Optional[float] = None
    dram_bw_pct: Optional[float] = None


@dataclass(frozen=True)
class ProcReading:
    """One process using a GPU: ``used_mem_mib`` NVML's per-process figure (CUDA context included);
    utilization None when nvmlDeviceGetProcessUtilization has no sample."""

    gpu_index: int
    pid: int
    used_mem_mib: Optional[float] = None
    sm_util_pct: Optional[float] = None
    mem_util_pct: Optional[float] = None
    mps_client: bool = False


PidMib = Tuple[int, Optional[float]]


@dataclass(frozen=True)
class ProcLists:
    """NVML's two process lists of one GPU: ``(pid, MiB or None)`` pairs; None: the query failed (``mps``:
    also not supported). Measured on the H100 (benchmarks/device/results/h100-mps-limits): a client outside
    MPS is in ``compute`` only, an MPS client in both, the MPS server in ``compute`` only (66 MiB)."""

    gpu_index: int
    compute: Optional[Tuple[PidMib, ...]] = None
    mps: Optional[Tuple[PidMib, ...]] = None
    derived: bool = False

    def to_json(self) -> Dict[str, Any]:
        """``{"gpu_index", "compute": [[pid, mib], ...] | null, "mps": ...}`` (recording format)."""
        return {"gpu_index": self.gpu_index,
                "compute": None if self.compute is None else [list(x) for x in self.compute],
                "mps": None if self.mps is None else [list(x) for x in self.mps]}

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "ProcLists":
        """Inverse of ``to_json``: ``{"gpu_index", "compute": [[pid, mib], ...] | null, "mps": ...}``."""
        def pairs(v: Any) -> Optional[Tuple[PidMib, ...]]:
            return None if v is None else tuple((int(x[0]), None if x[1] is None else float(x[1])) for x in v)
        return cls(gpu_index=int(data["gpu_index"]), compute=pairs(data.get("compute")),
                   mps=pairs(data.get("mps")))


def derive_lists(gpus: List[GpuReading], procs: List[ProcReading]) -> List[ProcLists]:
    """One ``ProcLists`` per GPU for a recording made before they existed: compute = the processes with a
    known memory, MPS = the MPS clients."""
    out = []
    for g in gpus:
        mine = [p for p in procs if p.gpu_index == g.index]
        out.append(ProcLists(g.index,
                             tuple((p.pid, p.used_mem_mib) for p in mine if p.used_mem_mib is not None),
                             tuple((p.pid, p.used_mem_mib) for p in mine if p.mps_client), derived=True))
    return out


@dataclass
class Frame:
    """One sampling step at wall time ``ts`` (Unix s); ``lists``: the watchdog's input (empty: not read)."""

    ts: float
    gpus: List[GpuReading] = field(default_factory=list)
    procs: List[ProcReading] = field(default_factory=list)
    error: Optional[str] = None
    lists: List[ProcLists] = field(default_factory=list)

    def to_json(self, t0: float = 0.0) -> Dict[str, Any]:
        """``{"t", "gpus", "procs"}`` (+ ``lists``, ``error`` when set); ``t``: s since ``t0``, to 0.1 ms."""
        out: Dict[str, Any] = {"t": round(self.ts - t0, 4), "gpus": [asdict(g) for g in self.gpus],
                               "procs": [asdict(p) for p in self.procs]}
        if self.lists:
            out["lists"] = [x.to_json() for x in self.lists]
        if self.error:
            out["error"] = self.error
        return out

    @classmethod
    def from_json(cls, data: Dict[str, Any], ts: float) -> "Frame":
        """Inverse of ``to_json`` at wall time ``ts``; unknown keys ignored, lists derived if absent."""
        gnames = {f.name for f in fields(GpuReading)}
        pnames = {f.name for f in fields(ProcReading)}
        gpus = [GpuReading(**{k: v for k, v in g.items() if k in gnames}) for g in data.get("gpus", [])]
        procs = [ProcReading(**{k: v for k, v in p.items() if k in pnames}) for p in data.get("procs", [])]
        lists = ([ProcLists.from_json(x) for x in data["lists"]] if data.get("lists") is not None
                 else derive_lists(gpus, procs))
        return cls(ts=ts, gpus=gpus, procs=procs, error=data.get("error"), lists=lists)


class ReplayReader:
    """Serve recorded frames (a ``*.jsonl`` file) as if read now; ``pid_map`` maps recorded pids to live ones
    (attribution through /proc on a real Slurm job). Raises ColocError: no file, header or frame."""

    def __init__(self, path: str, pid_map: Optional[Mapping[int, int]] = None) -> None:
        p = Path(path)
        try:
            lines = [ln for ln in p.read_text(encoding="utf-8").splitlines() if ln.strip()]
        except OSError as exc:
            raise ColocError(f"cannot read NVML recording {path!r}: {exc}") from None
        try:
            rows: List[Dict[str, Any]] = [json.loads(ln) for ln in lines]
        except json.JSONDecodeError as exc:
            raise ColocError(f"NVML recording {path!r} is not JSON lines: {exc}") from None
        if not rows or "recording" not in rows[0]:
            raise ColocError(f"NVML recording {path!r} has no header line with a 'recording' label")
        self.header = rows[0]
        self.frames = rows[1:]
        if not self.frames:
            raise ColocError(f"NVML recording {path!r} holds no frame")
        self.pid_map = dict(pid_map or {})
        self._next = 0

    def read(self) -> Frame:
        """The next recorded frame, stamped with the current wall time."""
        data = self.frames[self._next % len(self.frames)]
        self._next += 1
        frame = Frame.from_json(data, ts=time.time())
        if self.pid_map:
            m = self.pid_map
            frame.procs = [replace(p, pid=m.get(p.pid, p.pid)) for p in frame.procs]
            frame.lists = [replace(x, compute=_mapped(x.compute, m), mps=_mapped(x.mps, m))
                           for x in frame.lists]
        return frame

    def close(self) -> None:
        pass


def _mapped(pairs: Optional[Tuple[PidMib, ...]], pid_map: Mapping[int, int]) -> Optional[Tuple[PidMib, ...]]:
    return None if pairs is None else tuple((pid_map.get(pid, pid), mib) for pid, mib in pairs)


class RecordedComputeModes:
    """``ComputeModes`` over recorded GPU states (e.g. the H100's ``DEFAULT`` in
    benchmarks/device/results/h100-mps-limits), for CI; calls noted in ``calls``; ``fail_set``: ``set`` raises
    ``ColocError`` as NVML without permission."""

    def __init__(self, modes: Mapping[int, str], fail_set: bool = False) -> None:
        self.modes = dict(modes)
        self.fail_set = fail_set
        self.calls: List[tuple] = []

    def get(self, index: int) -> str:
        """Raises ColocError: the recording has no such GPU."""
        if index not in self.modes:
            raise ColocError(f"GPU {index}: not in the recording")
        return self.modes[index]

    def set(self, index: int, mode: str) -> None:
        """Keep ``mode`` (not checked) in memory. Raises ColocError with ``fail_set`` (mode unchanged)."""
        self.calls.append(("set", index, mode))
        if self.fail_set:
            raise ColocError(f"GPU {index}: cannot set compute mode {mode}: Insufficient Permissions")
        self.modes[index] = mode
