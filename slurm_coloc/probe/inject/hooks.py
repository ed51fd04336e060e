"""The probe's hooks into the program's torch and training frameworks (job's Python).

Installed by ``inject/main.py`` once ``torch`` is imported, before the program runs: optimizer steps,
backward, top-level module calls, DataLoaders, worker processes. ``probe`` is its ``_Probe``: ``state``
(``fakecuda.ProbeState``), ``opt_steps``/``opt_names``/``param_dtypes`` (what the optimizers did),
``forwards``/``backwards``/``depth`` (top-level module calls), ``evals``/``micro``
(``repeats.EvalPasses``/``MicroSteps``), ``smaller`` (``smaller.SmallerCalls``), ``flops``/``flops_mode``
(the FLOP counter), ``on_step`` and ``finish``.

Frameworks are kept from saving checkpoints and logs by a post-import hook (:class:`_AfterImport`, first on
``sys.meta_path``) that patches a framework's module right after the program imports it (stdlib only; a
framework never imported costs nothing), each patch guarded (another version is left as it is, noted):

* PyTorch Lightning ``Trainer(...)``: ``logger=False``, ``enable_checkpointing=False``,
  ``enable_progress_bar=False``, no checkpoint or ``...Monitor`` callback (they need a logger);
* Hugging Face ``TrainingArguments``: ``save_strategy="no"``, ``report_to="none"``, ``push_to_hub=False``;
  ``Trainer.save_model``/``save_state``/``_save_checkpoint`` do nothing;
* ``accelerate.Accelerator``: ``save_state``, ``save``, ``save_model`` and ``init_trackers`` do nothing.
"""
from __future__ import annotations

import importlib
import importlib.abc
import os
import sys
from typing import Any, Callable, Dict, Optional

from slurm_coloc.probe.inject import repeats, smaller
from slurm_coloc.probe.inject.distributed import cap_threads, patch_distributed, patch_workers
from slurm_coloc.probe.inject.fakecuda import ProbeState

Note = Callable[[str], None]


def _saves(callback: Any) -> bool:
    """Checkpoint callbacks (which save) and monitors (which need a logger) are left out."""
    name = type(callback).__name__
    return "Checkpoint" in name or name.endswith("Monitor")


def _lightning_trainer(mod: Any, note: Note) -> None:
    trainer = getattr(mod, "Trainer", None)
    if trainer is None:
        return
    orig = trainer.__init__

    def __init__(self: Any, *a: Any, **k: Any) -> None:
        cbs = k.get("callbacks")
        if cbs is not None:
            one = not isinstance(cbs, (list, tuple))
            k["callbacks"] = [c for c in ([cbs] if one else cbs) if not _saves(c)]
        k.update(logger=False, enable_checkpointing=False, enable_progress_bar=False)
        note("Lightning Trainer: loggers, checkpointing and progress bar off")
        orig(self, *a, **k)

    trainer.__init__ = __init__


def _hf_training_args(mod: Any, note: Note) -> None:
    args_cls = getattr(mod, "TrainingArguments", None)
    post = getattr(args_cls, "__post_init__", None)
    if args_cls is None or post is None:
        return

    def __post_init__(self: Any) -> None:
        for name, value in (("save_strategy", "no"), ("report_to", "none"), ("push_to_hub", False),
                            ("load_best_model_at_end", False)):
            if hasattr(self, name):
                setattr(self, name, value)
        note("Hugging Face TrainingArguments: save_strategy=no, report_to=none")
        post(self)

    args_cls.__post_init__ = __post_init__


def _hf_trainer(mod: Any, note: Note) -> None:
    trainer = getattr(mod, "Trainer", None)
    for name in ("save_model", "save_state", "_save_checkpoint", "push_to_hub", "create_model_card"):
        if trainer is not None and hasattr(trainer, name):
            setattr(trainer, name, _skip(f"Hugging Face Trainer.{name}", note))


def _accelerate(mod: Any, note: Note) -> None:
    acc = getattr(mod, "Accelerator", None)
    for name in ("save_state", "save", "save_model", "init_trackers"):
        if acc is not None and hasattr(acc, name):
            setattr(acc, name, _skip(f"accelerate Accelerator.{name}", note))


def _skip(what: str, note: Note) -> Callable[..., None]:
    def skipped(*a: Any, **k: Any) -> None:
        note(f"{what} skipped")

    return skipped


PATCHES: Dict[str, Callable[[Any, Note], None]] = {
    "lightning.pytorch.trainer.trainer": _lightning_trainer,
    "pytorch_lightning.trainer.trainer": _lightning_trainer,
    "transformers.training_args": _hf_training_args,
    "transformers.trainer": _hf_trainer,
    "accelerate.accelerator": _accelerate,
}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the real loader of a module in ``PATCHES`` to patch it once executed."""

    def __init__(self, note: Note) -> None:
        self.note = note
        self.busy: set = set()

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Optional[Any]:
        """The module's own spec, its loader wrapped to apply ``PATCHES[name]`` after it runs (a failing patch
        noted); None for others."""
        if name not in PATCHES or name in self.busy:
            return None
        self.busy.add(name)
        try:
            import importlib.util

            spec = importlib.util.find_spec(name)
        finally:
            self.busy.discard(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        loader, patch, note = spec.loader, PATCHES[name], self.note

        class _Patched(importlib.abc.Loader):
            def create_module(self, s: Any) -> Any:
                return loader.create_module(s)

            def exec_module(self, module: Any) -> None:
                loader.exec_module(module)
                try:
                    patch(module, note)
                except Exception as exc:  # another version of the framework
                    note(f"{name}: not patched ({type(exc).__name__}: {exc})")

        spec.loader = _Patched()
        return spec


def patch_frameworks(note: Note) -> None:
    """Patch frameworks imported now and later (module docstring); a failing patch is noted."""
    for name, patch in PATCHES.items():
        mod = sys.modules.get(name)
        if mod is not None:
            try:
                patch(mod, note)
            except Exception as exc:  # another version of the framework
                note(f"{name}: not patched ({type(exc).__name__}: {exc})")
    sys.meta_path.insert(0, _AfterImport(note))


def install(probe: Any, torch: Any) -> None:
    """Every hook here, in the order the program meets them; sets ``probe.evals/smaller/micro``."""
    st = probe.state
    _patch_optimizers(probe, torch)
    probe.evals = repeats.EvalPasses(torch, st.on_gpu)
    probe.evals.smaller = probe.smaller = smaller.SmallerCalls(torch, st.on_gpu, st.tracker.alloc)
    counter = probe.flops
    probe.micro = repeats.MicroSteps(
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
    patch_frameworks(st.note)


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
    a skipped micro-step's backward does nothing (``repeats.MicroSteps``)."""
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
    """Top-level calls of modules with parameters counted; repeats skipped (``repeats.py``)."""
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


def _patch_compile_and_save(torch: Any, st: ProbeState) -> None:
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

    Hogwild trainers (pytorch/examples mnist_hogwild: ``mp.Process(target=train, args=(rank, args, model))``
    per worker, each with its own CUDA context) need every process's memory; the probe follows one process.
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
