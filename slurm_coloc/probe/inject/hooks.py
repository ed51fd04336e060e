"""The probe's hooks into the program's torch (job's Python): steps, backward, module calls, loaders.

Installed by ``inject/main.py`` once ``torch`` is imported, before the program runs. ``probe`` is its
``_Probe``: ``state`` (``fakecuda.ProbeState``), ``opt_steps``/``opt_names``/``param_dtypes`` (what the
optimizers did), ``forwards``/``backwards``/``depth`` (top-level module calls), ``evals``
(``evalpass.EvalPasses``), ``micro`` (``accum.MicroSteps``), ``smaller`` (``smaller.SmallerCalls``),
``flops``/``flops_mode`` (the FLOP counter),
``on_step`` and ``finish``.
"""
from __future__ import annotations

import importlib
import os
from typing import Any

from slurm_coloc.probe.inject import accum, evalpass, frameworks, smaller
from slurm_coloc.probe.inject.distributed import patch_distributed
from slurm_coloc.probe.inject.workers import cap_threads, patch_workers


def install(probe: Any, torch: Any) -> None:
    """Every hook below, in the order the program meets them; sets ``probe.evals/smaller/micro``."""
    st = probe.state
    _patch_optimizers(probe, torch)
    probe.evals = evalpass.EvalPasses(torch, st.on_gpu)
    probe.evals.smaller = probe.smaller = smaller.SmallerCalls(torch, st.on_gpu, st.tracker.alloc)
    counter = probe.flops
    probe.micro = accum.MicroSteps(
        torch, probe.evals, lambda: int(counter.get_total_flops()) if probe.flops is not None else None)
    _patch_backward(probe, torch)
    _patch_format(torch)
    _patch_module_calls(probe, torch)
    _patch_compile_and_save(torch, st)
    _patch_dataloader(probe, torch)
    _patch_processes(probe, torch)
    patch_distributed(torch, st)
    patch_workers(torch, st.note, st.fail)
    cap_threads(torch, st.note)
    frameworks.install(st.note)


def _patch_optimizers(probe: Any, torch: Any) -> None:
    """Step hooks on every optimizer; parameter dtypes counted; foreach paths allowed on fake tensors."""
    import torch.optim.optimizer as optmod

    optmod.register_optimizer_step_post_hook(probe.on_step)
    # Optimizers and clip_grad_norm_ take their foreach (multi-tensor) paths on CUDA tensors by
    # default, whose temporaries span all parameters at once; they test ``type(p)`` against these
    # lists (DTensor registers itself the same way), which a FakeTensor would fail.
    from torch._subclasses.fake_tensor import FakeTensor

    for mod in ("torch.optim.optimizer", "torch.utils._foreach_utils"):
        types_ok = getattr(importlib.import_module(mod), "_foreach_supported_types", None)
        if isinstance(types_ok, list) and FakeTensor not in types_ok:
            types_ok.append(FakeTensor)
    orig_opt_init = torch.optim.Optimizer.__init__

    def opt_init(opt: Any, *a: Any, **k: Any) -> None:
        orig_opt_init(opt, *a, **k)
        probe.opt_steps.setdefault(id(opt), 0)
        probe.opt_names.setdefault(id(opt), type(opt).__name__)
        for g in opt.param_groups:
            for p in g["params"]:
                name = str(p.dtype).replace("torch.", "")
                probe.param_dtypes[name] = probe.param_dtypes.get(name, 0) + int(p.numel())

    torch.optim.Optimizer.__init__ = opt_init


def _patch_backward(probe: Any, torch: Any) -> None:
    """``torch.autograd.backward`` counted (a program without optimizer stops after ``steps`` of them);
    a skipped micro-step's backward does nothing (``accum.py``)."""
    st = probe.state
    orig_backward = torch.autograd.backward
    micro = probe.micro

    def backward(*a: Any, **k: Any) -> Any:
        if micro.before_backward():
            micro.after_backward()
            return None
        out = orig_backward(*a, **k)
        micro.after_backward()
        probe.backwards += 1
        if not probe.opt_steps and probe.backwards >= probe.steps_wanted:
            st.note(f"no torch.optim optimizer: stopped after backward() {probe.backwards} (parameters "
                    "updated by hand are not replayed)")
            probe.finish("ok", "")
        return out

    torch.autograd.backward = backward  # Tensor.backward looks it up here at each call


def _patch_format(torch: Any) -> None:
    """``f"{loss:.4f}"`` of a fake 0-dim tensor formats a stand-in value."""
    from torch._subclasses.fake_tensor import FakeTensor

    orig_format = torch.Tensor.__format__

    def tensor_format(t: Any, spec: str) -> str:
        # a real 0-dim tensor formats its value (f"{loss:.4f}"); a fake one has none: the probe's
        # answer to a value read (``.item()``), which the program's printing never needs right
        if isinstance(t, FakeTensor) and t.dim() == 0:
            try:
                return format(t.item(), spec)
            except Exception:  # any stand-in will do for printing
                return format(0.0 if t.is_floating_point() else 0, spec)
        return orig_format(t, spec)

    torch.Tensor.__format__ = tensor_format


def _patch_module_calls(probe: Any, torch: Any) -> None:
    """Top-level calls of modules with parameters counted; repeats skipped (``evalpass``, ``accum``)."""
    def pre(mod: Any, inp: Any) -> None:
        if probe.depth == 0 and has_params(mod):
            probe.forwards += 1
        probe.depth += 1

    def post(mod: Any, inp: Any, out: Any) -> None:
        probe.depth = max(0, probe.depth - 1)

    mm = torch.nn.modules.module
    mm.register_module_forward_pre_hook(pre)
    mm.register_module_forward_hook(post)
    evals, micro, small = probe.evals, probe.micro, probe.smaller
    orig_call = torch.nn.Module.__call__

    def module_call(mod: Any, *a: Any, **k: Any) -> Any:
        if probe.depth == 0 and has_params(mod):
            if torch.is_grad_enabled():
                return small.train_call(lambda: micro.call(orig_call, mod, a, k), mod, a, k,
                                        lambda: micro.skipping)
            return evals.call(orig_call, mod, a, k)
        return orig_call(mod, *a, **k)

    torch.nn.Module.__call__ = module_call


def _patch_compile_and_save(torch: Any, st: Any) -> None:
    """``torch.compile`` traced eagerly; ``torch.save`` writes nothing."""
    def compile_eager(model: Any = None, *a: Any, **k: Any) -> Any:
        st.note("torch.compile: traced eagerly (compiled steps held 0.82-1.07x the eager peak reserved "
                "on the H100, docs/estimator.md)")
        if model is None:
            return lambda m: m
        return model

    torch.compile = compile_eager

    def save_nothing(obj: Any, f: Any, *a: Any, **k: Any) -> None:
        # fake tensors cannot be pickled, and a checkpoint is not the probe's to write
        st.note("torch.save skipped: "
                f"{os.fspath(f) if isinstance(f, (str, os.PathLike)) else type(f).__name__}")

    torch.save = save_nothing


def _patch_dataloader(probe: Any, torch: Any) -> None:
    """DataLoaders load in the probe process; their batch sizes are kept for the evaluation replay."""
    st, evals = probe.state, probe.evals
    dl = torch.utils.data.DataLoader
    orig_dl_init = dl.__init__

    def dl_init(loader: Any, *a: Any, **k: Any) -> None:
        if int(k.get("num_workers", 0) or 0) > 0:
            st.note("DataLoader workers: loaded in the probe process (num_workers=0)")
        k.update(num_workers=0, pin_memory=False, persistent_workers=False)
        k.pop("prefetch_factor", None)
        k.pop("multiprocessing_context", None)
        orig_dl_init(loader, *a, **k)
        if isinstance(getattr(loader, "batch_size", None), int):
            evals.loader_batches.append(int(loader.batch_size))

    dl.__init__ = dl_init


def _patch_processes(probe: Any, torch: Any) -> None:
    """A child process handed GPU tensors or a module on the GPU ends the probe with that reason.

    ``torch.multiprocessing`` trainers (pytorch/examples mnist_hogwild: ``mp.Process(target=train,
    args=(rank, args, model, ...))`` per worker, each with its own CUDA context, activations and
    optimizer state on the one GPU) need the memory of every process; the probe follows one process.
    A child given no GPU data (a CPU helper) starts as usual.
    """
    import multiprocessing.process as mpp

    from torch.utils._pytree import tree_flatten

    st = probe.state
    orig_start = mpp.BaseProcess.start

    def gpu_data(obj: Any) -> bool:
        leaves = tree_flatten(obj)[0]
        for x in leaves:
            if isinstance(x, torch.nn.Module):
                if any(st.on_gpu(p) for p in x.parameters()):
                    return True
            elif isinstance(x, torch.Tensor) and st.on_gpu(x):
                return True
        return False

    def start(proc: Any) -> None:
        if gpu_data((list(getattr(proc, "_args", ())), dict(getattr(proc, "_kwargs", {})))):
            target = getattr(getattr(proc, "_target", None), "__name__", "?")
            probe.finish("error", "the program starts worker processes that use the GPU "
                         f"({type(proc).__name__}(target={target}) given the model or GPU tensors, as "
                         "Hogwild training): each has its own CUDA context and memory, and the probe follows "
                         "one process only")
        orig_start(proc)

    mpp.BaseProcess.start = start  # type: ignore[method-assign, assignment]


def count_flops_after_first_step(probe: Any) -> None:
    """Set ``probe.flops_mode``: the FLOP counter's dispatch mode, passing ops through until a first step.

    ``flops_per_step`` is the count between an optimizer's first two steps; what runs before (imports, eval
    loops, the first iteration) need not be counted, and the counter's per-op work is a large part of the
    probe's time. A torch whose ``FlopCounterMode`` is itself the dispatch mode (no ``_FlopCounterMode``; its
    ``__enter__`` clears the counts) cannot gate it: ``probe.flops`` is set to None.
    """
    counter = probe.flops
    if counter is None:
        return
    import torch.utils.flop_counter as fc

    cls = getattr(fc, "_FlopCounterMode", None)
    counting = getattr(cls, "__torch_dispatch__", None)
    if cls is None or counting is None:
        probe.flops = None
        return

    def gated(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not probe.opt_steps or max(probe.opt_steps.values()) < 1:
            return func(*args, **(kwargs or {}))
        return counting(self, func, types, args, kwargs)

    cls.__torch_dispatch__ = gated
    probe.flops_mode = cls(counter)


def has_params(mod: Any) -> bool:
    """Whether ``mod`` has at least one parameter."""
    return any(True for _ in mod.parameters())
