"""Sizes and shards: MiB inside, GiB shards at the Slurm edge (1 shard = 1 GiB)."""
from __future__ import annotations

import math
import re

from slurm_coloc.errors import ColocError

MIB_PER_SHARD = 1024
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(I?B?)\s*$", re.IGNORECASE)
_FACTOR_MIB = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024, "": 1024}


def parse_size_mib(text: str) -> int:
    """``6G``, ``6GiB``, ``6GB``, ``6144M``, ``1.5G``, ``512MiB`` or ``1T`` in MiB, rounded up; binary units
    (G = GiB); a bare number is GiB (Slurm's shard unit). ``ColocError`` for empty, zero or bad sizes."""
    match = _SIZE_RE.match(text or "")
    if not match:
        raise ColocError(f"invalid memory size {text!r}", hint="use e.g. 6G, 6GiB or 6144M")
    number, unit = float(match.group(1)), match.group(2).upper()
    mib = math.ceil(number * _FACTOR_MIB[unit])
    if mib <= 0:
        raise ColocError(f"invalid memory size {text!r}: must be more than 0")
    return mib


def mib_to_shards(mem_mib: int) -> int:
    """Shards (GiB) needed to hold ``mem_mib`` MiB: ceil(mem_mib / 1024), at least 1."""
    return max(1, math.ceil(mem_mib / MIB_PER_SHARD))


def shards_to_mib(shards: int) -> int:
    """MiB that ``shards`` grant (1 shard = 1 GiB, CUDA context included, as fence and watchdog use)."""
    return int(shards) * MIB_PER_SHARD


def format_mib(mem_mib: float | None) -> str:
    """``812 MiB``, ``5.2 GiB`` (from 1024 MiB up) or ``-`` for None."""
    if mem_mib is None:
        return "-"
    return f"{mem_mib / 1024:.1f} GiB" if mem_mib >= 1024 else f"{mem_mib:.0f} MiB"


def is_bare_number(text: str) -> bool:
    """Whether a size has no unit (``6``): GiB here, 6 MB for sbatch's ``--mem 6``, so we warn."""
    return bool(re.fullmatch(r"\s*\d+(\.\d+)?\s*", text or ""))
