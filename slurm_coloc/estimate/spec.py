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

    ``model``: ``module.path:callable`` or ``path/to/file.py:callable`` (relative to ``base_dir``, the job
    script's directory); ``kwargs``: JSON values; ``input_shape``: ONE sample's, e.g. ``(3, 32, 32)``, or
    ``(seq_len,)`` for token models; ``input_dtype``: ``"float32"`` or ``"int64"`` (token ids);
    ``batch_size``: samples per step (>= 1).
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

    ``mem_mib``: CUDA context + caching allocator's peak reserved memory (MiB). ``method``: ``analytic``
    (calibrated trace) or ``history`` (earlier measured peaks). ``flops_per_step``: FLOP of one step counted
    in the trace (forward, backward, optimizer), None when not counted; it does not enter ``mem_mib``.
    """

    mem_mib: int
    method: str
    detail: Dict[str, Any] = field(default_factory=dict)
    gpu_model: Optional[str] = None
    flops_per_step: Optional[int] = None

    def to_json(self) -> Dict[str, Any]:
        """What ``from_json`` reads back (estimate cache, probe cache, coloc-sbatch's estimate child)."""
        return {"mem_mib": self.mem_mib, "method": self.method, "detail": dict(self.detail),
                "gpu_model": self.gpu_model, "flops_per_step": self.flops_per_step}

    @classmethod
    def from_json(cls, data: Any) -> "Estimate":
        """An estimate read back from ``to_json``'s object, written by a file or another process (not
        trusted).

        ``detail`` absent or null reads as {}; ``flops_per_step`` absent, null or not a non-negative integer
        reads as None.

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
