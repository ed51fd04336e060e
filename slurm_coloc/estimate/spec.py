"""What an estimate is asked about (ModelSpec, GpuModel), what it answers (Estimate), and the analytic figure
of a traced run (MiB): ``context_mib + libs_mib + peak_reserved_b / 2**20``. Pure data, no torch.

``context_mib``: NVML's per-process figure of a torch process right after its first CUDA op; ``libs_mib``:
what loading cuBLAS/cuDNN kernels adds outside the caching allocator in training (fitted on the Hopper data
set, docs/estimator.md); ``peak_reserved_b``: the trace replayed through the caching-allocator model
(``tracker.py``). cuDNN workspaces the trace misses are calibrated for in ``combine.py``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Protocol, Tuple

from slurm_coloc.errors import EstimateError

OPTIMIZERS = ("sgd", "sgd-momentum", "adam", "adamw")
PRECISIONS = ("fp32", "amp-fp16", "bf16")
MIB = 1 << 20


@dataclass(frozen=True)
class ModelSpec:
    """A training job's model as its ``#COLOC`` lines declare it (``submit/directives.py``): ``model``
    ``module.path:callable`` or ``path/to/file.py:callable`` (relative to ``base_dir``, the script's
    directory); ``kwargs`` JSON values; ``input_shape`` ONE sample's (``(3, 32, 32)``, ``(seq_len,)``);
    ``input_dtype`` ``"float32"`` or ``"int64"`` (token ids); ``batch_size`` samples per step (>= 1)."""

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
    """Peak GPU memory of one training process as NVML reports it: ``mem_mib`` (CUDA context + the caching
    allocator's peak reserved, MiB); ``method`` ``analytic`` (calibrated trace) or ``history`` (measured
    peaks); ``flops_per_step``: FLOP of one traced step (forward, backward, optimizer), None when not
    counted."""

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
    def from_json(cls, data: object) -> "Estimate":
        """``to_json``'s object from a file or another process (not trusted): ``detail`` null reads as {},
        ``flops_per_step`` null or not a non-negative int as None. ValueError: not an object, ``mem_mib`` not
        a positive int, ``method`` not a str or ``detail`` not a dict."""
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


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class GpuModel:
    """One GPU model (MiB): ``mem_mib`` NVML's total; ``context_mib``, ``libs_mib``: module docstring;
    ``arch`` the compute capability family (the cuDNN workspace table is measured on ``workspace.TABLE_ARCH``,
    a proxy elsewhere); ``nccl_mib`` what a process's NCCL communicator (a process group and its first
    collective, e.g. DDP's) adds outside the caching allocator, 0 where not known."""

    name: str
    mem_mib: int
    context_mib: int
    libs_mib: int
    source: str
    arch: str = "sm90"
    nccl_mib: int = 0


GPUS: Dict[str, GpuModel] = {
    # nccl_mib: benchmarks/device/nccl_overhead.py on 2x H100 (torch 2.11.0+cu130, NCCL 2.28.9): a one-process
    # NCCL group with DDP added 564 MiB outside the allocator for a Linear, ResNet-18 and ResNet-50 alike
    # (benchmarks/device/results/h100x2-nccl-overhead/).
    "H100": GpuModel("H100", 81559, 612, 0,
                     "measured on H100 80GB HBM3, driver 580.159.04, torch 2.11+cu130 "
                     "(docs/facts.md §10-§12; NCCL: benchmarks/device/nccl_overhead.py)", nccl_mib=564),
    "H200": GpuModel("H200", 143771, 612, 0,
                     "memory from nvidia-smi on H200; context and NCCL assumed equal to H100 "
                     "(same Hopper stack)", nccl_mib=564),
    # Not measured here: for comparing with GPUMemNet's A100 figures only. 40960 MiB = the
    # 40 GB part as nvidia-smi reports it. Context: the smallest per-process peak among
    # GPUMemNet's 6000 MLP runs on A100 40GB (their older CUDA stack) is 1443 MiB
    # (shared/data/gpumemnet/mlp_data_step{1,2}.csv, CC BY 4.0); minus the 146 MiB of libs the
    # Hopper calibration adds and the 66 MiB our trace replays for a tiny MLP step (cuBLAS
    # workspaces), 1231 MiB, so the uncalibrated analytic figure of a tiny MLP is their 1443.
    "A100": GpuModel("A100", 40960, 1231, 0,
                     "A100 40GB, not measured here: context from GPUMemNet's MLP data floor (1443 MiB) "
                     "minus libs and a tiny step; see spec.py", arch="sm80"),
}

_ALIASES = {
    "h100": "H100", "h100-80gb": "H100", "h100 80gb": "H100", "h100 80gb hbm3": "H100",
    "nvidia h100 80gb hbm3": "H100", "h100-sxm": "H100", "h100_80gb": "H100",
    "h200": "H200", "nvidia h200": "H200", "h200-141gb": "H200",
    "a100": "A100", "a100-40gb": "A100", "a100 40gb": "A100", "nvidia a100-sxm4-40gb": "A100",
    "a100-sxm4-40gb": "A100", "nvidia a100-pcie-40gb": "A100", "a100-pcie-40gb": "A100",
}


def gpu_model(name: str) -> GpuModel:
    """The ``GpuModel`` of a name as NVML, a GRES type or a user writes it (any case; ``_`` reads as a space);
    EstimateError for an unknown name."""
    key = _ALIASES.get(" ".join(str(name).lower().replace("_", " ").split()))
    if key is None:
        key = _ALIASES.get(str(name).strip().lower())
    if key is None:
        raise EstimateError(f"unknown GPU model {name!r}; known: {', '.join(sorted(GPUS))}")
    return GPUS[key]


class TracedPeaks(Protocol):
    """What the analytic figure reads of a traced run (``trace.TraceResult``), in bytes."""

    param_b: int
    peak_allocated_b: int
    peak_reserved_b: int


def analytic_mib(trace: TracedPeaks, gpu: GpuModel) -> float:
    """The analytic figure (module docstring): per-process NVML peak, MiB, not rounded."""
    return gpu.context_mib + gpu.libs_mib + trace.peak_reserved_b / MIB


def analytic_detail(trace: TracedPeaks, gpu: GpuModel) -> Dict[str, Any]:
    """:func:`analytic_mib`'s parts for ``Estimate.detail``, in MiB rounded to 0.1."""
    return {
        "context_mib": gpu.context_mib,
        "libs_mib": gpu.libs_mib,
        "params_mib": round(trace.param_b / MIB, 1),
        "peak_allocated_mib": round(trace.peak_allocated_b / MIB, 1),
        "peak_reserved_mib": round(trace.peak_reserved_b / MIB, 1),
        "analytic_mib": round(analytic_mib(trace, gpu), 1),
    }
