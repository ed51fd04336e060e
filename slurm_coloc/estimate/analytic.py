"""Analytical estimate: traced peak reserved memory + CUDA context + library overhead.

Formula (MiB): ``context_mib + libs_mib + peak_reserved_b / 2**20`` where ``peak_reserved_b``
comes from replaying the traced allocations through the caching-allocator model
(``allocator.py``), which already includes block rounding, segment sizes and the cuBLAS
workspace. cuDNN convolution workspaces are not visible to the trace; the combination step
(``combine.py``) calibrates for them on measured data.
"""
from __future__ import annotations

from typing import Any, Dict

from slurm_coloc.estimate.gpus import GpuModel
from slurm_coloc.estimate.trace import ReplayedPeaks
from slurm_coloc.estimate.tracker import MIB


def analytic_mib(trace: ReplayedPeaks, gpu: GpuModel) -> float:
    """``context_mib + libs_mib + peak_reserved_b / 2**20``: per-process NVML peak, MiB, not rounded."""
    return gpu.context_mib + gpu.libs_mib + trace.peak_reserved_b / MIB


def analytic_detail(trace: ReplayedPeaks, gpu: GpuModel) -> Dict[str, Any]:
    """:func:`analytic_mib`'s parts for ``Estimate.detail``, in MiB rounded to 0.1."""
    return {
        "context_mib": gpu.context_mib,
        "libs_mib": gpu.libs_mib,
        "params_mib": round(trace.param_b / MIB, 1),
        "peak_allocated_mib": round(trace.peak_allocated_b / MIB, 1),
        "peak_reserved_mib": round(trace.peak_reserved_b / MIB, 1),
        "analytic_mib": round(analytic_mib(trace, gpu), 1),
    }
