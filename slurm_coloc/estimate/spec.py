"""What an estimate is asked about (ModelSpec) and what it answers (Estimate).

``ModelSpec`` is built by ``slurm_coloc.submit.directives`` from a job script's ``#COLOC``
lines; estimators take it and return an ``Estimate``. Pure data: no torch here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

OPTIMIZERS = ("sgd", "sgd-momentum", "adam", "adamw")
PRECISIONS = ("fp32", "amp-fp16", "bf16")


@dataclass(frozen=True)
class ModelSpec:
    """A training job's model as declared in ``#COLOC`` lines.

    Attributes:
        model: ``module.path:callable`` (importable) or ``path/to/file.py:callable``
            (relative paths are resolved against ``base_dir``).
        kwargs: keyword arguments for the callable (JSON values).
        input_shape: shape of ONE sample, e.g. ``(3, 32, 32)``; for token models ``(seq_len,)``.
        input_dtype: ``"float32"`` for images/features or ``"int64"`` for token ids.
        batch_size: samples per training step (>= 1).
        optimizer: one of ``OPTIMIZERS``.
        precision: one of ``PRECISIONS``.
        base_dir: directory of the job script, for relative model paths.
    """

    model: str
    input_shape: Tuple[int, ...]
    batch_size: int
    kwargs: Dict[str, Any] = field(default_factory=dict)
    input_dtype: str = "float32"
    optimizer: str = "adam"
    precision: str = "fp32"
    base_dir: str = "."

    def to_json(self) -> Dict[str, Any]:
        """A JSON-able dict (base_dir omitted: it is machine-specific)."""
        return {
            "model": self.model,
            "kwargs": dict(self.kwargs),
            "input_shape": list(self.input_shape),
            "input_dtype": self.input_dtype,
            "batch_size": self.batch_size,
            "optimizer": self.optimizer,
            "precision": self.precision,
        }


@dataclass(frozen=True)
class Estimate:
    """Peak GPU memory of one training process, as NVML reports it per process.

    Attributes:
        mem_mib: CUDA context + caching allocator's peak reserved memory, MiB.
        method: which estimator produced it: ``analytic`` (calibrated trace) or ``history``
            (earlier measured peaks).
        detail: method-specific figures (e.g. ``{"params_mib": .., "activations_mib": ..}``).
        flops_per_step: FLOPs (FLOP) of one training step counted in the trace (forward, backward, optimizer
            step; ``trace.py``), None when not counted. It does not enter ``mem_mib``.
    """

    mem_mib: int
    method: str
    detail: Dict[str, Any] = field(default_factory=dict)
    gpu_model: Optional[str] = None
    flops_per_step: Optional[int] = None
