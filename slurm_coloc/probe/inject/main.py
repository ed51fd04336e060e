"""The probe inside the job's Python: run the training program on fake tensors, stop, report.

Entry: :func:`main` with the path of a JSON request written by ``runner.py``::

    {"mode": "file"|"module", "target": "train.py"|"pkg.mod", "args": [...],
     "result": "/scratch/result.json", "steps": 2, "scratch": "/scratch", "program_dir": "/home/u/proj"}

The program runs as ``__main__`` (``runpy``) with the job's ``sys.argv``, the GPU imitated by ``fakecuda.py``
and its GPU ops replayed by the estimator's tracker (``estimate/tracker.py``); evaluation passes and
gradient-accumulation micro-steps are ``repeats.py``'s, the hooks ``hooks.py``'s. It stops when
every optimizer it created has run ``steps`` steps (default 2: the second cycle holds the optimizer state,
the steady-state peak, as the estimator's two traced steps), or any one ``steps + 2``; a program with no
``torch.optim`` optimizer is stopped after its ``steps``-th ``backward()``. Then the result JSON is written
and the process ends with ``os._exit(0)``: nothing the program would save at its end runs.

Result keys: ``status`` (``ok`` | ``no-step`` | ``error``), ``reason``, ``peak_reserved_b``,
``peak_allocated_b``, ``optimizers``, ``steps``, ``forwards``, ``autocast``, ``nccl_group``
(``inject/distributed.py``), ``param_dtypes``, ``depthwise_max_hw``, ``conv_workspace_max_b``,
``assumed_values``, ``notes``, ``flops_per_step`` (FLOP between the first optimizer's first two steps, all
ops of the process; None when not counted), ``outside_writes`` (paths opened for writing outside the scratch
directory), ``user_files`` (source files imported from outside the Python installation).
"""
from __future__ import annotations

import contextlib
import json
import os
import runpy
import shutil
import sys
import traceback
from typing import Any, Dict, List, Tuple

from slurm_coloc.probe.inject import cudaapi, devicemode, fakecuda, hooks, report

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
        self.flops: Any = None  # estimate.tracker.make_flop_counter(), below the tracker
        self.flop_totals: Dict[int, List[int]] = {}
        self.evals: Any = None  # repeats.EvalPasses, once torch is imported
        self.micro: Any = None  # repeats.MicroSteps, once torch is imported
        self.smaller: Any = None  # smaller.SmallerCalls, once torch is imported
        self.flops_mode: Any = None  # the FLOP counter's dispatch mode (hooks.count_flops_after_first_step)
        self.finishing = False
        self.profile: Any = None  # (cProfile.Profile, path) with COLOC_PROBE_PROFILE

    # -- what the program writes -----------------------------------------------------------
    def audit(self, event: str, args: Any) -> None:
        """The audit hook (``sys.addaudithook``): note each file opened for writing outside the scratch
        directory.

        A mirrored file link opened for writing first becomes a scratch file (a copy of its target unless the
        mode has ``w``).
        """
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
        if len(self.outside_writes) >= 50 or (event == "os.mkdir" and os.path.isdir(real)):
            return  # mkdir of a directory that exists (``os.makedirs(p, exist_ok=True)``) changes nothing
        if real.startswith(self.scratch + os.sep) or real.startswith("/dev/") or real.startswith("/proc/"):
            return
        if real not in self.outside_writes:
            self.outside_writes.append(real)

    # -- stopping ------------------------------------------------------------------------------
    def on_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        """An optimizer step: count it, note the FLOPs so far, and finish ``ok`` once every optimizer stepped
        ``steps_wanted`` times (or one stepped two more).
        """
        key = id(opt)
        if self.micro is not None:
            self.micro.on_step()
        if self.flops is not None:
            extra = self.micro.extra_flops if self.micro is not None else 0
            self.flop_totals.setdefault(key, []).append(int(self.flops.get_total_flops()) + extra)
        self.opt_steps[key] = self.opt_steps.get(key, 0) + 1
        if self.state is not None and self.state.gpu is not None and not self.state.gpu.use_optional:
            self.state.gpu.set_optional(True)  # the FLOP counter counts from the first step on
        self.opt_names.setdefault(key, type(opt).__name__)
        done = all(n >= self.steps_wanted for n in self.opt_steps.values())
        if done or max(self.opt_steps.values()) >= self.steps_wanted + 2:
            self.finish("ok", "")

    def step_flops(self) -> Any:
        """FLOPs between the first two steps of the first optimizer that stepped twice, or None."""
        from slurm_coloc.estimate.tracker import step_flops

        for key in self.opt_steps:
            totals = self.flop_totals.get(key, [])
            if len(totals) >= 2:
                return step_flops(totals[:2], self.flops)
        return None

    def finish(self, status: str, reason: str) -> None:
        """Write the result JSON (``report.result``) atomically to the request's ``result`` path, then
        ``os._exit(0)``.

        With ``ok``, evaluation batches and smaller calls are replayed first. ``status``: ``ok`` | ``no-step``
        | ``error``; ``reason`` "" for ``ok``.
        """
        st = self.state
        if status == "ok" and self.evals is not None and st is not None and not self.finishing:
            self.finishing = True
            self.evals.replay_eval_batches(st.note)
            if self.smaller is not None:
                self.smaller.settle(st.note)
            for skipped in (self.evals.summary_note(), self.micro.summary_note() if self.micro else ""):
                if skipped:
                    st.note(skipped)
        out = report.result(self, status, reason)
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

def main(request_path: str) -> None:
    """Run the request JSON the runner wrote (module docstring; ``timeout_s`` in s); never returns."""
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

        from slurm_coloc.probe.reaper import DUMP_SIGNAL

        # where the program is stuck, in the log: the reaper asks just before its time limit kills it
        with contextlib.suppress(ValueError, OSError, RuntimeError):
            faulthandler.register(DUMP_SIGNAL, all_threads=True)
    torch, fake_mode = _start(probe)
    sys.argv = [req["target"] if req["mode"] == "file" else req["target"]] + list(req["args"])
    if req["mode"] == "file":
        sys.path.insert(0, os.path.dirname(os.path.abspath(req["target"])))
    else:
        sys.path.insert(0, os.getcwd())
    status, reason = "no-step", "the program ended before its first optimizer step"
    try:
        _run(probe, torch, fake_mode)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            reason = report.reason_of(exc)
    except BaseException as exc:  # reported, the parent falls back
        reason = report.reason_of(exc)
        traceback.print_exc()
    probe.finish(status, reason)


def _start(probe: _Probe) -> Tuple[Any, Any]:
    """Import torch and install the fake GPU, the tracker and the hooks: ``(torch, fake_mode)``; a torch
    that cannot host the probe ends it with the reason."""
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
        from slurm_coloc.estimate.tracker import make_flop_counter, make_tracker

        try:
            ws = workspace.load()
        except Exception:  # no numpy in the job's Python: no workspaces, said so
            ws = None
        tracker = make_tracker(torch, ws.bytes_for if ws is not None else None)
        st = fakecuda.ProbeState(tracker)
        if ws is None:
            st.note("cuDNN workspace table unavailable in the job's Python: workspaces not replayed")
        probe.state = st
        probe.flops = make_flop_counter()
        hooks.count_flops_after_first_step(probe)
        st.fail = lambda reason: probe.finish("error", reason)
        step = "torch.cuda imitation"
        cudaapi.patch_cuda_api(torch, st)
        step = "typed tensor constructors"
        st.typed = devicemode.patch_typed_tensors(torch, st)
        step = "autocast imitation"
        cudaapi.patch_autocast(torch, st)
        step = "FakeTensor adaptation"
        fakecuda.patch_fake_tensor(torch, st)
        step = "optimizer/DataLoader hooks"
        hooks.install(probe, torch)
    except Exception as exc:  # the job's torch cannot host the probe
        v = report.torch_version() or "?"
        probe.finish("error", f"the probe could not start in the job's Python (torch {v}, {step}): "
                     f"{type(exc).__name__}: {exc}")
    return torch, fake_mode


def _run(probe: _Probe, torch: Any, fake_mode: Any) -> None:
    """The program as ``__main__`` under the probe's modes."""
    from slurm_coloc.estimate.gpulike import (
        make_cuda_dropout_mode,
        make_cuda_fp32_mode,
        make_sdpa_mode,
        patch_functional_sdpa,
    )

    req, st = probe.req, probe.state
    tracker = st.tracker
    with contextlib.ExitStack() as stack:
        # GPU ops run under these dispatch modes, one op at a time (fakecuda.GpuOps), lowest first:
        # fake tensors, the FLOP counter (from the first step on; it sees what the tracker passes on),
        # the tracker
        gpu_modes: List[Any] = [fakecuda.make_fake_gpu_mode(torch, fake_mode)]
        if probe.flops is not None:
            gpu_modes.append(probe.flops_mode)
        gpu_modes.append(tracker)
        fakecuda.tag_gpu_ops(st)
        st.gpu = fakecuda.GpuOps(torch, gpu_modes, lambda t: tracker.scalars.answer(torch, t), state=st,
                                 optional=probe.flops_mode)
        st.gpu.install()
        stack.enter_context(devicemode.make_device_mode(torch, st))
        stack.enter_context(make_cuda_fp32_mode(torch))
        stack.enter_context(make_cuda_dropout_mode(torch, st.on_gpu))
        stack.enter_context(make_sdpa_mode(torch))
        stack.enter_context(patch_functional_sdpa(torch))
        stack.enter_context(fakecuda.make_host_fast_mode(torch))  # the highest: host calls skip the rest
        if req["mode"] == "file":
            runpy.run_path(req["target"], run_name="__main__")
        else:
            runpy.run_module(req["target"], run_name="__main__", alter_sys=True)


if __name__ == "__main__":  # pragma: no cover - run by runner.BOOTSTRAP
    main(sys.argv[1])
