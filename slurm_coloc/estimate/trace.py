"""Trace training steps without memory and replay them through the allocator model.

The model is built and trained on the ``meta`` device (fp32) or on fake CPU tensors under
``FakeTensorMode`` with CPU autocast (AMP fp16 / bf16, since autocast needs a real device type).
A ``TorchDispatchMode`` sees every op; each new tensor storage is "allocated" in a
:class:`CachingAllocatorModel` and "freed" when its storage object dies (storages keep one
Python object for their lifetime, so a weakref finalizer marks the real free point).

The training step assumed: ``zero_grad(set_to_none=True)``; forward;
cross-entropy on the logits; backward; optimizer step (``foreach=True``, as PyTorch picks on
CUDA). Two steps are traced so the optimizer state exists during the second backward.

FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` sits below the allocator tracker on the dispatch
mode stack (it sees the ops the tracker passes on, on the same meta/fake tensors, and runs nothing
itself on them); ``flops_per_step`` is what it counts in the second traced step: matrix
multiplications, convolutions and fused attention forward and backward (torch's shape formulas).
Element-wise ops, normalisations and the optimizer step count zero in those formulas.
"""
from __future__ import annotations

import contextlib
import math
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from slurm_coloc.errors import EstimateError
from slurm_coloc.estimate.allocator import CachingAllocatorModel
from slurm_coloc.estimate.convcall import ConvCall, from_aten, workspace_parts
from slurm_coloc.estimate.cudamodes import make_cuda_fp32_mode, make_sdpa_mode
from slurm_coloc.estimate.datadep import ScalarAssumptions, has_no_data, pick_output
from slurm_coloc.estimate.lazyimports import deferred_imports, may_need_real_dynamo
from slurm_coloc.estimate.loader import _short, build_model, load_callable, validate_spec
from slurm_coloc.estimate.spec import ModelSpec

MIB = 1 << 20
TRACE_STEPS = 2
# cuBLAS workspace PyTorch allocates through the caching allocator at the first GEMM on Hopper
# (CublasHandlePool.cpp: 32 MiB default for sm90+; 8 MiB + 128 KiB before Hopper).
CUBLAS_WORKSPACE_B = 32 * MIB
# cuBLASLt keeps its own workspace of the same size (seen on H100: small models hold ~64 MiB
# more allocated than their tensors, data/hopper).
CUBLASLT_WORKSPACE_B = 32 * MIB
_GEMM_OPS = ("mm", "addmm", "bmm", "baddbmm", "convolution", "_scaled_dot_product", "linear")

ACTIVATIONS = (
    "ReLU", "GELU", "SiLU", "Tanh", "Sigmoid", "LeakyReLU", "ELU", "Softplus", "Hardswish",
    "Mish", "ReLU6", "Hardsigmoid", "SELU", "PReLU",
)


@dataclass
class TraceResult:
    """What one traced training run of a spec gives (bytes unless named otherwise).

    Attributes:
        peak_allocated_b: peak of live tensor bytes (rounded to 512 B blocks).
        peak_reserved_b: peak reserved by the replayed caching allocator (incl. cuBLAS workspace).
        params: parameter count (trainable and frozen).
        param_b, buffer_b: bytes of parameters and buffers.
        activations_per_sample: sum of leaf-module output elements per sample (forward hooks).
        layer_counts: counts of module kinds (linear, conv, batchnorm, layernorm, dropout,
            attention, embedding, leaf).
        activation_fn: dominant activation module's class name ("" if none).
        ops: number of dispatched ops traced.
        depthwise_max_hw: largest input height x width seen by a depthwise ``Conv2d``
            (``groups == in_channels > 1``), 0 without one (see ``combine.CUDNN_DW_FP16_MIB``).
        assumed_values: value reads (``.item()``, ``bool()``) answered by assumption, by kind
            (``datadep.py``); empty when the trace needed no values.
        conv_calls: every convolution call of the traced steps, in order (``convcall.py``).
        conv_workspace_max_b: the largest cuDNN workspace replayed for one call (0 without a
            workspace model, ``workspace.py``).
        flops_per_step: FLOPs (FLOP, not GFLOP) of one training step as ``FlopCounterMode`` counts
            them (module docstring), None when not counted.
    """

    peak_allocated_b: int
    peak_reserved_b: int
    params: int
    param_b: int
    buffer_b: int
    activations_per_sample: float
    layer_counts: Dict[str, int] = field(default_factory=dict)
    activation_fn: str = ""
    ops: int = 0
    depthwise_max_hw: int = 0
    assumed_values: Dict[str, int] = field(default_factory=dict)
    conv_calls: List[ConvCall] = field(default_factory=list)
    conv_workspace_max_b: int = 0
    flops_per_step: Optional[int] = None


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
        """Allocate tensor ``t``'s storage once; it is freed when the storage object dies.

        Args:
            t: a (fake) tensor; its untyped storage's ``nbytes()`` go through ``alloc.malloc``.
        """
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
        """Record a convolution call; cuDNN takes its workspace (bytes, ``workspace``) from the caching
        allocator after the outputs exist and gives it back when the call ends (Conv_v8.cpp): a transient
        block.

        Args:
            call: the convolution's shapes and parameters (appended to ``conv_calls``).
            workspace: the workspace model (``ConvCall`` part -> bytes), or None to record the call only.
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

    Its ``alloc`` (``CachingAllocatorModel``) holds the replayed peaks; ``handles`` maps live
    storages to allocator blocks; ``track(t)`` allocates ``t``'s storage (an instance attribute
    may replace it to filter); ``conv_calls``, ``ws_max_b`` (cuDNN workspaces from ``workspace``),
    ``scalars`` (value reads answered by assumption) and ``ops`` record what was seen.

    Args:
        torch: the imported ``torch`` module (imported by the caller, lazily).
        workspace: bytes of cuDNN workspace one convolution call takes
            (``workspace.WorkspaceModel.bytes_for``); None: no workspace replayed.
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
                            f"{_short(exc)}") from exc
    return model


def trace_spec(spec: ModelSpec, workspace: Optional[WorkspaceFn] = None,
               count_flops: bool = True) -> TraceResult:
    """Trace ``TRACE_STEPS`` training steps of ``spec`` with no real memory.

    Args:
        spec: the training job.
        workspace: bytes of cuDNN workspace a convolution call takes on the target GPU
            (``workspace.WorkspaceModel.bytes_for``); None replays no workspace.
        count_flops: count the FLOPs of one step (``TraceResult.flops_per_step``); the memory
            figures are the same either way.

    Returns:
        TraceResult with the replayed allocator's peaks and the model's features.

    Raises:
        EstimateError: the model cannot be imported, built, or run on the input shape.
    """
    validate_spec(spec)
    if spec.precision == "fp32":
        # The meta-device trace never needs torch._dynamo, which costs ~2 s to import
        # (lazyimports.py); if the model's code needs the real one in a way the stand-ins cannot
        # serve, trace again without them (the same trace, only slower).
        try:
            with deferred_imports():
                return _trace(spec, workspace, count_flops)
        except Exception as exc:  # unless plainly the model's own error,
            if not may_need_real_dynamo(exc):  # the plain trace below decides
                raise
    return _trace(spec, workspace, count_flops)


class _GlobalOnly:
    """Stands in for ``FlopCounterMode``'s ``ModuleTracker``: every FLOP goes to ``"Global"``, no hooks."""

    parents = frozenset({"Global"})

    def __enter__(self) -> "_GlobalOnly":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def make_flop_counter() -> Any:
    """A ``FlopCounterMode(display=False)`` for a total count, or None when this torch has none.

    Its ``ModuleTracker`` (newer torch) puts global module hooks that register ``register_multi_grad_hook``s
    on every module's inputs and outputs; those hold gradients until all of a module's inputs have theirs,
    which changed the replayed peak of DenseNet-121 (its layers take lists of tensors). A total needs no
    per-module attribution, so the tracker is replaced by :class:`_GlobalOnly`: the counting mode alone stays.
    A formula that raises counts 0 and sets ``coloc_failed`` (the count is then unknown, the trace goes on).
    """
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
        def guarded(formula: Callable[..., Any]) -> Callable[..., Any]:
            def count(*args: Any, **kwargs: Any) -> Any:
                try:
                    return formula(*args, **kwargs)
                except Exception:  # a FLOP formula never fails the memory trace
                    counter.coloc_failed = True
                    return 0
            return count

        counter.flop_registry = {k: guarded(v) for k, v in registry.items()}
    return counter


def step_flops(totals: List[int], counter: Any) -> Optional[int]:
    """FLOPs between the last two readings of ``counter.get_total_flops()`` (one training step), or None
    when fewer than two readings or a formula failed.

    Args:
        totals: the counter's running totals (FLOP), one per step end.
        counter: the ``make_flop_counter`` mode (None: no count).
    """
    if counter is None or getattr(counter, "coloc_failed", False) or len(totals) < 2:
        return None
    return int(totals[-1] - totals[-2])


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
            f"({spec.input_dtype}) failed: {_short(exc)}"
        ) from exc
    try:
        loss.backward()
        opt.step()
    except Exception as exc:
        raise EstimateError(f"model {spec.model}: backward/optimizer step failed: {_short(exc)}") from exc
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
        peak_allocated_b=tracker.alloc.peak_allocated_b,
        peak_reserved_b=tracker.alloc.peak_reserved_b,
        params=int(params),
        param_b=int(param_b),
        buffer_b=int(buffer_b),
        activations_per_sample=float(acts[-1]) / spec.batch_size if acts else math.nan,
        layer_counts=counts,
        activation_fn=act_fn,
        ops=tracker.ops,
        depthwise_max_hw=dw_hw[0],
        assumed_values=dict(tracker.scalars.counts),
        conv_calls=list(tracker.conv_calls),
        conv_workspace_max_b=int(tracker.ws_max_b),
        flops_per_step=step_flops(flop_totals, flops),
    )
