"""The one gateway to NVML (``import pynvml`` happens only here).

``open_nvml()`` initialises NVML once per process; ``NvmlReader.read()`` returns one ``Frame`` of per-GPU and
per-process readings. Every query answers a value or None: a metric NVML lacks (NotSupported, no permission, a
GPU that fell off the bus) is NULL downstream, never 0, and is logged once per (GPU, metric).
``ReplayReader`` serves frames of an NVML recording (``tests/data/nvml/*.jsonl``, made on the real H100 by
``coloc-sampler record``) so the sampler runs on machines without a GPU (CI), labelled as a recording.
"""
from __future__ import annotations

from slurm_coloc.nvml.reader import NvmlReader, NvmlUnavailable, gpu_uuids, open_nvml
from slurm_coloc.nvml.readings import Frame, GpuReading, ProcReading, ReplayReader

__all__ = ["Frame", "GpuReading", "ProcReading", "NvmlReader", "NvmlUnavailable", "ReplayReader", "gpu_uuids",
           "open_nvml"]
