"""A replay model of PyTorch's CUDA caching allocator (pure Python, no torch).

Fed a traced step's storage allocations and frees, it gives what the real allocator would have *reserved*
(``cudaMalloc``'d segments: what NVML counts), not the bytes tensors use. Rules of
``c10/cuda/CUDACachingAllocator.cpp`` (PyTorch 2.x defaults, one stream, no ``max_split_size_mb``, no
expandable segments):

* requests round up to 512 B (``kMinBlockSize``);
* requests <= 1 MiB use the small pool, whose segments are 2 MiB (``kSmallBuffer``);
* larger ones the large pool: a new segment is 20 MiB (``kLargeBuffer``) under 10 MiB (``kMinLargeAlloc``),
  else the request rounded up to 2 MiB;
* a request takes the smallest sufficient cached free block of its pool, split when the rest is >= 512 B
  (small) or > 1 MiB (large);
* a freed block merges with free neighbours; segments are never returned (no ``empty_cache``).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

MIN_BLOCK_B = 512
SMALL_SIZE_B = 1 << 20
SMALL_BUFFER_B = 2 << 20
LARGE_BUFFER_B = 20 << 20
MIN_LARGE_ALLOC_B = 10 << 20
ROUND_LARGE_B = 2 << 20


def round_size(nbytes: int) -> int:
    """Bytes the allocator hands out for ``nbytes`` (>= 0): a multiple of 512, >= 512 (``kMinBlockSize``)."""
    if nbytes < MIN_BLOCK_B:
        return MIN_BLOCK_B
    return MIN_BLOCK_B * ((nbytes + MIN_BLOCK_B - 1) // MIN_BLOCK_B)


def segment_size(rounded: int) -> int:
    """Bytes of the new segment for a ``round_size`` request no cached block fits (module docstring's rules).

    2 MiB (small pool, <= 1 MiB), 20 MiB (< 10 MiB), else ``rounded`` up to 2 MiB
    (``CUDACachingAllocator.cpp``).
    """
    if rounded <= SMALL_SIZE_B:
        return SMALL_BUFFER_B
    if rounded < MIN_LARGE_ALLOC_B:
        return LARGE_BUFFER_B
    return ROUND_LARGE_B * ((rounded + ROUND_LARGE_B - 1) // ROUND_LARGE_B)


@dataclass
class _Block:
    seg: int
    offset: int
    size: int
    free: bool
    small: bool


@dataclass
class CachingAllocatorModel:
    """Replays allocations/frees; tracks allocated and reserved bytes and their peaks.

    Usage: ``h = m.malloc(nbytes)`` ... ``m.free(h)``; then read ``peak_reserved_b``.
    """

    allocated_b: int = 0
    reserved_b: int = 0
    peak_allocated_b: int = 0
    peak_reserved_b: int = 0
    n_segments: int = 0
    _next_handle: int = 0
    _live: Dict[int, _Block] = field(default_factory=dict)
    # free lists per pool: sorted (size, seg, offset); blocks by (seg, offset)
    _free_small: List[Tuple[int, int, int]] = field(default_factory=list)
    _free_large: List[Tuple[int, int, int]] = field(default_factory=list)
    _blocks: Dict[Tuple[int, int], _Block] = field(default_factory=dict)
    _seg_blocks: Dict[int, List[int]] = field(default_factory=dict)  # seg -> sorted offsets

    def _pool(self, small: bool) -> List[Tuple[int, int, int]]:
        return self._free_small if small else self._free_large

    def malloc(self, nbytes: int) -> int:
        """A handle (for :meth:`free`) to ``nbytes`` from the best-fitting cached block or a new segment."""
        size = round_size(int(nbytes))
        small = size <= SMALL_SIZE_B
        pool = self._pool(small)
        i = bisect.bisect_left(pool, (size, -1, -1))
        if i < len(pool):
            _, seg, off = pool.pop(i)
            block = self._blocks[(seg, off)]
        else:
            seg_b = segment_size(size)
            seg = self.n_segments
            self.n_segments += 1
            self.reserved_b += seg_b
            self.peak_reserved_b = max(self.peak_reserved_b, self.reserved_b)
            block = _Block(seg, 0, seg_b, True, small)
            self._blocks[(seg, 0)] = block
            self._seg_blocks[seg] = [0]
        rest = block.size - size
        if (small and rest >= MIN_BLOCK_B) or (not small and rest > SMALL_SIZE_B):
            tail = _Block(block.seg, block.offset + size, rest, True, small)
            block.size = size
            self._blocks[(tail.seg, tail.offset)] = tail
            bisect.insort(self._seg_blocks[tail.seg], tail.offset)
            bisect.insort(pool, (tail.size, tail.seg, tail.offset))
        block.free = False
        self.allocated_b += block.size
        self.peak_allocated_b = max(self.peak_allocated_b, self.allocated_b)
        handle = self._next_handle
        self._next_handle += 1
        self._live[handle] = block
        return handle

    def free(self, handle: int) -> None:
        """Return ``handle``'s block to its pool, merging free neighbours; reserved bytes stay (segments never
        released).

        Raises:
            KeyError: ``handle`` is unknown or already freed.
        """
        block = self._live.pop(handle)
        self.allocated_b -= block.size
        block.free = True
        pool = self._pool(block.small)
        offs = self._seg_blocks[block.seg]
        j = bisect.bisect_left(offs, block.offset)
        if j + 1 < len(offs):  # merge with next
            nxt = self._blocks[(block.seg, offs[j + 1])]
            if nxt.free:
                pool.remove((nxt.size, nxt.seg, nxt.offset))
                del self._blocks[(nxt.seg, nxt.offset)]
                offs.pop(j + 1)
                block.size += nxt.size
        if j > 0:  # merge into previous
            prv = self._blocks[(block.seg, offs[j - 1])]
            if prv.free:
                pool.remove((prv.size, prv.seg, prv.offset))
                del self._blocks[(block.seg, block.offset)]
                offs.pop(j)
                prv.size += block.size
                block = prv
        bisect.insort(pool, (block.size, block.seg, block.offset))
