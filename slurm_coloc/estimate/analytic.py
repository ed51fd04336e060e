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
from slurm_coloc.estimate.trace import TraceResult
from slurm_coloc.estimate.tracker import MIB


def analytic_mib(trace: TraceResult, gpu: GpuModel) -> float:
    """Analytical peak per-process NVML memory in MiB for a traced spec on ``gpu``.

    Args:
        trace: the traced step (``peak_reserved_b`` in bytes, from the allocator replay).
        gpu: the GPU model (``context_mib``, ``libs_mib`` in MiB).

    Returns:
        ``context_mib + libs_mib + peak_reserved_b / 2**20`` (MiB, not rounded; module docstring).
    """
    return gpu.context_mib + gpu.libs_mib + trace.peak_reserved_b / MIB


def analytic_detail(trace: TraceResult, gpu: GpuModel) -> Dict[str, Any]:
    """The components of :func:`analytic_mib`, rounded to 0.1 MiB, for ``Estimate.detail``.

    Args:
        trace: the traced step (bytes).
        gpu: the GPU model (MiB).

    Returns:
        ``context_mib``, ``libs_mib``, ``params_mib``, ``peak_allocated_mib``, ``peak_reserved_mib`` and
        ``analytic_mib`` (MiB).
    """
    return {
        "context_mib": gpu.context_mib,
        "libs_mib": gpu.libs_mib,
        "params_mib": round(trace.param_b / MIB, 1),
        "peak_allocated_mib": round(trace.peak_allocated_b / MIB, 1),
        "peak_reserved_mib": round(trace.peak_reserved_b / MIB, 1),
        "analytic_mib": round(analytic_mib(trace, gpu), 1),
    }
