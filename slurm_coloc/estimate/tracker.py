"""The dispatch modes a trace stacks: the tracker, which replays every new storage through a model of
PyTorch's CUDA caching allocator, and the FLOP counter below it. Used by the ``#COLOC model=`` trace
(``trace.py``) and the script probe (``probe/inject/main.py``).

Allocator model (pure Python): what the real allocator would have *reserved* (``cudaMalloc``'d segments:
what NVML counts), not the bytes tensors use. Rules of ``c10/cuda/CUDACachingAllocator.cpp`` (PyTorch 2.x
defaults, one stream, no ``max_split_size_mb``, no expandable segments):

* requests round up to 512 B (``kMinBlockSize``);
* requests <= 1 MiB use the small pool, whose segments are 2 MiB (``kSmallBuffer``);
* larger ones the large pool: a new segment is 20 MiB (``kLargeBuffer``) under 10 MiB (``kMinLargeAlloc``),
  else the request rounded up to 2 MiB;
* a request takes the smallest sufficient cached free block of its pool, split when the rest is >= 512 B
  (small) or > 1 MiB (large);
* a freed block merges with free neighbours; segments are never returned (no ``empty_cache``).

Tracker: a storage is "freed" when its storage object dies (storages keep one Python object for their
lifetime, so a weakref finalizer marks the real free point); the first GEMM adds the cuBLAS and cuBLASLt
workspaces, each convolution call its cuDNN workspace as a transient block.

FLOP counter: ``torch.utils.flop_counter.FlopCounterMode`` counts matrix multiplications, convolutions and
fused attention forward and backward (torch's shape formulas; element-wise ops, normalisations and the
optimizer step count zero). One step's FLOPs are the difference of its totals at two step ends.
"""
from __future__ import annotations

import bisect
import weakref
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from slurm_coloc.estimate.convcall import ConvCall, from_aten, workspace_parts
from slurm_coloc.estimate.gpulike import ScalarAssumptions, has_no_data
from slurm_coloc.estimate.spec import MIB

if TYPE_CHECKING:
    import torch as torch_t

MIN_BLOCK_B = 512
SMALL_SIZE_B = 1 << 20
SMALL_BUFFER_B = 2 << 20
LARGE_BUFFER_B = 20 << 20
MIN_LARGE_ALLOC_B = 10 << 20
ROUND_LARGE_B = 2 << 20
# cuBLAS workspace PyTorch allocates through the caching allocator at the first GEMM on Hopper
# (CublasHandlePool.cpp: 32 MiB default for sm90+; 8 MiB + 128 KiB before Hopper).
CUBLAS_WORKSPACE_B = 32 * MIB
# cuBLASLt keeps its own workspace of the same size (seen on H100: small models hold ~64 MiB
# more allocated than their tensors, data/hopper).
CUBLASLT_WORKSPACE_B = 32 * MIB
_GEMM_OPS = ("mm", "addmm", "bmm", "baddbmm", "convolution", "_scaled_dot_product", "linear")

WorkspaceFn = Callable[[ConvCall], int]


def round_size(nbytes: int) -> int:
    """Bytes the allocator hands out for ``nbytes`` (>= 0): a multiple of 512, >= 512 (``kMinBlockSize``)."""
    if nbytes < MIN_BLOCK_B:
        return MIN_BLOCK_B
    return MIN_BLOCK_B * ((nbytes + MIN_BLOCK_B - 1) // MIN_BLOCK_B)


def segment_size(rounded: int) -> int:
    """Bytes of the new segment for a ``round_size`` request no cached block fits (module docstring)."""
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
    """Replays allocations/frees (``h = m.malloc(nbytes)`` ... ``m.free(h)``); tracks allocated and reserved
    bytes and their peaks."""

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
        """Return ``handle``'s block to its pool, merging free neighbours; reserved bytes stay.

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


class _ReplayState:
    """What a storage, cuBLAS and a convolution allocate in the tracker's replay."""

    alloc: CachingAllocatorModel
    handles: Dict[int, int]
    cublas: bool
    scalars: ScalarAssumptions
    conv_calls: List[ConvCall]
    ws_max_b: int

    def _free(self, key: int) -> None:
        self.scalars.forget(key)
        h = self.handles.pop(key, None)
        if h is not None:
            self.alloc.free(h)

    def track(self, t: "torch_t.Tensor") -> None:
        """Allocate ``t``'s untyped storage (``nbytes()``) once; it is freed when the storage object dies."""
        st = t.untyped_storage()
        key = st._cdata
        if key in self.handles:
            return
        self.handles[key] = self.alloc.malloc(st.nbytes())
        weakref.finalize(st, self._free, key)

    def replay_cublas(self) -> None:
        """The first GEMM: the cuBLAS and cuBLASLt workspaces, held for the process lifetime."""
        self.cublas = True
        self.alloc.malloc(CUBLAS_WORKSPACE_B)
        self.alloc.malloc(CUBLASLT_WORKSPACE_B)

    def replay_conv(self, call: ConvCall, workspace: Optional[WorkspaceFn]) -> None:
        """Record ``call``; with a ``workspace`` model replay its cuDNN workspace as a transient block: cuDNN
        takes it after the outputs exist and gives it back when the call ends (Conv_v8.cpp)."""
        self.conv_calls.append(call)
        if workspace is None:
            return
        for part in workspace_parts(call):
            ws = int(workspace(part))
            if ws > 0:
                self.ws_max_b = max(self.ws_max_b, ws)
                self.alloc.free(self.alloc.malloc(ws))


def make_tracker(torch: ModuleType, workspace: Optional[WorkspaceFn] = None) -> Any:
    """A ``TorchDispatchMode`` replaying every new tensor storage through the allocator model: ``alloc`` holds
    the replayed peaks, ``handles`` live storages' blocks; ``track(t)`` allocates ``t``'s storage (an instance
    attribute may replace it to filter); ``conv_calls``, ``ws_max_b`` (cuDNN workspaces, bytes per call from
    ``workspace``; None: none), ``scalars`` (assumed value reads) and ``ops`` record what was seen."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    # value reads: ``aten.item`` reaches the modes undecomposed for inference-mode tensors (the FLOP counter
    # decomposes it below the tracker into ``_local_scalar_dense``, which the fake mode refuses)
    _scalar_reads = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default)
    _conv = torch.ops.aten.convolution.default
    _conv_bwd = torch.ops.aten.convolution_backward.default

    class _Tracker(_ReplayState, TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.alloc = CachingAllocatorModel()
            self.handles: Dict[int, int] = {}
            self.ops = 0
            self.cublas = False
            self.scalars = ScalarAssumptions()
            self.conv_calls: List[ConvCall] = []
            self.ws_max_b = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            try:
                out = func(*args, **(kwargs or {}))
            except Exception:  # .item()/bool() of a tensor without values (a fake tensor
                # holding a constant, e.g. Adam's step, answers itself above): assume (gpulike.py)
                if func not in _scalar_reads or not args or not has_no_data(torch, args[0]):
                    raise
                return self.scalars.answer(torch, args[0])
            if isinstance(out, torch.Tensor) and out.dim() == 0:
                self.scalars.note_output(func, out.untyped_storage()._cdata)
            self.ops += 1
            if not self.cublas and any(g in func.__name__ for g in _GEMM_OPS):
                self.replay_cublas()
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.track(t)
            if func is _conv or func is _conv_bwd:
                self.replay_conv(from_aten(func is _conv_bwd, args), workspace)
            return out

    return _Tracker()


class _GlobalOnly:
    """Stands in for ``FlopCounterMode``'s ``ModuleTracker``: every FLOP goes to ``"Global"``, no hooks."""

    parents = frozenset({"Global"})

    def __enter__(self) -> "_GlobalOnly":
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def make_flop_counter() -> Any:
    """A ``FlopCounterMode(display=False)`` for a total count, or None when this torch has none.

    Its ``ModuleTracker`` (newer torch) registers ``register_multi_grad_hook``s on every module's inputs and
    outputs, which hold gradients until all of a module's inputs have theirs: that changed the replayed peak
    of DenseNet-121 (lists of tensors). A total needs no per-module attribution: :class:`_GlobalOnly` replaces
    it. A formula that raises counts 0 and sets ``coloc_failed`` (the count is then unknown, the trace goes
    on)."""
    try:
        from torch.utils.flop_counter import FlopCounterMode
    except ImportError:
        return None
    counter: Any = FlopCounterMode(display=False)
    if hasattr(counter, "mod_tracker"):
        counter.mod_tracker = _GlobalOnly()
    counter.coloc_failed = False
    registry = getattr(counter, "flop_registry", None)
    if isinstance(registry, dict):
        def guarded(formula: Callable[..., int]) -> Callable[..., int]:
            def count(*args: Any, **kwargs: Any) -> int:
                try:
                    return formula(*args, **kwargs)
                except Exception:  # a FLOP formula never fails the memory trace
                    counter.coloc_failed = True
                    return 0
            return count

        counter.flop_registry = {k: guarded(v) for k, v in registry.items()}
    return counter


def step_flops(totals: List[int], counter: object) -> Optional[int]:
    """The last step's FLOPs (last two ``totals``' difference); None: fewer, no counter, or failed."""
    if counter is None or getattr(counter, "coloc_failed", False) or len(totals) < 2:
        return None
    return int(totals[-1] - totals[-2])
