"""The one gateway to NVML (reader.py) and its recordings (readings.py); a metric NVML lacks is None."""
from __future__ import annotations

from slurm_coloc.nvml.reader import NvmlReader, NvmlUnavailable, gpu_uuids, open_nvml
from slurm_coloc.nvml.readings import Frame, GpuReading, ProcReading, ReplayReader

__all__ = ["Frame", "GpuReading", "ProcReading", "NvmlReader", "NvmlUnavailable", "ReplayReader", "gpu_uuids",
           "open_nvml"]
