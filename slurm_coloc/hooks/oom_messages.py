"""The messages frameworks print when a GPU allocation fails, found in a job's output tail, and the size of
the failed allocation PyTorch names. Pure: the user's text is only matched, never interpreted. Read by
``hooks/oom.py`` (detection and the rerun's evidence rule).
"""
from __future__ import annotations

import re
from typing import List, Sequence, Tuple

# (name, regex): the messages frameworks print when a GPU allocation fails. Sources (see
# tests/data/oom/README.md):
OOM_PATTERNS: Tuple[Tuple[str, "re.Pattern[str]"], ...] = tuple((n, re.compile(p)) for n, p in (
    # c10/cuda/CUDACachingAllocator.cpp; Python class torch.OutOfMemoryError (torch.cuda.OutOfMemoryError <=
    # 2.4)
    ("torch.OutOfMemoryError", r"\btorch\.(?:cuda\.)?OutOfMemoryError\b"),
    ("CUDA out of memory", r"\bCUDA out of memory\b"),
    # cudaGetErrorString(cudaErrorMemoryAllocation) through C10_CUDA_CHECK / TF / NCCL / CuPy
    ("CUDA error: out of memory", r"\bCUDA error: out of memory\b"),
    ("cudaErrorMemoryAllocation", r"\bcudaErrorMemoryAllocation\b"),
    ("CUDA_ERROR_OUT_OF_MEMORY", r"\bCUDA_ERROR_OUT_OF_MEMORY\b"),
    ("CUBLAS_STATUS_ALLOC_FAILED", r"\bCUBLAS_STATUS_ALLOC_FAILED\b"),
    ("CUDNN_STATUS_ALLOC_FAILED", r"\bCUDNN_STATUS_ALLOC_FAILED\b"),
    ("CUSOLVER_STATUS_ALLOC_FAILED", r"\bCUSOLVER_STATUS_ALLOC_FAILED\b"),
    ("CUFFT_ALLOC_FAILED", r"\bCUFFT_ALLOC_FAILED\b"),
    # NCCL (src/include/checks.h): "NCCL WARN Cuda failure 'out of memory'" / "Cuda failure 2 'out of memory'"
    ("NCCL Cuda failure 'out of memory'", r"\bCuda failure (?:\d+ )?'out of memory'"),
    # XLA/JAX and TensorFlow (BFC allocator): RESOURCE_EXHAUSTED only counts with a memory phrase
    ("RESOURCE_EXHAUSTED: Out of memory", r"\bRESOURCE_EXHAUSTED\b.{0,80}\b(?:[Oo]ut of memory|OOM|hbm)\b"),
    ("TF OOM when allocating tensor", r"\bOOM when allocating tensor\b"),
    ("ResourceExhaustedError", r"\bResourceExhaustedError\b.{0,40}\bOOM\b"),
))
MAX_MESSAGES = 5
# PyTorch's CUDACachingAllocator message: "Tried to allocate 2.00 GiB" (c10/cuda/CUDACachingAllocator.cpp)
_TRIED_RE = re.compile(r"Tried to allocate (\d+(?:\.\d+)?) ?(GiB|MiB|KiB|B)\b")
_UNIT_MIB = {"GiB": 1024.0, "MiB": 1.0, "KiB": 1 / 1024, "B": 1 / 2**20}


def find_oom_messages(text: str) -> List[Tuple[str, str]]:
    """Up to ``MAX_MESSAGES`` ``(pattern name, line trimmed to 300 chars)`` of ``text``, the last line first.

    ``text``: the job's output tail (user-written: only matched, never interpreted); None or empty has none.
    Never raises.
    """
    found: List[Tuple[str, str]] = []
    for line in reversed((text or "").splitlines()):
        for name, rx in OOM_PATTERNS:
            if rx.search(line):
                found.append((name, line.strip()[:300]))
                break
        if len(found) >= MAX_MESSAGES:
            break
    return found


def tried_to_allocate_mib(messages: Sequence[Tuple[str, str]]) -> int:
    """The largest ``Tried to allocate X`` in the lines, MiB rounded up; 0 without one.

    GiB, MiB, KiB and B are read in binary units. Pure, never raises.
    """
    best = 0.0
    for _, line in messages:
        for num, unit in _TRIED_RE.findall(line):
            best = max(best, float(num) * _UNIT_MIB[unit])
    return int(-(-best // 1))
