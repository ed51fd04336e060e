"""The tracker: a ``TorchDispatchMode`` replaying a traced run's memory through the caching-allocator model.

Every new tensor storage is "allocated" in a :class:`CachingAllocatorModel` and "freed" when its storage
object dies (storages keep one Python object for their lifetime, so a weakref finalizer marks the real free
point); the first GEMM adds the cuBLAS and cuBLASLt workspaces, and each convolution call its cuDNN workspace
as a transient block. Used by the ``#COLOC model=`` trace (``trace.py``) and the script probe
(``probe/inject/main.py``).
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, List, Optional

from slurm_coloc.estimate.allocator import CachingAllocatorModel
from slurm_coloc.estimate.convcall import ConvCall, from_aten, workspace_parts
from slurm_coloc.estimate.datadep import ScalarAssumptions, has_no_data

MIB = 1 << 20
# cuBLAS workspace PyTorch allocates through the caching allocator at the first GEMM on Hopper
# (CublasHandlePool.cpp: 32 MiB default for sm90+; 8 MiB + 128 KiB before Hopper).
CUBLAS_WORKSPACE_B = 32 * MIB
# cuBLASLt keeps its own workspace of the same size (seen on H100: small models hold ~64 MiB
# more allocated than their tensors, data/hopper).
CUBLASLT_WORKSPACE_B = 32 * MIB
_GEMM_OPS = ("mm", "addmm", "bmm", "baddbmm", "convolution", "_scaled_dot_product", "linear")

WorkspaceFn = Callable[[ConvCall], int]


class _ReplayState:
    """The allocator replay of the tracker (``make_tracker``): what a storage, cuBLAS and a convolution
    allocate."""

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

    def track(self, t: Any) -> None:
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
        """Record ``call``; with a ``workspace`` model replay its cuDNN workspace as a transient block.

        cuDNN takes it from the caching allocator after the outputs exist and gives it back when the call ends
        (Conv_v8.cpp).
        """
        self.conv_calls.append(call)
        if workspace is None:
            return
        for part in workspace_parts(call):
            ws = int(workspace(part))
            if ws > 0:
                self.ws_max_b = max(self.ws_max_b, ws)
                self.alloc.free(self.alloc.malloc(ws))


def make_tracker(torch: Any, workspace: Optional[WorkspaceFn] = None) -> Any:
    """A ``TorchDispatchMode`` that replays every new tensor storage through the allocator model.

    Its ``alloc`` holds the replayed peaks; ``handles`` maps live storages to blocks; ``track(t)`` allocates
    ``t``'s storage (an instance attribute may replace it to filter); ``conv_calls``, ``ws_max_b`` (cuDNN
    workspaces, bytes per call from ``workspace``; None: none), ``scalars`` (assumed value reads) and ``ops``
    record what was seen.
    """
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
                # holding a constant, e.g. Adam's step, answers itself above): assume (datadep.py)
                if func not in _scalar_reads or not args or not has_no_data(torch, args[0]):
                    raise
                return self.scalars.answer(torch, args[0])
            if isinstance(out, torch.Tensor) and out.dim() == 0:
                self.scalars.note_output(func, out, out.untyped_storage()._cdata)
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
