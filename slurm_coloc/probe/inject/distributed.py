"""One-process ``torch.distributed`` for a probe (job's Python): a gloo group of one, DDP as its module."""
from __future__ import annotations

import contextlib
from typing import Any


def patch_distributed(torch: Any, st: Any) -> None:
    """One-process ``torchrun``: a gloo group of one, and DDP traced as its module."""
    try:
        import torch.distributed as dist
        import torch.nn.parallel as par
    except ImportError:  # pragma: no cover - builds without distributed
        return
    if not dist.is_available():
        return
    orig = dist.init_process_group

    def init_process_group(*a: Any, **k: Any) -> None:
        st.note("torch.distributed: one-process gloo group")
        if uses_nccl(a[0] if a else k.get("backend")):
            st.nccl_group = True
            st.note("torch.distributed: the job's NCCL group holds GPU memory outside the allocator: added "
                    "(spec.py nccl_mib)")
        if dist.is_initialized():
            return
        orig(backend="gloo", store=dist.HashStore(), rank=0, world_size=1)

    dist.init_process_group = init_process_group

    class OneProcessDDP(torch.nn.Module):
        """DistributedDataParallel with one process: its module, plus DDP's gradient buckets held on the GPU.

        DDP keeps a flat copy of every gradient in its communication buckets
        (``gradient_as_bucket_view=False``, the default; torch/nn/parallel/distributed.py, ``Reducer``): one
        buffer per parameter dtype and device, as large as the parameters that require a gradient, allocated
        when DDP wraps the module.
        """

        def __init__(self, module: Any, *a: Any, **k: Any) -> None:
            super().__init__()
            self.module = module
            self._coloc_buckets = [] if k.get("gradient_as_bucket_view") else _bucket_buffers(torch, module)
            st.note("DistributedDataParallel with one process: traced as its module, "
                    f"{len(self._coloc_buckets)} gradient bucket buffer(s) held")

        def forward(self, *a: Any, **k: Any) -> Any:
            return self.module(*a, **k)

        def no_sync(self) -> Any:
            return contextlib.nullcontext()

    par.DistributedDataParallel = OneProcessDDP  # type: ignore[misc]
    with contextlib.suppress(Exception):
        import torch.nn.parallel.distributed as pd

        pd.DistributedDataParallel = OneProcessDDP  # type: ignore[misc]


def _bucket_buffers(torch: Any, module: Any) -> list:
    """One uninitialised buffer per (device, dtype) of ``module``'s trainable GPU parameters, of their total
    size."""
    sizes: dict = {}
    for p in module.parameters():
        if p.requires_grad and p.device.type != "cpu":
            key = (p.device, p.dtype)
            sizes[key] = sizes.get(key, 0) + p.numel()
    return [torch.empty(n, dtype=dtype, device=device) for (device, dtype), n in sizes.items()]


def uses_nccl(backend: Any) -> bool:
    """Whether ``init_process_group(backend)`` makes an NCCL communicator: ``nccl`` named, or None (CUDA's
    default).
    """
    return backend is None or "nccl" in str(backend).lower()
