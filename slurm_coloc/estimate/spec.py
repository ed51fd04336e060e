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

    def to_json(self) -> Dict[str, Any]:
        """The estimate as a JSON object: ``mem_mib``, ``method``, ``detail``, ``gpu_model``,
        ``flops_per_step`` (what ``from_json`` reads back; the estimate cache, the probe cache and
        coloc-sbatch's estimate child)."""
        return {"mem_mib": self.mem_mib, "method": self.method, "detail": dict(self.detail),
                "gpu_model": self.gpu_model, "flops_per_step": self.flops_per_step}

    @classmethod
    def from_json(cls, data: Any) -> "Estimate":
        """An estimate read back from ``to_json``'s object (a file or another process wrote it).

        ``detail`` absent or null reads as {}; ``gpu_model`` as given; ``flops_per_step`` absent, null or not
        a non-negative integer (entries written before FLOPs were counted) reads as None.

        Args:
            data: the decoded JSON value (``mem_mib`` in MiB, ``flops_per_step`` in FLOPs per training step).

        Returns:
            The ``Estimate``.

        Raises:
            ValueError: not an object, ``mem_mib`` not a positive integer, ``method`` not a string or
                ``detail`` not an object.
        """
        if not isinstance(data, dict):
            raise ValueError("an estimate must be a JSON object")
        mem: Any = data.get("mem_mib")
        flops: Any = data.get("flops_per_step")
        method, detail = data.get("method"), data.get("detail")
        if not _is_int(mem) or mem <= 0:
            raise ValueError(f"estimate mem_mib must be a positive integer, not {mem!r}")
        if not isinstance(method, str):
            raise ValueError(f"estimate method must be a string, not {method!r}")
        if detail is not None and not isinstance(detail, dict):
            raise ValueError("estimate detail must be an object")
        return cls(mem_mib=mem, method=method, detail=dict(detail or {}), gpu_model=data.get("gpu_model"),
                   flops_per_step=flops if _is_int(flops) and flops >= 0 else None)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
