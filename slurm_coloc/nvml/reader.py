"""Live NVML readings and the GPU compute mode (the only module that imports pynvml).

NVML calls used (NVML API reference, nvidia-ml-py bindings): nvmlDeviceGetUtilizationRates, GetMemoryInfo,
GetPowerUsage (mW), GetTotalEnergyConsumption (mJ), GetTemperature, GetClockInfo(SM),
GetComputeRunningProcesses, GetMPSComputeRunningProcesses, GetProcessUtilization, and the GPM API
(nvmlGpmQueryDeviceSupport, nvmlGpmSampleAlloc, nvmlGpmSampleGet, nvmlGpmMetricsGet): GPM metrics are computed
between two samples, which must be at least 100 ms apart, so the first read of a device has GPM columns None.
Every query answers a value or None: a metric NVML lacks (NotSupported, no permission, a GPU that fell off the
bus) is NULL downstream, never 0, and is logged once per (GPU, metric).

The compute mode (root only for ``set``) is the MPS protection of a shared GPU: NVIDIA's MPS documentation
runs it in ``EXCLUSIVE_PROCESS`` so that only the MPS server opens a context; a job that leaves its MPS pipe
directory then fails to create a context instead of allocating beside the server. NVML calls:
``nvmlDeviceGetComputeMode`` / ``nvmlDeviceSetComputeMode`` (``MODE_NAMES``: NVML's ``NVML_COMPUTEMODE_*``
values). The setting does not survive a driver reload or reboot. Nothing in slurm-coloc calls ``set`` unless
the admin chose ``mps_compute_mode: exclusive-process``.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, List, Optional, Protocol, Set, Tuple

from slurm_coloc.errors import ColocError
from slurm_coloc.nvml.readings import Frame, GpuReading, ProcLists, ProcReading

log = logging.getLogger("slurm_coloc.nvml")

GPM_MIN_WINDOW_S = 0.1
MIB = 1024 * 1024
MODE_NAMES: Dict[int, str] = {0: "DEFAULT", 1: "EXCLUSIVE_THREAD", 2: "PROHIBITED", 3: "EXCLUSIVE_PROCESS"}
MODE_VALUES: Dict[str, int] = {v: k for k, v in MODE_NAMES.items()}
EXCLUSIVE_PROCESS = "EXCLUSIVE_PROCESS"
DEFAULT = "DEFAULT"


class NvmlUnavailable(ColocError):
    """NVML cannot be loaded or initialised (no driver, no GPU, no nvidia-ml-py)."""


_pynvml: Any = None


def open_nvml() -> Any:
    """pynvml, imported and initialised once per process. Raises NvmlUnavailable: no nvidia-ml-py/driver."""
    global _pynvml
    if _pynvml is not None:
        return _pynvml
    try:
        import pynvml  # the one import of pynvml in slurm-coloc
    except ImportError:
        raise NvmlUnavailable("nvidia-ml-py is not installed",
                              hint="pip install 'slurm-coloc[gpu]'") from None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        raise NvmlUnavailable(f"NVML cannot be initialised: {exc}",
                              hint="is the NVIDIA driver loaded on this node?") from None
    _pynvml = pynvml
    return pynvml


def gpu_uuids() -> Dict[int, str]:
    """``{nvml index: "GPU-..."}`` of this node's GPUs. Raises NvmlUnavailable."""
    nv = open_nvml()
    out = {}
    for i in range(nv.nvmlDeviceGetCount()):
        uuid = nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(i))
        out[i] = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    return out


class NvmlReader:
    """Reads all GPUs of this node and their processes; survives NVML errors per call. ``gpm``: GPM metrics
    where ``nvmlGpmQueryDeviceSupport`` allows."""

    GPM_METRICS = (("smact_pct", 2), ("smocc_pct", 3), ("tensor_pct", 5), ("dram_bw_pct", 10))

    def __init__(self, gpm: bool = True) -> None:
        self.nv = open_nvml()
        self._logged: Set[Tuple[int, str, str]] = set()
        self._handles: Dict[int, Any] = {}
        self._gpm: Dict[int, List[Any]] = {}          # index -> [prev sample, cur sample]
        self._gpm_ts: Dict[int, float] = {}           # index -> monotonic time of prev sample
        self._util_ts_us: Dict[int, int] = {}
        self._static: Dict[int, Tuple[Optional[str], Optional[str]]] = {}
        self.gpm_wanted = gpm
        self._discover()

    def _discover(self) -> None:
        nv = self.nv
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            self._handles[i] = h
            uuid = self._q(i, "uuid", nv.nvmlDeviceGetUUID, h)
            name = self._q(i, "name", nv.nvmlDeviceGetName, h)
            self._static[i] = (_s(uuid), _s(name))
            if self.gpm_wanted:
                sup = self._q(i, "gpm_support", nv.nvmlGpmQueryDeviceSupport, h)
                if sup is not None and getattr(sup, "isSupportedDevice", False):
                    self._gpm[i] = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
                else:
                    log.info("GPU %d: GPM not supported; SM activity/occupancy columns stay NULL", i)

    def _q(self, index: int, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Call an NVML function; return None on any NVML error, logging each (GPU, metric, error) once."""
        try:
            return fn(*args)
        except self.nv.NVMLError as exc:
            key = (index, what, str(exc))
            if key not in self._logged:
                self._logged.add(key)
                log.warning("GPU %d: %s unavailable: %s (stored as NULL)", index, what, exc)
            return None

    def _gpm_read(self, index: int) -> Dict[str, Optional[float]]:
        out: Dict[str, Optional[float]] = {name: None for name, _ in self.GPM_METRICS}
        pair = self._gpm.get(index)
        if pair is None:
            return out
        nv = self.nv
        now = time.monotonic()
        prev_ts = self._gpm_ts.get(index)
        if prev_ts is not None and now - prev_ts < GPM_MIN_WINDOW_S:
            return out  # too soon: keep the old window open
        if self._q(index, "gpm_sample", nv.nvmlGpmSampleGet, self._handles[index], pair[1]) is None:
            return out
        if prev_ts is not None:
            mg = nv.c_nvmlGpmMetricsGet_t()
            mg.version = nv.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(self.GPM_METRICS)
            mg.sample1, mg.sample2 = pair[0], pair[1]
            for k, (_, mid) in enumerate(self.GPM_METRICS):
                mg.metrics[k].metricId = mid
            if self._q(index, "gpm_metrics", nv.nvmlGpmMetricsGet, mg) is not None:
                for k, (name, _) in enumerate(self.GPM_METRICS):
                    m = mg.metrics[k]
                    if m.nvmlReturn == 0:
                        out[name] = float(m.value)
                    elif (index, name, "ret") not in self._logged:
                        self._logged.add((index, name, "ret"))
                        log.warning("GPU %d: GPM %s returned NVML error %d (NULL)", index, name, m.nvmlReturn)
        pair.reverse()  # the current sample becomes the window's start
        self._gpm_ts[index] = now
        return out

    def _gpu(self, index: int) -> GpuReading:
        nv, h = self.nv, self._handles[index]
        util = self._q(index, "utilization", nv.nvmlDeviceGetUtilizationRates, h)
        mem = self._q(index, "memory", nv.nvmlDeviceGetMemoryInfo, h)
        power = self._q(index, "power", nv.nvmlDeviceGetPowerUsage, h)
        energy = self._q(index, "energy", nv.nvmlDeviceGetTotalEnergyConsumption, h)
        temp = self._q(index, "temperature", nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
        clock = self._q(index, "sm_clock", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
        uuid, name = self._static[index]
        return GpuReading(
            index=index, uuid=uuid, name=name,
            util_pct=_f(getattr(util, "gpu", None)), mem_util_pct=_f(getattr(util, "memory", None)),
            mem_used_mib=_div(getattr(mem, "used", None), MIB),
            mem_total_mib=_div(getattr(mem, "total", None), MIB),
            power_w=_div(power, 1000), energy_j=_div(energy, 1000), temp_c=_f(temp), sm_clock_mhz=_f(clock),
            **self._gpm_read(index))

    def _lists(self, index: int) -> ProcLists:
        """NVML's compute and MPS process lists of GPU ``index`` (None for a list whose query failed)."""
        nv, h = self.nv, self._handles[index]
        compute = self._q(index, "compute_processes", nv.nvmlDeviceGetComputeRunningProcesses, h)
        mps = self._q(index, "mps_processes", nv.nvmlDeviceGetMPSComputeRunningProcesses, h)

        def pairs(procs: Any) -> Optional[Tuple[Tuple[int, Optional[float]], ...]]:
            return None if procs is None else tuple(
                (int(p.pid), _div(p.usedGpuMemory if isinstance(p.usedGpuMemory, int) else None, MIB))
                for p in procs)
        return ProcLists(index, pairs(compute), pairs(mps))

    def _procs(self, index: int, lists: ProcLists) -> List[ProcReading]:
        nv, h = self.nv, self._handles[index]
        mem: Dict[int, Optional[float]] = dict(lists.compute or ())
        mps: Set[int] = set()
        for pid, mib in lists.mps or ():
            mps.add(pid)
            if mem.get(pid) is None:
                mem[pid] = mib
        last = self._util_ts_us.get(index, int((time.time() - 2) * 1e6))
        sm: Dict[int, List[float]] = {}
        mu: Dict[int, List[float]] = {}
        newest = last
        try:
            samples = nv.nvmlDeviceGetProcessUtilization(h, last)
        except nv.NVMLError:  # NOT_FOUND when no process ran a kernel since ``last``: not worth a log line
            samples = []
        for s in samples:
            sm.setdefault(int(s.pid), []).append(float(s.smUtil))
            mu.setdefault(int(s.pid), []).append(float(s.memUtil))
            newest = max(newest, int(s.timeStamp))
        self._util_ts_us[index] = newest
        pids = sorted(set(mem) | set(sm))
        return [ProcReading(gpu_index=index, pid=pid, used_mem_mib=mem.get(pid),
                            sm_util_pct=_mean(sm.get(pid)), mem_util_pct=_mean(mu.get(pid)),
                            mps_client=pid in mps)
                for pid in pids]

    def read(self) -> Frame:
        """One frame of every GPU and its processes at the current wall time."""
        ts = time.time()
        frame = Frame(ts=ts)
        for index in sorted(self._handles):
            frame.gpus.append(self._gpu(index))
            lists = self._lists(index)
            frame.lists.append(lists)
            frame.procs.extend(self._procs(index, lists))
        return frame

    def close(self) -> None:
        """Free GPM samples (NVML itself stays initialised for the process)."""
        for pair in self._gpm.values():
            for s in pair:
                try:
                    self.nv.nvmlGpmSampleFree(s)
                except self.nv.NVMLError:
                    pass
        self._gpm.clear()


def _s(v: object) -> Optional[str]:
    if v is None:
        return None
    return v.decode() if isinstance(v, bytes) else str(v)


def _f(v: Optional[float]) -> Optional[float]:
    return None if v is None else float(v)


def _div(v: Optional[float], d: float) -> Optional[float]:
    return None if v is None else round(float(v) / d, 3)


def _mean(xs: Optional[List[float]]) -> Optional[float]:
    return None if not xs else sum(xs) / len(xs)


class ComputeModes(Protocol):
    """Reads and sets the compute mode of a GPU by NVML index; mode names are ``MODE_NAMES`` values."""

    def get(self, index: int) -> str:
        """The ``MODE_NAMES`` value of GPU ``index``."""
        ...

    def set(self, index: int, mode: str) -> None:
        """Set GPU ``index``'s compute mode to a ``MODE_NAMES`` value."""
        ...


def mode_name(value: Optional[int]) -> Optional[str]:
    """``MODE_NAMES[value]``; ``UNKNOWN(<n>)`` for a value NVML may add later; None for None."""
    if value is None:
        return None
    return MODE_NAMES.get(int(value), f"UNKNOWN({int(value)})")


class NvmlComputeModes:
    """``ComputeModes`` of this node's GPUs through NVML. Raises NvmlUnavailable; ColocError (each method):
    the NVML call failed (e.g. NO_PERMISSION when not root, no such GPU) or an unknown mode name."""

    def __init__(self) -> None:
        self.nv = open_nvml()

    def get(self, index: int) -> str:
        """A ``MODE_NAMES`` value, or ``UNKNOWN(<n>)``."""
        nv = self.nv
        try:
            value = nv.nvmlDeviceGetComputeMode(nv.nvmlDeviceGetHandleByIndex(int(index)))
        except nv.NVMLError as exc:
            raise ColocError(f"GPU {index}: cannot read the compute mode: {exc}") from None
        return str(mode_name(value))

    def set(self, index: int, mode: str) -> None:
        """Root only."""
        if mode not in MODE_VALUES:
            raise ColocError(f"unknown compute mode {mode!r}", hint=f"one of {', '.join(MODE_VALUES)}")
        nv = self.nv
        try:
            nv.nvmlDeviceSetComputeMode(nv.nvmlDeviceGetHandleByIndex(int(index)), MODE_VALUES[mode])
        except nv.NVMLError as exc:
            raise ColocError(f"GPU {index}: cannot set compute mode {mode}: {exc}",
                             hint="needs root; not possible inside some containers or VMs") from None
