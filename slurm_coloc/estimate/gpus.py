"""GPU models the estimator knows: memory size and the per-process CUDA context NVML counts.

``context_mib`` is the NVML per-process figure of a torch process right after its first CUDA
op; ``libs_mib`` is what loading cuBLAS/cuDNN kernels adds outside the caching allocator during
training (fitted on the Hopper data set, see docs/estimator.md). Pure data, no torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

from slurm_coloc.errors import EstimateError


@dataclass(frozen=True)
class GpuModel:
    """One GPU model; memory figures in MiB.

    ``mem_mib`` is what NVML reports as total; ``context_mib`` a torch process's CUDA context; ``libs_mib``
    the non-allocator memory of cuBLAS/cuDNN during training; ``arch`` the compute capability family
    (``sm90``): the cuDNN workspace table is measured on ``workspace.TABLE_ARCH``, a proxy elsewhere.
    ``nccl_mib``: what a process's NCCL communicator (a process group and its first collective, e.g. DDP's)
    adds outside the caching allocator; 0 where not known.
    """

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
                     "minus libs and a tiny step; see gpus.py", arch="sm80"),
}

_ALIASES = {
    "h100": "H100", "h100-80gb": "H100", "h100 80gb": "H100", "h100 80gb hbm3": "H100",
    "nvidia h100 80gb hbm3": "H100", "h100-sxm": "H100", "h100_80gb": "H100",
    "h200": "H200", "nvidia h200": "H200", "h200-141gb": "H200",
    "a100": "A100", "a100-40gb": "A100", "a100 40gb": "A100", "nvidia a100-sxm4-40gb": "A100",
    "a100-sxm4-40gb": "A100", "nvidia a100-pcie-40gb": "A100", "a100-pcie-40gb": "A100",
}


def gpu_model(name: str) -> GpuModel:
    """The ``GpuModel`` of a name as NVML, a GRES type or a user writes it (any case; ``_`` reads as a space).

    Raises:
        EstimateError: unknown GPU name.
    """
    key = _ALIASES.get(" ".join(str(name).lower().replace("_", " ").split()))
    if key is None:
        key = _ALIASES.get(str(name).strip().lower())
    if key is None:
        raise EstimateError(f"unknown GPU model {name!r}; known: {', '.join(sorted(GPUS))}")
    return GPUS[key]
