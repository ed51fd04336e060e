"""The probe inside the job's Python: run the training program on fake tensors, stop, report.

Entry: :func:`main` with the path of a JSON request written by ``runner.py``::

    {"mode": "file"|"module", "target": "train.py"|"pkg.mod", "args": [...],
     "result": "/scratch/result.json", "steps": 2, "scratch": "/scratch", "program_dir": "/home/u/proj"}

The program runs as ``__main__`` (``runpy``) with ``sys.argv`` as the job would give it, with the
GPU imitated by ``fakecuda.py`` (host tensors real, GPU tensors fake) and its GPU ops replayed by the
estimator's tracker (``estimate/trace.py``: allocator replay, cuBLAS workspaces, cuDNN workspace table,
``cudamodes`` SDPA kernel choice and CUDA float32 list); evaluation passes are ``evalpass.py``'s.
It stops when every optimizer it created has run
``steps`` steps (default 2: the second cycle's forward and backward hold the optimizer state, the
steady-state peak, as the estimator's two traced steps), or any optimizer ``steps + 2`` steps; a
program that has created no ``torch.optim`` optimizer (parameters updated by hand, as
pytorch/examples' word language model does) is stopped after its ``steps``-th ``backward()``.
Then the result JSON is written and the process ends with ``os._exit(0)`` (no ``atexit``, no
``finally`` of the program: nothing the program would save at its end runs).

Result keys: ``status`` (``ok`` | ``no-step`` | ``error``), ``reason``, ``peak_reserved_b``,
``peak_allocated_b``, ``optimizers``, ``steps``, ``forwards``, ``autocast``, ``param_dtypes``,
``depthwise_max_hw``, ``conv_workspace_max_b``, ``assumed_values``, ``notes``, ``flops_per_step``
(FLOPs ``FlopCounterMode`` counted between the first two steps of the program's first optimizer, i.e. one
training iteration, all ops of the process included; None when not counted: ``estimate.trace.make_flop_counter``),
``outside_writes`` (paths the program opened for writing outside the scratch directory),
``user_files`` (source files it imported from outside the Python installation).
"""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import shutil
import sys
import sysconfig
import traceback
from typing import Any, Dict, List

from slurm_coloc.probe.inject import cudaapi, evalpass, fakecuda, frameworks
from slurm_coloc.probe.inject.distributed import patch_distributed

# FakeTensorMode(allow_non_fake_inputs=...), register_optimizer_step_post_hook, torch.amp.autocast_mode
MIN_TORCH = (2, 1)
_WRITE_EVENTS = ("os.mkdir", "os.rename", "os.remove", "os.rmdir", "shutil.rmtree", "os.truncate")


class _Probe:
    def __init__(self, req: Dict[str, Any]) -> None:
        self.req = req
        self.steps_wanted = int(req.get("steps", 2))
        self.scratch = os.path.realpath(req["scratch"])
        self.work = os.path.realpath(req["work"]) if req.get("work") else ""
        self.in_audit = False
        self.opt_steps: Dict[int, int] = {}
        self.opt_names: Dict[int, str] = {}
        self.forwards = 0
        self.backwards = 0
        self.depth = 0
        self.outside_writes: List[str] = []
        self.param_dtypes: Dict[str, int] = {}
        self.state: Any = None
        self.flops: Any = None  # estimate.trace.make_flop_counter(), below the tracker
        self.flop_totals: Dict[int, List[int]] = {}
        self.evals: Any = None  # evalpass.EvalPasses, once torch is imported
        self.flops_mode: Any = None  # the FLOP counter's dispatch mode (_count_flops_after_first_step)
        self.finishing = False
        self.profile: Any = None  # (cProfile.Profile, path) with COLOC_PROBE_PROFILE

    # -- what the program writes -----------------------------------------------------------
    def audit(self, event: str, args: Any) -> None:
        path = None
        if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            mode = args[1] if len(args) > 1 else "r"
            flags = args[2] if len(args) > 2 else 0
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
            if writing:
                path = args[0]
        elif event in _WRITE_EVENTS and args and isinstance(args[0], (str, bytes, os.PathLike)):
            path = args[0]
        if path is None or self.in_audit:
            return
        self.in_audit = True
        try:
            self._check_write(event, path, mode if event == "open" else "")
        finally:
            self.in_audit = False

    def _check_write(self, event: str, path: Any, mode: Any) -> None:
        try:
            name = os.path.abspath(os.fsdecode(path))
            real = os.path.realpath(name)
        except (TypeError, ValueError):
            return
        if event == "open" and self.work and name.startswith(self.work + os.sep) and os.path.islink(name) \
                and not real.startswith(self.scratch + os.sep) and os.path.isfile(real):
            # a mirrored file link opened for writing: write a copy in the scratch directory instead
            with contextlib.suppress(OSError):
                os.unlink(name)
                if not (isinstance(mode, str) and "w" in mode):
                    shutil.copyfile(real, name)
                return
        if len(self.outside_writes) >= 50:
            return
        if real.startswith(self.scratch + os.sep) or real.startswith("/dev/") or real.startswith("/proc/"):
            return
        if real not in self.outside_writes:
            self.outside_writes.append(real)

    # -- stopping ------------------------------------------------------------------------------
    def on_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        key = id(opt)
        if self.flops is not None:
            self.flop_totals.setdefault(key, []).append(int(self.flops.get_total_flops()))
        self.opt_steps[key] = self.opt_steps.get(key, 0) + 1
        self.opt_names.setdefault(key, type(opt).__name__)
        done = all(n >= self.steps_wanted for n in self.opt_steps.values())
        if done or max(self.opt_steps.values()) >= self.steps_wanted + 2:
            self.finish("ok", "")

    def step_flops(self) -> Any:
        """FLOPs between the first two steps of the first optimizer that stepped twice, or None."""
        from slurm_coloc.estimate.trace import step_flops

        for key in self.opt_steps:
            totals = self.flop_totals.get(key, [])
            if len(totals) >= 2:
                return step_flops(totals[:2], self.flops)
        return None

    def finish(self, status: str, reason: str) -> None:
        st = self.state
        if status == "ok" and self.evals is not None and st is not None and not self.finishing:
            self.finishing = True
            self.evals.replay_eval_batches(st.note)
            skipped = self.evals.summary_note()
            if skipped:
                st.note(skipped)
        alloc = st.tracker.alloc if st is not None else None
        dw = 0
        ws_max = 0
        ops = 0
        assumed: Dict[str, int] = {}
        if st is not None:
            for c in st.tracker.conv_calls:
                if len(c.input) >= 4 and c.groups > 1 and c.groups == c.input[1]:
                    dw = max(dw, int(c.input[-1]) * int(c.input[-2]))
            ws_max = int(st.tracker.ws_max_b)
            ops = int(st.tracker.ops)
            assumed = dict(st.tracker.scalars.counts)
        torch_mod = sys.modules.get("torch")
        if st is not None and st.tracker.conv_calls and torch_mod is not None \
                and getattr(torch_mod.backends.cudnn, "benchmark", False):
            st.note("cudnn.benchmark = True: cuDNN's autotuning can reserve more than the replayed workspaces "
                    "(pytorch/examples dcgan: +620 to +1,170 MiB on the H100, docs/estimator.md); not modelled")
        out = {
            "status": status, "reason": reason,
            "peak_reserved_b": int(alloc.peak_reserved_b) if alloc else 0,
            "peak_allocated_b": int(alloc.peak_allocated_b) if alloc else 0,
            "optimizers": sorted(set(self.opt_names.values())),
            "steps": sum(self.opt_steps.values()), "forwards": self.forwards,
            "autocast": list(st.autocast_dtypes) if st else [],
            "param_dtypes": self.param_dtypes, "depthwise_max_hw": dw,
            "conv_workspace_max_b": ws_max, "ops": ops, "assumed_values": assumed,
            "flops_per_step": self.step_flops(),
            "notes": list(st.notes) if st else [], "outside_writes": self.outside_writes,
            "user_files": _user_files(), "torch": _torch_version(),
        }
        if self.profile is not None:
            self.profile[0].disable()
            self.profile[0].dump_stats(self.profile[1])
        tmp = self.req["result"] + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(out, fh)
        os.replace(tmp, self.req["result"])
        for s in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                s.flush()
        os._exit(0)

    # -- patches -------------------------------------------------------------------------------
    def install(self, torch: Any) -> None:
        st = self.state
        probe = self
        import torch.optim.optimizer as optmod

        optmod.register_optimizer_step_post_hook(self.on_step)
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
        orig_backward = torch.autograd.backward

        def backward(*a: Any, **k: Any) -> Any:
            out = orig_backward(*a, **k)
            probe.backwards += 1
            if not probe.opt_steps and probe.backwards >= probe.steps_wanted:
                st.note(f"no torch.optim optimizer: stopped after backward() {probe.backwards} (parameters "
                        "updated by hand are not replayed)")
                probe.finish("ok", "")
            return out

        torch.autograd.backward = backward  # Tensor.backward looks it up here at each call
        orig_format = torch.Tensor.__format__

        def tensor_format(t: Any, spec: str) -> str:
            # a real 0-dim tensor formats its value (f"{loss:.4f}"); a fake one has none: the probe's
            # answer to a value read (``.item()``), which the program's printing never needs right
            if isinstance(t, FakeTensor) and t.dim() == 0:
                try:
                    return format(t.item(), spec)
                except Exception:  # noqa: BLE001 - any stand-in will do for printing
                    return format(0.0 if t.is_floating_point() else 0, spec)
            return orig_format(t, spec)

        torch.Tensor.__format__ = tensor_format

        def pre(mod: Any, inp: Any) -> None:
            if probe.depth == 0 and _has_params(mod):
                probe.forwards += 1
            probe.depth += 1

        def post(mod: Any, inp: Any, out: Any) -> None:
            probe.depth = max(0, probe.depth - 1)

        mm = torch.nn.modules.module
        mm.register_module_forward_pre_hook(pre)
        mm.register_module_forward_hook(post)
        evals = probe.evals = evalpass.EvalPasses(torch, st.on_gpu)
        orig_call = torch.nn.Module.__call__

        def module_call(mod: Any, *a: Any, **k: Any) -> Any:
            # top-level calls of modules with parameters: evaluation repeats skipped (evalpass.py)
            if probe.depth == 0 and _has_params(mod):
                return evals.call(orig_call, mod, a, k)
            return orig_call(mod, *a, **k)

        torch.nn.Module.__call__ = module_call

        def compile_eager(model: Any = None, *a: Any, **k: Any) -> Any:
            st.note("torch.compile: traced eagerly (compiled steps held 0.82-1.07x the eager peak reserved "
                    "on the H100, docs/estimator.md)")
            if model is None:
                return lambda m: m
            return model

        torch.compile = compile_eager

        def save_nothing(obj: Any, f: Any, *a: Any, **k: Any) -> None:
            # fake tensors cannot be pickled, and a checkpoint is not the probe's to write
            st.note(f"torch.save skipped: {os.fspath(f) if isinstance(f, (str, os.PathLike)) else type(f).__name__}")

        torch.save = save_nothing
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
        patch_distributed(torch, st)
        frameworks.install(st.note)


def _count_flops_after_first_step(probe: _Probe) -> None:
    """Set ``probe.flops_mode``: the FLOP counter's dispatch mode, passing ops through until a first step.

    ``flops_per_step`` is the count between an optimizer's first two steps (``_Probe.step_flops``); what
    runs before the first step (imports, evaluation loops, the first iteration) need not be counted, and
    the counter's per-op work is a large part of the probe's time. A torch whose ``FlopCounterMode`` is
    itself the dispatch mode (no ``_FlopCounterMode``; its ``__enter__`` clears the counts) counts nothing.
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


def _has_params(mod: Any) -> bool:
    return any(True for _ in mod.parameters())


def _torch_version() -> str:
    t = sys.modules.get("torch")
    return str(getattr(t, "__version__", ""))


def _user_files() -> List[str]:
    """Source files imported from outside the Python installation and slurm-coloc (realpaths)."""
    skip = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        with contextlib.suppress(KeyError):
            skip.add(os.path.realpath(sysconfig.get_paths()[key]))
    skip.update(os.path.realpath(p) for p in sys.path if "site-packages" in p or "dist-packages" in p)
    ours = os.path.realpath(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    out = set()
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if not f or not f.endswith(".py") or not os.path.isabs(f) or f.startswith(("/etc/", "/usr/")):
            continue
        real = os.path.realpath(f)
        if real.startswith(ours + os.sep) or any(real.startswith(s + os.sep) for s in skip):
            continue
        out.add(real)
    return sorted(out)


def _reason(exc: BaseException) -> str:
    """One line naming what stopped the program, with the deepest frame of the program's own code."""
    if isinstance(exc, SystemExit):
        return f"the program exited (code {exc.code}) before its first optimizer step"
    msg = " ".join(str(exc).split())[:300]
    where = ""
    for fr in reversed(traceback.extract_tb(exc.__traceback__)):
        if "site-packages" not in fr.filename and "slurm_coloc" not in fr.filename and "<" not in fr.filename:
            where = f" at {os.path.basename(fr.filename)}:{fr.lineno}"
            break
    if isinstance(exc, FileNotFoundError) or "not found" in msg.lower() and "dataset" in msg.lower():
        return f"data missing{where}: {type(exc).__name__}: {msg}"
    return f"the program failed{where}: {type(exc).__name__}: {msg}"


def main(request_path: str) -> None:
    """Run the request (module docstring); never returns."""
    with open(request_path, encoding="utf-8") as fh:
        req = json.load(fh)
    probe = _Probe(req)
    sys.addaudithook(probe.audit)
    if os.environ.get("COLOC_PROBE_PROFILE"):  # developers: a cProfile of the child, written at finish
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
        probe.profile = (prof, os.environ["COLOC_PROBE_PROFILE"])
    if float(req.get("timeout_s", 0)) > 3:
        import faulthandler

        # where the program is stuck, in the log, just before the runner's time limit kills it
        faulthandler.dump_traceback_later(float(req["timeout_s"]) - 1.5, exit=False)
    step = "import torch"
    try:
        import torch

        version = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2] if x.isdigit())
        if version < MIN_TORCH:
            probe.finish("error", f"torch {torch.__version__} in the job's Python: the probe needs torch >= "
                         f"{'.'.join(map(str, MIN_TORCH))} (FakeTensorMode, optimizer step hooks)")
        step = "FakeTensorMode"
        from torch._subclasses.fake_tensor import FakeTensorMode

        fake_mode = FakeTensorMode(allow_non_fake_inputs=True)

        step = "the estimator's tracing modules"
        from slurm_coloc.estimate import workspace
        from slurm_coloc.estimate.cudamodes import (
            make_cuda_dropout_mode,
            make_cuda_fp32_mode,
            make_sdpa_mode,
            patch_functional_sdpa,
        )
        from slurm_coloc.estimate.trace import make_flop_counter, make_tracker

        try:
            ws = workspace.load()
        except Exception:  # noqa: BLE001 - no numpy in the job's Python: no workspaces, said so
            ws = None
        tracker = make_tracker(torch, ws.bytes_for if ws is not None else None)
        st = fakecuda.ProbeState(tracker)
        if ws is None:
            st.note("cuDNN workspace table unavailable in the job's Python: workspaces not replayed")
        probe.state = st
        probe.flops = make_flop_counter()
        _count_flops_after_first_step(probe)
        st.fail = lambda reason: probe.finish("error", reason)
        step = "torch.cuda imitation"
        cudaapi.patch_cuda_api(torch, st)
        step = "autocast imitation"
        cudaapi.patch_autocast(torch, st)
        step = "FakeTensor adaptation"
        fakecuda.patch_fake_tensor(torch, st)
        step = "optimizer/DataLoader hooks"
        probe.install(torch)
    except Exception as exc:  # noqa: BLE001 - the job's torch cannot host the probe
        v = _torch_version() or "?"
        probe.finish("error", f"the probe could not start in the job's Python (torch {v}, {step}): "
                     f"{type(exc).__name__}: {exc}")
        return
    sys.argv = [req["target"] if req["mode"] == "file" else req["target"]] + list(req["args"])
    if req["mode"] == "file":
        sys.path.insert(0, os.path.dirname(os.path.abspath(req["target"])))
    else:
        sys.path.insert(0, os.getcwd())
    status, reason = "no-step", "the program ended before its first optimizer step"
    try:
        with contextlib.ExitStack() as stack:
            # GPU ops run under these dispatch modes, one op at a time (fakecuda.GpuOps), lowest first:
            # fake tensors, the FLOP counter (it sees the ops the tracker passes on), the tracker, the tag
            gpu_modes: List[Any] = [fakecuda.make_fake_gpu_mode(torch, fake_mode)]
            if probe.flops is not None:
                gpu_modes.append(probe.flops_mode)
            gpu_modes += [tracker, fakecuda.make_gpu_tag_mode(torch, st)]
            st.gpu = fakecuda.GpuOps(torch, gpu_modes, lambda t: tracker.scalars.answer(torch, t))
            st.gpu.install()
            stack.enter_context(fakecuda.make_device_mode(torch, st))
            stack.enter_context(make_cuda_fp32_mode(torch))
            stack.enter_context(make_cuda_dropout_mode(torch, st.on_gpu))
            stack.enter_context(make_sdpa_mode(torch))
            stack.enter_context(patch_functional_sdpa(torch))
            stack.enter_context(fakecuda.make_host_fast_mode(torch))  # the highest: host calls skip the rest
            if req["mode"] == "file":
                runpy.run_path(req["target"], run_name="__main__")
            else:
                runpy.run_module(req["target"], run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            reason = _reason(exc)
    except BaseException as exc:  # noqa: BLE001 - reported, the parent falls back
        reason = _reason(exc)
        traceback.print_exc()
    probe.finish(status, reason)


if __name__ == "__main__":  # pragma: no cover - run by runner.BOOTSTRAP
    main(sys.argv[1])
