"""Sizes and shards: MiB inside, GiB shards at the Slurm edge (1 shard = 1 GiB)."""
from __future__ import annotations

import math
import re

from slurm_coloc.errors import ColocError

MIB_PER_SHARD = 1024
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(I?B?)\s*$", re.IGNORECASE)
_FACTOR_MIB = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024, "": 1024}


def parse_size_mib(text: str) -> int:
    """Parse a memory size into MiB (rounded up).

    Accepts ``6G``, ``6GiB``, ``6GB``, ``6144M``, ``1.5G``, ``512MiB``, ``1T``; a bare number means GiB
    (Slurm's shard unit). Binary units throughout (G = GiB).

    Args:
        text: the size as written (``6G``, ``6144M``, ``1.5``).

    Returns:
        The size in MiB, rounded up (>= 1).

    Raises:
        ColocError: empty, negative, zero or malformed size.
    """
    match = _SIZE_RE.match(text or "")
    if not match:
        raise ColocError(f"invalid memory size {text!r}", hint="use e.g. 6G, 6GiB or 6144M")
    number, unit = float(match.group(1)), match.group(2).upper()
    mib = math.ceil(number * _FACTOR_MIB[unit])
    if mib <= 0:
        raise ColocError(f"invalid memory size {text!r}: must be more than 0")
    return mib


def mib_to_shards(mem_mib: int) -> int:
    """Shards (GiB) needed to hold ``mem_mib`` MiB: ceil(mem_mib / 1024), at least 1.

    Args:
        mem_mib: the memory to hold (MiB).

    Returns:
        The shard count (>= 1). Pure, never raises.
    """
    return max(1, math.ceil(mem_mib / MIB_PER_SHARD))


def shards_to_mib(shards: int) -> int:
    """The memory ``shards`` shards grant, MiB: shards x ``MIB_PER_SHARD`` (1 shard = 1 GiB, the CUDA context
    included: the MPS fence ``0=<shards>G`` of node/jobenv.py and the watchdog's grant).

    Returns:
        The memory granted (MiB).
    """
    return int(shards) * MIB_PER_SHARD


def format_mib(mem_mib: float | None) -> str:
    """Human form: ``812 MiB`` or ``5.2 GiB``; ``-`` for None.

    Args:
        mem_mib: a memory size (MiB), or None.

    Returns:
        The text (GiB with one decimal from 1024 MiB up). Pure, never raises.
    """
    if mem_mib is None:
        return "-"
    return f"{mem_mib / 1024:.1f} GiB" if mem_mib >= 1024 else f"{mem_mib:.0f} MiB"


def is_bare_number(text: str) -> bool:
    """Whether a size has no unit (``6``, ``1.5``): ``parse_size_mib`` reads it as GiB, where sbatch's ``--mem
    6`` would mean 6 MB, so coloc-sbatch and the SPANK plugin say so.

    Args:
        text: the size as written; None or empty has no number.

    Returns:
        True for a bare number. Pure, never raises.
    """
    return bool(re.fullmatch(r"\s*\d+(\.\d+)?\s*", text or ""))
