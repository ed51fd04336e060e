"""GPU compute mode through NVML (root only for ``set``): the MPS protection of a shared GPU.

NVIDIA's MPS documentation runs a shared GPU in ``EXCLUSIVE_PROCESS`` compute mode so that only the MPS server
opens a context on it: a job that leaves its MPS pipe directory then fails to create a context instead of
allocating beside the server. NVML calls: ``nvmlDeviceGetComputeMode`` / ``nvmlDeviceSetComputeMode`` (NVML
API reference; ``NVML_COMPUTEMODE_DEFAULT`` 0, ``EXCLUSIVE_THREAD`` 1 (deprecated), ``PROHIBITED`` 2,
``EXCLUSIVE_PROCESS`` 3). The setting does not survive a driver reload or reboot. Nothing in slurm-coloc calls
``set`` unless the admin chose ``mps_compute_mode: exclusive-process``.
"""
from __future__ import annotations

from typing import Dict, Optional, Protocol

from slurm_coloc.errors import ColocError
from slurm_coloc.nvml.reader import open_nvml

MODE_NAMES: Dict[int, str] = {0: "DEFAULT", 1: "EXCLUSIVE_THREAD", 2: "PROHIBITED", 3: "EXCLUSIVE_PROCESS"}
MODE_VALUES: Dict[str, int] = {v: k for k, v in MODE_NAMES.items()}
EXCLUSIVE_PROCESS = "EXCLUSIVE_PROCESS"
DEFAULT = "DEFAULT"


class ComputeModes(Protocol):
    """Reads and sets the compute mode of a GPU by NVML index; mode names are ``MODE_NAMES`` values."""

    def get(self, index: int) -> str:
        """The ``MODE_NAMES`` value of GPU ``index``."""
        ...

    def set(self, index: int, mode: str) -> None:
        """Set GPU ``index``'s compute mode to a ``MODE_NAMES`` value."""
        ...


def mode_name(value: Optional[int]) -> Optional[str]:
    """``MODE_NAMES[value]``; ``UNKNOWN(<n>)`` for a value NVML may add later; None for None."""
    if value is None:
        return None
    return MODE_NAMES.get(int(value), f"UNKNOWN({int(value)})")


class NvmlComputeModes:
    """``ComputeModes`` of this node's GPUs through NVML.

    Raises (from each method):
        NvmlUnavailable: no NVML. ColocError: the NVML call failed (e.g. NO_PERMISSION when not root), or an
            unknown mode name.
    """

    def __init__(self) -> None:
        self.nv = open_nvml()

    def get(self, index: int) -> str:
        """``nvmlDeviceGetComputeMode`` of GPU ``index``: a ``MODE_NAMES`` value, or ``UNKNOWN(<n>)``.

        Raises:
            ColocError: the NVML call failed (e.g. no such GPU).
        """
        nv = self.nv
        try:
            value = nv.nvmlDeviceGetComputeMode(nv.nvmlDeviceGetHandleByIndex(int(index)))
        except nv.NVMLError as exc:
            raise ColocError(f"GPU {index}: cannot read the compute mode: {exc}") from None
        return str(mode_name(value))

    def set(self, index: int, mode: str) -> None:
        """``nvmlDeviceSetComputeMode`` of GPU ``index`` to a ``MODE_NAMES`` value (root only).

        Raises:
            ColocError: an unknown mode name, or the NVML call failed (e.g. NO_PERMISSION when not root).
        """
        if mode not in MODE_VALUES:
            raise ColocError(f"unknown compute mode {mode!r}", hint=f"one of {', '.join(MODE_VALUES)}")
        nv = self.nv
        try:
            nv.nvmlDeviceSetComputeMode(nv.nvmlDeviceGetHandleByIndex(int(index)), MODE_VALUES[mode])
        except nv.NVMLError as exc:
            raise ColocError(f"GPU {index}: cannot set compute mode {mode}: {exc}",
                             hint="needs root; not possible inside some containers or VMs") from None
