"""Multi-GPU training run as one process in the probe (job's Python): one GPU per process, traced as one.

* ``torch.distributed``: ``init_process_group`` makes a gloo group of one (an NCCL one is noted: its
  communicator's memory is added, ``spec.py`` ``nccl_mib``); DDP is traced as its module plus its gradient
  buckets.
* Spawned workers (facebookresearch/moco, pytorch/examples ``imagenet/main.py``: one per visible GPU) would
  be new interpreters without the fake GPU. ``spawn``/``start_processes`` with ``nprocs`` 1 (the fake GPU's
  ``device_count()``) run ``fn(0, *args)`` in the probe's process; more end the probe with that reason. A
  ``multiprocessing.Process`` with a training target (its source calls ``init_process_group``,
  ``.backward(`` or ``.step(``) handed no tensor or module runs in-process at ``start()`` (a second ends the
  probe); DataLoader workers, other targets and Hogwild workers (``hooks._patch_processes``) start as usual.
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import multiprocessing.process as mpp
from typing import Any, Callable, List

from slurm_coloc.probe.inject.fakecuda import ProbeState


def patch_distributed(torch: Any, st: ProbeState) -> None:
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
    """One empty buffer per (device, dtype) of ``module``'s trainable GPU parameters, of their total size."""
    sizes: dict = {}
    for p in module.parameters():
        if p.requires_grad and p.device.type != "cpu":
            key = (p.device, p.dtype)
            sizes[key] = sizes.get(key, 0) + p.numel()
    return [torch.empty(n, dtype=dtype, device=device) for (device, dtype), n in sizes.items()]


def uses_nccl(backend: Any) -> bool:
    """Whether ``init_process_group(backend)`` makes NCCL: ``nccl``, or None (CUDA's default)."""
    return backend is None or "nccl" in str(backend).lower()


_TRAINING_MARKS = ("init_process_group", ".backward(", ".step(")


def is_training_target(fn: Any) -> bool:
    """Whether ``fn``'s source reads like a training worker (``_TRAINING_MARKS``); False if unreadable."""
    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        return False
    return any(m in src for m in _TRAINING_MARKS)


def _holds_torch(torch: Any, proc: Any) -> bool:
    """Whether a process is handed a tensor or a module (Hogwild's shared model): no self-contained worker."""
    from torch.utils._pytree import tree_flatten

    leaves = tree_flatten((list(getattr(proc, "_args", ())), dict(getattr(proc, "_kwargs", {}))))[0]
    return any(isinstance(x, (torch.Tensor, torch.nn.Module)) for x in leaves)


def patch_workers(torch: Any, note: Callable[[str], None], fail: Callable[[str], None]) -> None:
    """Install the in-process spawn and ``Process.start`` (module docstring)."""
    tmp = getattr(torch, "multiprocessing", None)
    if tmp is None:  # pragma: no cover - every torch has it
        return

    def start_processes(fn: Any, args: Any = (), nprocs: int = 1, join: bool = True, daemon: bool = False,
                        start_method: str = "spawn") -> Any:
        if int(nprocs) != 1:
            fail(f"the program starts {nprocs} worker processes (torch.multiprocessing.spawn), one per GPU: "
                 "the probe imitates one GPU; give '#COLOC mem=' per GPU")
        note("torch.multiprocessing.spawn of 1 process: its worker traced in the probe's process (the figure "
             "is per process, per GPU)")
        fn(0, *tuple(args))
        return None

    def spawn(fn: Any, args: Any = (), nprocs: int = 1, join: bool = True, daemon: bool = False,
              start_method: str = "spawn") -> Any:
        return start_processes(fn, args, nprocs, join, daemon, start_method)

    tmp.spawn = spawn
    tmp.start_processes = start_processes
    try:
        sp = importlib.import_module("torch.multiprocessing.spawn")
        sp.spawn, sp.start_processes = spawn, start_processes  # type: ignore[attr-defined]
    except ImportError:  # pragma: no cover - every torch has it
        pass
    real_start, real_join = mpp.BaseProcess.start, mpp.BaseProcess.join
    ran: List[Any] = []

    def start(self: Any) -> None:
        target = getattr(self, "_target", None)
        if target is None or not is_training_target(target) or _holds_torch(torch, self):
            return real_start(self)  # a helper, a DataLoader worker, or Hogwild (hooks._patch_processes)
        if ran:
            fail("the program starts more than one training process (multiprocessing.Process): the probe "
                 "imitates one GPU; give '#COLOC mem=' per GPU")
        ran.append(self)
        name = getattr(target, "__name__", "target")
        note(f"multiprocessing.Process({name}): traced in the probe's process")
        target(*getattr(self, "_args", ()), **getattr(self, "_kwargs", {}))
        return None

    def join(self: Any, timeout: Any = None) -> None:
        if any(p is self for p in ran):
            return None  # it ran in-process at start()
        return real_join(self, timeout)

    mpp.BaseProcess.start = start  # type: ignore[method-assign]
    mpp.BaseProcess.join = join  # type: ignore[method-assign]


def cap_threads(torch: Any, note: Callable[[str], None], cap: int = 2) -> None:
    """Keep the program's ``torch.set_num_threads(n)`` to at most ``cap`` intra-op threads: the probe's host
    work on a shared login node (the child's OpenMP/MKL default is ``runner.PROBE_THREADS``).
    """
    real = torch.set_num_threads

    def set_num_threads(n: int) -> None:
        if int(n) > cap:
            note(f"torch.set_num_threads({n}): {cap} in the probe (a shared login node)")
        real(min(int(n), cap))

    torch.set_num_threads = set_num_threads

