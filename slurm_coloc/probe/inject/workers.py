"""Single-node multi-process training in the probe: one process per GPU, traced as one.

Reference scripts (facebookresearch/moco ``--multiprocessing-distributed --world-size 1``, pytorch/examples
``imagenet/main.py``) start one worker per visible GPU (``torch.multiprocessing.spawn`` or
``multiprocessing.Process``), each joining an NCCL or Gloo group. A spawned worker is a new interpreter
without the fake GPU and would meet the real driver.

* ``spawn``/``start_processes`` with ``nprocs`` 1 (the fake GPU's ``device_count()``) run ``fn(0, *args)``
  in the probe's process: its memory is the per-GPU figure and its exceptions the program's own;
  ``init_process_group`` is ``distributed.py``'s. More processes end the probe with that reason;
* ``multiprocessing.Process`` with a training target (its source calls ``init_process_group``,
  ``.backward(`` or ``.step(``) handed no tensor or module runs in-process at ``start()`` (a second ends the
  probe); DataLoader workers, other targets and Hogwild workers (``hooks._patch_processes``) start as usual.
"""
from __future__ import annotations

import importlib
import inspect
import multiprocessing.process as mpp
from typing import Any, Callable, List

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

