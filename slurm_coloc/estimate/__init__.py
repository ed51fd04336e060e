"""GPU memory estimation: peak per-process GPU memory of a PyTorch training job.

``estimate_peak(spec, gpu_model, history_mib)`` is the entry point. Importing this package is
cheap (no torch): torch is imported inside the functions that trace a model.
"""
from __future__ import annotations

from typing import Sequence

from slurm_coloc.estimate.spec import Estimate, ModelSpec

__all__ = ["Estimate", "ModelSpec", "estimate_peak"]


def estimate_peak(spec: ModelSpec, gpu_model: str = "H100", history_mib: Sequence[int] = ()) -> Estimate:
    """Peak GPU memory (MiB, as NVML reports it) of one training process of ``spec`` on ``gpu_model``.

    CUDA context + the caching allocator's peak reserved memory (+ cuBLAS/cuDNN) for forward, cross-entropy,
    backward, optimizer step; ``history_mib``: measured peaks of earlier runs. Method and measured accuracy:
    docs/estimator.md.

    Raises:
        EstimateError: unknown GPU, bad spec, or a model that cannot be imported, built or run.
    """
    from slurm_coloc.estimate.combine import combined_estimate

    return combined_estimate(spec, gpu_model, history_mib)
