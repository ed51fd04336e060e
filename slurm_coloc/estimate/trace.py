"""Trace training steps without memory and replay them through the allocator model.

The model is built and trained on ``meta`` (fp32) or on fake CPU tensors under ``FakeTensorMode`` with CPU
autocast (AMP fp16 / bf16: autocast needs a real device type). The tracker (``tracker.py``) replays every new
storage through a :class:`CachingAllocatorModel`, freed when its storage object dies.

The step assumed: ``zero_grad(set_to_none=True)``; forward; cross-entropy on the logits; backward; optimizer
step (``foreach=True``, as PyTorch picks on CUDA). Two steps are traced so the optimizer state exists during
the second backward. ``flops_per_step`` is what ``FlopCounterMode`` (``tracker.py``, below the tracker on the
mode stack) counts in the second step: matmuls, convolutions and fused attention, forward and backward
(torch's shape formulas; element-wise ops, normalisations and the optimizer count zero).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from slurm_coloc.errors import EstimateError
from slurm_coloc.estimate.convcall import ConvCall
from slurm_coloc.estimate.gpulike import make_cuda_fp32_mode, make_sdpa_mode, pick_output
from slurm_coloc.estimate.loader import (
    build_model,
    deferred_imports,
    load_callable,
    may_need_real_dynamo,
    short_error,
    validate_spec,
)
from slurm_coloc.estimate.spec import ModelSpec
from slurm_coloc.estimate.tracker import WorkspaceFn, make_flop_counter, make_tracker, step_flops

TRACE_STEPS = 2

ACTIVATIONS = (
    "ReLU", "GELU", "SiLU", "Tanh", "Sigmoid", "LeakyReLU", "ELU", "Softplus", "Hardswish",
    "Mish", "ReLU6", "Hardsigmoid", "SELU", "PReLU",
)


@dataclass
class ReplayedPeaks:
    """What the calibrated bound (``combine.bound_from_trace``) reads of one replayed run, a trace's or the
    probe's (bytes; ``param_b`` 0: not seen apart, the probe's)."""

    peak_allocated_b: int
    peak_reserved_b: int
    param_b: int = 0
    depthwise_max_hw: int = 0
    assumed_values: Dict[str, int] = field(default_factory=dict)
    conv_workspace_max_b: int = 0
    flops_per_step: Optional[int] = None


@dataclass(kw_only=True)
class TraceResult(ReplayedPeaks):
    """One traced training run of a spec (bytes unless named otherwise).

    ``peak_allocated_b``: live tensor bytes (512 B blocks); ``peak_reserved_b``: the replayed caching
    allocator's (cuBLAS workspace included); ``params`` counts trainable and frozen;
    ``activations_per_sample``: leaf-module output elements per sample; ``activation_fn``: the dominant
    activation's class name or ""; ``depthwise_max_hw``: largest H x W into a depthwise ``Conv2d`` (``groups
    == in_channels > 1``), 0 without; ``assumed_values``: value reads answered by assumption, by kind
    (``gpulike.py``); ``conv_workspace_max_b``: largest cuDNN workspace replayed for one call (0 without a
    workspace model); ``flops_per_step``: FLOP of one step (module docstring), None when not counted.
    """

    params: int
    buffer_b: int
    activations_per_sample: float
    layer_counts: Dict[str, int] = field(default_factory=dict)
    activation_fn: str = ""
    ops: int = 0
    conv_calls: List[ConvCall] = field(default_factory=list)


def _optimizer(torch: Any, name: str, params: Any) -> Any:
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.01, foreach=True)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9, foreach=True)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-3, foreach=True)
    return torch.optim.AdamW(params, lr=1e-3, foreach=True)


def _module_features(model: Any) -> Tuple[Dict[str, int], str]:
    counts = {k: 0 for k in ("linear", "conv", "batchnorm", "layernorm", "dropout", "attention",
                             "embedding", "leaf")}
    acts: Dict[str, int] = {}
    for mod in model.modules():
        name = type(mod).__name__
        low = name.lower()
        if not list(mod.children()):
            counts["leaf"] += 1
        if "linear" in low:
            counts["linear"] += 1
        elif low.startswith("conv"):
            counts["conv"] += 1
        elif "batchnorm" in low:
            counts["batchnorm"] += 1
        elif "layernorm" in low or "groupnorm" in low or "rmsnorm" in low:
            counts["layernorm"] += 1
        elif "dropout" in low:
            counts["dropout"] += 1
        elif "embedding" in low:
            counts["embedding"] += 1
        if "attention" in low:
            counts["attention"] += 1
        if name in ACTIVATIONS:
            acts[name] = acts.get(name, 0) + 1
    dominant = max(sorted(acts), key=lambda k: acts[k]) if acts else ""
    return counts, dominant


def _loss(torch: Any, out: Any, amp: bool, device: str) -> Tuple[Any, Any, Any]:
    """``(loss, logits, targets)`` of the traced step for the model's output tensor ``out``.

    ``(N, C)`` logits: cross-entropy against class 0; ``(..., C)``: flattened to ``(-1, C)``
    first (token logits); 1-D (one value per sample): its mean; 0-dim: taken as the loss itself.
    """
    if out.dim() == 0:
        return (out.float() if amp else out), out, None
    if out.dim() == 1:
        return (out.float() if amp else out).mean(), out, None
    logits = out.reshape(-1, out.shape[-1]) if out.dim() > 2 else out
    y = torch.zeros(logits.shape[0], dtype=torch.long, device=device)
    loss = torch.nn.functional.cross_entropy(logits.float() if amp else logits, y)
    return loss, logits, y


def _build_meta(spec: ModelSpec, fn: Any, torch: Any) -> Any:
    """Build the model with meta parameters: directly on ``meta`` when its init allows, else on
    the CPU for real (inits that read values, e.g. ``.item()``) and then moved to ``meta``."""
    try:
        with torch.device("meta"):
            model = build_model(spec, fn)
    except EstimateError:
        model = build_model(spec, fn)  # raises EstimateError naming the model if it fails here too
    try:
        if any(t.device.type != "meta" for t in list(model.parameters()) + list(model.buffers())):
            model = model.to("meta")
    except Exception as exc:
        raise EstimateError(f"model {spec.model}: moving it to the meta device failed: "
                            f"{short_error(exc)}") from exc
    return model


def trace_spec(spec: ModelSpec, workspace: Optional[WorkspaceFn] = None,
               count_flops: bool = True) -> TraceResult:
    """Trace ``TRACE_STEPS`` training steps of ``spec`` with no real memory.

    ``workspace`` gives a convolution call's cuDNN workspace bytes on the target GPU (None: none replayed);
    ``count_flops`` does not change the memory figures.

    Raises:
        EstimateError: the model cannot be imported, built, or run on the input shape.
    """
    validate_spec(spec)
    if spec.precision == "fp32":
        # The meta-device trace never needs torch._dynamo, which costs ~2 s to import
        # (loader.py); if the model's code needs the real one in a way the stand-ins cannot
        # serve, trace again without them (the same trace, only slower).
        try:
            with deferred_imports():
                return _trace(spec, workspace, count_flops)
        except Exception as exc:  # unless plainly the model's own error,
            if not may_need_real_dynamo(exc):  # the plain trace below decides
                raise
    return _trace(spec, workspace, count_flops)


def _activation_hooks(torch: Any, model: Any, acts: List[float], dw_hw: List[int]) -> List[Any]:
    """Forward hooks on every leaf module: add its output elements to ``acts[-1]`` and the largest depthwise
    ``Conv2d`` input height x width to ``dw_hw[0]``. Returns the hook handles (to remove)."""

    def hook(m: Any, inp: Any, out: Any) -> None:
        from torch.utils._pytree import tree_flatten

        acts[-1] += sum(t.numel() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
        if (isinstance(m, torch.nn.Conv2d) and m.groups > 1 and m.groups == m.in_channels
                and inp and isinstance(inp[0], torch.Tensor) and inp[0].dim() >= 3):
            dw_hw[0] = max(dw_hw[0], int(inp[0].shape[-1]) * int(inp[0].shape[-2]))

    return [mod.register_forward_hook(hook) for mod in model.modules() if not list(mod.children())]


def _input(torch: Any, spec: ModelSpec, device: str) -> Any:
    """The batch, ``(batch_size, *input_shape)``: int64 zeros (token ids) or an empty float32 tensor."""
    shape = (spec.batch_size, *spec.input_shape)
    if spec.input_dtype == "int64":
        return torch.zeros(shape, dtype=torch.long, device=device)
    return torch.empty(shape, dtype=torch.float32, device=device)


def _train_step(torch: Any, spec: ModelSpec, model: Any, x: Any, opt: Any, device: str) -> None:
    """One traced training step (module docstring); its tensors are freed on return.

    Raises:
        EstimateError: the forward, backward or optimizer step failed, or the forward returned no tensor.
    """
    amp = spec.precision != "fp32"
    ac_dtype = torch.float16 if spec.precision == "amp-fp16" else torch.bfloat16
    opt.zero_grad(set_to_none=True)
    try:
        with torch.autocast("cpu", dtype=ac_dtype, enabled=amp), (
                make_cuda_fp32_mode(torch) if amp else contextlib.nullcontext()):
            raw = model(x)
            out = pick_output(torch, raw)
            if out is None:
                raise EstimateError(
                    f"model {spec.model}: forward returned {type(raw).__name__} without a tensor"
                    " (expected logits, or a ModelOutput/dict/tuple holding them)")
            del raw
            loss, logits, y = _loss(torch, out, amp, device)
    except EstimateError:
        raise
    except Exception as exc:
        raise EstimateError(
            f"model {spec.model}: forward on input {tuple(spec.input_shape)} "
            f"({spec.input_dtype}) failed: {short_error(exc)}"
        ) from exc
    try:
        loss.backward()
        opt.step()
    except Exception as exc:
        raise EstimateError(f"model {spec.model}: backward/optimizer step failed: "
                            f"{short_error(exc)}") from exc
    del out, logits, loss, y


def _fake_device(amp: bool) -> Tuple[Any, str]:
    """Where the trace runs: ``(outer context, device)``: fake CPU tensors under ``FakeTensorMode`` for AMP
    (CPU autocast needs a real device type), else the ``meta`` device."""
    if amp:
        from torch._subclasses.fake_tensor import FakeTensorMode

        return FakeTensorMode(allow_non_fake_inputs=True), "cpu"
    return contextlib.nullcontext(), "meta"


def _trace(spec: ModelSpec, workspace: Optional[WorkspaceFn] = None, count_flops: bool = True) -> TraceResult:
    """The body of :func:`trace_spec` (one trace, with whatever ``torch._dynamo`` is in place)."""
    fn = load_callable(spec)
    import torch

    amp = spec.precision != "fp32"
    tracker = make_tracker(torch, workspace)
    outer, device = _fake_device(amp)
    model = _build_meta(spec, fn, torch)
    acts: List[float] = []
    flops = make_flop_counter() if count_flops else None
    flop_totals: List[int] = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(outer)
        if amp:
            model = model.to_empty(device="cpu")  # fake CPU tensors, so CPU autocast applies
        if flops is not None:
            stack.enter_context(flops)  # below the tracker: sees the ops it passes on (module docstring)
        stack.enter_context(make_sdpa_mode(torch))
        stack.enter_context(tracker)
        for t in list(model.parameters()) + list(model.buffers()):
            tracker.track(t)
        model.train()
        counts, act_fn = _module_features(model)
        params = sum(p.numel() for p in model.parameters())
        param_b = sum(p.numel() * p.element_size() for p in model.parameters())
        buffer_b = sum(b.numel() * b.element_size() for b in model.buffers())
        dw_hw = [0]
        hooks = _activation_hooks(torch, model, acts, dw_hw)
        x = _input(torch, spec, device)
        trainable = [p for p in model.parameters() if p.requires_grad]
        if not trainable:
            raise EstimateError(f"model {spec.model}: it has no trainable parameters")
        opt = _optimizer(torch, spec.optimizer, trainable)
        for _ in range(TRACE_STEPS):
            acts.append(0.0)
            _train_step(torch, spec, model, x, opt, device)
            if flops is not None:
                flop_totals.append(int(flops.get_total_flops()))
        for h in hooks:
            h.remove()
    return TraceResult(
        peak_allocated_b=tracker.alloc.peak_allocated_b, peak_reserved_b=tracker.alloc.peak_reserved_b,
        params=int(params), param_b=int(param_b), buffer_b=int(buffer_b),
        activations_per_sample=float(acts[-1]) / spec.batch_size if acts else math.nan,
        layer_counts=counts, activation_fn=act_fn, ops=tracker.ops, depthwise_max_hw=dw_hw[0],
        assumed_values=dict(tracker.scalars.counts), conv_calls=list(tracker.conv_calls),
        conv_workspace_max_b=int(tracker.ws_max_b), flops_per_step=step_flops(flop_totals, flops))
