"""What one sampling step reads: dataclasses shared by the live NVML reader and the replay (pure)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Dict, List, Optional


@dataclass(frozen=True)
class GpuReading:
    """One GPU at one instant. None = NVML lacks the metric (NULL in the database, never 0).

    Attributes:
        index: NVML device index; uuid: ``GPU-...``.
        util_pct / mem_util_pct: coarse NVML utilization rates (0..100).
        mem_used_mib / mem_total_mib: device memory (MiB).
        power_w: board power (W, from mW); energy_j: total energy counter since driver load (J, from mJ).
        temp_c: GPU temperature (C); sm_clock_mhz: current SM clock (MHz).
        smact_pct / smocc_pct / tensor_pct / dram_bw_pct: GPM SM activity, SM occupancy, any-tensor activity and
            DRAM bandwidth utilization (0..100) over the window since the previous sample (Hopper+ only).
    """

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
    """One process using a GPU. ``used_mem_mib`` is NVML's per-process figure (CUDA context included);
    ``sm_util_pct``/``mem_util_pct`` come from nvmlDeviceGetProcessUtilization (None when it has no sample);
    ``mps_client``: listed by nvmlDeviceGetMPSComputeRunningProcesses."""

    gpu_index: int
    pid: int
    used_mem_mib: Optional[float] = None
    sm_util_pct: Optional[float] = None
    mem_util_pct: Optional[float] = None
    mps_client: bool = False


@dataclass
class Frame:
    """One sampling step: wall time ``ts`` (s since epoch), GPUs, processes; ``error`` when the read failed."""

    ts: float
    gpus: List[GpuReading] = field(default_factory=list)
    procs: List[ProcReading] = field(default_factory=list)
    error: Optional[str] = None

    def to_json(self, t0: float = 0.0) -> Dict[str, Any]:
        """A JSON-able dict with ``t`` = seconds since ``t0`` (the recording format)."""
        out: Dict[str, Any] = {"t": round(self.ts - t0, 4), "gpus": [asdict(g) for g in self.gpus],
                               "procs": [asdict(p) for p in self.procs]}
        if self.error:
            out["error"] = self.error
        return out

    @classmethod
    def from_json(cls, data: Dict[str, Any], ts: float) -> "Frame":
        """Inverse of ``to_json`` with the frame placed at wall time ``ts``; unknown keys are ignored."""
        gnames = {f.name for f in fields(GpuReading)}
        pnames = {f.name for f in fields(ProcReading)}
        return cls(ts=ts,
                   gpus=[GpuReading(**{k: v for k, v in g.items() if k in gnames}) for g in data.get("gpus", [])],
                   procs=[ProcReading(**{k: v for k, v in p.items() if k in pnames}) for p in data.get("procs", [])],
                   error=data.get("error"))
