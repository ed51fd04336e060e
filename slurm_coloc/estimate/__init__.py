"""GPU memory estimation: peak per-process GPU memory of a PyTorch training job.

``estimate_peak(spec, gpu_model, history_mib)`` is the entry point. Importing this package is
cheap (no torch): torch is imported inside the functions that trace a model.
"""
from __future__ import annotations

from typing import Sequence

from slurm_coloc.estimate.spec import Estimate, ModelSpec

__all__ = ["Estimate", "ModelSpec", "estimate_peak"]


def estimate_peak(spec: ModelSpec, gpu_model: str = "H100", history_mib: Sequence[int] = ()) -> Estimate:
    """Estimate the peak GPU memory one training process of ``spec`` holds on ``gpu_model``.

    The figure is what NVML reports for the process: CUDA context + the caching allocator's
    peak reserved memory (+ cuBLAS/cuDNN), in MiB, for the step forward, cross-entropy,
    backward, optimizer step. See docs/estimator.md for the method and measured accuracy.

    Args:
        spec: the model, per-sample input shape, batch size, optimizer and precision.
        gpu_model: GPU name (``H100``, ``H200``, ``NVIDIA H100 80GB HBM3``).
        history_mib: measured NVML peaks (MiB) of earlier runs of the same spec, if any.

    Returns:
        Estimate with ``mem_mib`` (int, MiB), ``method`` and the components in ``detail``.

    Raises:
        EstimateError: unknown GPU, bad spec, or a model that cannot be imported, built or run.
    """
    from slurm_coloc.estimate.combine import combined_estimate

    return combined_estimate(spec, gpu_model, history_mib)
