"""One CUDA device that exists without a GPU, for a training program traced on fake tensors.

Runs inside the job's Python (``inject/main.py``). Every tensor of the program is a fake CPU
tensor (``FakeTensorMode``: shapes and dtypes, no data), as in the estimator's AMP trace
(``estimate/trace.py``). The device "cuda" is imitated on top of that:

* the ``torch.cuda`` API answers as for one H100 (``is_available``, ``device_count``,
  ``get_device_properties``, memory statistics from the replayed allocator, no-op streams,
  events and seeds);
* a tensor is "on the GPU" when its storage was made by a CUDA operation: a factory called with
  a CUDA device, a move (``.cuda()``, ``.to("cuda")``, ``Module.to(device)``), or any op taking
  such a tensor. Only those storages are replayed through the caching-allocator model (the
  tracker of ``estimate/trace.py``); host tensors (data loading, CPU-side state) are not;
* such tensors report ``device == cuda:0`` and ``is_cuda``, so code that builds new tensors on
  ``x.device`` keeps them on the GPU, as on a real one;
* ``torch.autocast("cuda", dtype)`` (also ``torch.cuda.amp.autocast``) runs CPU autocast with
  that dtype plus ``estimate.cudamodes.make_cuda_fp32_mode`` (CUDA's float32 list), the same
  imitation the estimator's AMP trace uses.

The real autograd engine refuses fake tensors of device ``cuda`` without a driver (it looks
for a primary context), which is why the tensors stay CPU tensors underneath.
"""
from __future__ import annotations

import contextlib
import types
import weakref
from typing import Any, Callable, Dict, List, Optional

H100_NAME = "NVIDIA H100 80GB HBM3"
H100_TOTAL_B = 81559 * (1 << 20)


class ProbeState:
    """What the probe saw and the switches its modes share.

    Attributes:
        tracker: the allocation tracker of ``estimate.trace.make_tracker`` (its ``alloc`` is the
            caching-allocator model).
        force: None (decide by the op's inputs), True (the op makes GPU tensors), False (host).
        cuda_op: whether the op being dispatched makes GPU tensors.
        autocast_dtypes: dtype names of the CUDA autocast regions entered.
        notes: things the probe changed or assumed, one short line each.
        fail: ends the probe with a reason (set by ``main.py``), for what this torch cannot imitate.
    """

    def __init__(self, tracker: Any) -> None:
        self.tracker = tracker
        self.force: Optional[bool] = None
        self.cuda_op = False
        self.dispatch_depth = 0
        self.autocast_dtypes: List[str] = []
        self.notes: List[str] = []
        self.fail: Optional[Callable[[str], None]] = None

    def note(self, text: str) -> None:
        """Add ``text`` once."""
        if text not in self.notes:
            self.notes.append(text)

    def on_gpu(self, t: Any) -> bool:
        """True when the tensor ``t``'s storage is replayed as GPU memory."""
        try:
            return t.untyped_storage()._cdata in self.tracker.handles
        except Exception:  # noqa: BLE001 - tensors without storage (sparse, nested) are host
            return False


def _is_cuda_device(torch: Any, d: Any) -> bool:
    if isinstance(d, torch.device):
        return d.type == "cuda"
    if isinstance(d, str):
        return d.split(":")[0].strip() == "cuda"
    return False


def make_gpu_tag_mode(torch: Any, state: ProbeState) -> Any:
    """A dispatch mode (entered above the tracker) that decides which op outputs are GPU memory."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class _GpuTag(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = kwargs or {}
            prev = state.cuda_op
            if state.force is not None:
                state.cuda_op = state.force
            else:
                state.cuda_op = any(isinstance(a, torch.Tensor) and state.on_gpu(a)
                                    for a in tree_flatten((args, kwargs))[0])
            state.dispatch_depth += 1
            try:
                return func(*args, **kwargs)
            finally:
                state.cuda_op = prev
                state.dispatch_depth -= 1

    orig_track = state.tracker.track

    def track(t: Any) -> None:
        if state.cuda_op:
            orig_track(t)

    state.tracker.track = track  # instance attribute: the tracker calls self.track
    return _GpuTag()


def _zeros_list(shape: Any, floating: bool) -> Any:
    zero: Any = 0.0 if floating else 0
    if not shape:
        return zero
    inner = _zeros_list(shape[1:], floating)
    return [inner if not isinstance(inner, list) else list(inner) for _ in range(shape[0])]


def make_device_mode(torch: Any, state: ProbeState) -> Any:
    """A function mode mapping the device ``cuda`` to GPU-tagged fake CPU tensors (module docstring)."""
    from torch.overrides import TorchFunctionMode

    from slurm_coloc.estimate.datadep import has_no_data

    cuda0 = torch.device("cuda", 0)
    cpu = torch.device("cpu")
    T = torch.Tensor
    dev_get, is_cuda_get = T.device.__get__, T.is_cuda.__get__

    def to_gpu(t: Any, dtype: Any = None, memory_format: Any = None) -> Any:
        if state.on_gpu(t) and (dtype is None or dtype == t.dtype):
            return t
        kw: Dict[str, Any] = {"dtype": dtype or t.dtype}
        if memory_format is not None:
            kw["memory_format"] = memory_format
        state.force = True
        try:
            return torch.ops.aten._to_copy.default(t, **kw)
        finally:
            state.force = None

    def to_host(t: Any, dtype: Any = None) -> Any:
        if not state.on_gpu(t):
            return t if dtype is None or dtype == t.dtype else t.to(dtype)
        state.force = False
        try:
            return torch.ops.aten._to_copy.default(t, dtype=dtype or t.dtype)
        finally:
            state.force = None

    def tensor_to(t: Any, args: Any, kwargs: Dict[str, Any]) -> Any:
        device = kwargs.get("device")
        dtype = kwargs.get("dtype")
        for a in args:
            if isinstance(a, torch.dtype):
                dtype = a
            elif isinstance(a, torch.Tensor):
                device, dtype = (cuda0 if state.on_gpu(a) else a.device), a.dtype
            elif isinstance(a, (str, torch.device, int)) and not isinstance(a, bool):
                device = cuda0 if isinstance(a, int) else a
        if device is None:
            return None
        if _is_cuda_device(torch, device):
            return to_gpu(t, dtype, kwargs.get("memory_format"))
        if torch.device(device).type == "cpu":
            return to_host(t, dtype)
        return None

    class _Device(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = dict(kwargs or {})
            if func is dev_get:
                return cuda0 if state.on_gpu(args[0]) else func(*args)
            if func is is_cuda_get:
                return state.on_gpu(args[0])
            if func is T.get_device:
                return 0 if state.on_gpu(args[0]) else -1
            if func is T.cuda:
                return to_gpu(args[0], memory_format=kwargs.get("memory_format"))
            if func is T.cpu:
                return to_host(args[0])
            if func in (T.pin_memory, T.record_stream):
                return args[0] if func is T.pin_memory else None
            if func is T.is_pinned:
                return False
            if func is T.numpy and has_no_data(torch, args[0]):
                import numpy

                state.note("values read from fake tensors (.tolist/.numpy) taken as zeros")
                return numpy.zeros(tuple(args[0].shape), dtype=str(args[0].dtype).replace("torch.", ""))
            if func is T.__deepcopy__ and has_no_data(torch, args[0]):
                # the default copies the fake tensor's __dict__, whose constant (a real tensor) cannot
                # be cloned under FakeTensorMode; a clone of the same device, dtype and shape is one
                src, memo = args[0], (args[1] if len(args) > 1 else kwargs.get("memo")) or {}
                if id(src) in memo:
                    return memo[id(src)]
                with torch.no_grad():
                    out = src.clone()
                out.requires_grad_(src.requires_grad)
                memo[id(src)] = out
                return out
            if func is T.to:
                out = tensor_to(args[0], args[1:], kwargs)
                if out is not None:
                    return out
                return func(*args, **kwargs)
            dev = kwargs.get("device")
            if dev is not None and _is_cuda_device(torch, dev):
                kwargs["device"] = cpu
                state.force = True
                try:
                    return func(*args, **kwargs)
                finally:
                    state.force = None
            return func(*args, **kwargs)

    return _Device()


def cpu_autocast_dtypes(torch: Any) -> List[str]:
    """The dtype names CPU autocast accepts in this torch (older versions lack ``float16``).

    An unsupported dtype makes CPU autocast warn and disable itself; that warning is the test.
    """
    import warnings

    out = []
    for dtype in (torch.bfloat16, torch.float16):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            try:
                with torch.autocast("cpu", dtype=dtype):
                    pass
            except Exception:  # noqa: BLE001 - refused outright by this version
                continue
        if not any("not supported" in str(w.message) or "Disabling" in str(w.message) for w in seen):
            out.append(str(dtype).replace("torch.", ""))
    return out


def patch_autocast(torch: Any, state: ProbeState) -> None:
    """``autocast("cuda", dtype)`` becomes CPU autocast with the same dtype (fp16 by default, as CUDA).

    Where this torch's CPU autocast lacks the dtype, the probe ends with that reason
    (``state.fail``) instead of tracing the step in float32.
    """
    ac = torch.amp.autocast_mode.autocast
    orig_init = ac.__init__
    supported = cpu_autocast_dtypes(torch)

    def __init__(self: Any, device_type: str = "cuda", dtype: Any = None, enabled: bool = True,
                 cache_enabled: Any = None) -> None:
        if str(device_type) == "cuda":
            device_type = "cpu"
            dtype = dtype or torch.float16
            if enabled:
                name = str(dtype).replace("torch.", "")
                if name not in state.autocast_dtypes:
                    state.autocast_dtypes.append(name)
                if name not in supported and state.fail is not None:
                    state.fail(f"torch {torch.__version__}: CPU autocast has no {name}, so the probe cannot "
                               f"imitate CUDA autocast {name}")
        orig_init(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    ac.__init__ = __init__


class _Dummy:
    """A stream/event/graph stand-in: every method does nothing, timings are 0."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.device = "cuda:0"

    def __getattr__(self, name: str) -> Callable[..., Any]:
        return lambda *a, **k: 0.0 if name == "elapsed_time" else (True if name == "query" else None)

    def __enter__(self) -> "_Dummy":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def noop(*args: Any, **kwargs: Any) -> None:
    """Stand-in for ``torch.cuda`` calls that do nothing without a GPU."""


def _fresh(fn: Callable[..., Any]) -> Callable[..., Any]:
    def f(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)
    return f


def patch_cuda_api(torch: Any, state: ProbeState) -> None:
    """Make ``torch.cuda`` describe one idle H100 whose memory statistics are the replay's."""
    alloc = state.tracker.alloc
    cuda = torch.cuda
    props = types.SimpleNamespace(
        name=H100_NAME, total_memory=H100_TOTAL_B, major=9, minor=0, multi_processor_count=132,
        is_integrated=False, is_multi_gpu_board=False, L2_cache_size=50 << 20, warp_size=32,
        max_threads_per_multi_processor=2048, gcnArchName="", uuid="probe")
    table: Dict[str, Any] = {
        "is_available": lambda: True, "device_count": lambda: 1, "current_device": lambda: 0,
        "is_initialized": lambda: True, "init": noop, "_lazy_init": noop, "set_device": noop,
        "get_device_name": lambda *a: H100_NAME, "get_device_properties": lambda *a: props,
        "get_device_capability": lambda *a: (9, 0), "is_bf16_supported": lambda *a, **k: True,
        "get_arch_list": lambda: ["sm_90"], "synchronize": noop, "empty_cache": noop,
        "ipc_collect": noop, "manual_seed": noop, "manual_seed_all": noop, "seed": noop,
        "seed_all": noop, "set_per_process_memory_fraction": noop,
        "memory_allocated": lambda *a: alloc.allocated_b,
        "max_memory_allocated": lambda *a: alloc.peak_allocated_b,
        "memory_reserved": lambda *a: alloc.reserved_b,
        "max_memory_reserved": lambda *a: alloc.peak_reserved_b,
        "memory_cached": lambda *a: alloc.reserved_b,
        "reset_peak_memory_stats": noop, "reset_max_memory_allocated": noop,
        "reset_accumulated_memory_stats": noop,
        "mem_get_info": lambda *a: (H100_TOTAL_B - alloc.reserved_b, H100_TOTAL_B),
        "memory_summary": lambda *a, **k: "", "utilization": lambda *a: 0,
        "memory_stats": lambda *a: {"allocated_bytes.all.current": alloc.allocated_b,
                                    "allocated_bytes.all.peak": alloc.peak_allocated_b,
                                    "reserved_bytes.all.current": alloc.reserved_b,
                                    "reserved_bytes.all.peak": alloc.peak_reserved_b},
        "Stream": _Dummy, "Event": _Dummy, "CUDAGraph": _Dummy,
        "current_stream": lambda *a: _Dummy(), "default_stream": lambda *a: _Dummy(),
        "stream": lambda *a: contextlib.nullcontext(), "device": lambda *a: contextlib.nullcontext(),
        "device_of": lambda *a: contextlib.nullcontext(),
        "is_current_stream_capturing": lambda: False, "can_device_access_peer": lambda *a: False,
        "get_rng_state": lambda *a: torch.get_rng_state(), "set_rng_state": noop,
        "get_rng_state_all": lambda: [torch.get_rng_state()], "set_rng_state_all": noop,
    }
    for name, value in table.items():
        # one function object per name: torch._dynamo's rule map refuses one object under two names
        setattr(cuda, name, _fresh(value) if value is noop else value)
    real_generator = torch.Generator

    class Generator(real_generator):  # type: ignore[misc, valid-type]
        """``torch.Generator(device="cuda")`` is a CPU generator here: there is no CUDA device to seed."""

        def __new__(cls, device: Any = "cpu") -> Any:
            return real_generator("cpu" if _is_cuda_device(torch, device) else device)

    torch.Generator = Generator
    graphs = getattr(cuda, "graphs", None)
    if graphs is not None and hasattr(graphs, "is_current_stream_capturing"):  # imported by name in older torch
        graphs.is_current_stream_capturing = cuda.is_current_stream_capturing
    acc = getattr(torch, "accelerator", None)
    if acc is not None:  # torch >= 2.6: optimizers ask it whether a CUDA graph is being captured
        for name, value in (("current_stream", lambda *a: _Dummy()), ("current_device_index", lambda: 0),
                            ("current_device_idx", lambda: 0), ("device_count", lambda: 1),
                            ("is_available", lambda: True), ("synchronize", _fresh(noop)),
                            ("set_device_index", _fresh(noop)), ("set_device_idx", _fresh(noop)),
                            ("current_accelerator", lambda *a, **k: torch.device("cuda"))):
            if hasattr(acc, name):
                setattr(acc, name, value)
    mem = getattr(cuda, "memory", None)
    if mem is not None:
        for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
                     "reset_peak_memory_stats", "empty_cache", "mem_get_info", "memory_stats"):
            setattr(mem, name, getattr(cuda, name))


def patch_fake_tensor(torch: Any, state: ProbeState) -> None:
    """Adapt ``FakeTensor`` to a program that believes it runs on a GPU.

    * ``FakeTensor.device`` (a property of its own, not seen by function modes) reports ``cuda:0``
      for GPU-tagged tensors outside dispatch, so ``torch.zeros(..., device=x.device)`` in the
      program's code is a GPU tensor as on the GPU; inside dispatch (FakeTensorMode's own
      device propagation) it reports the real fake device;
    * ``FakeTensor.tolist`` returns zeros at once (a sampler's ``randperm(n).tolist()`` would
      otherwise read n values one by one), as ``datadep`` assumes for value reads.
    """
    from torch._subclasses.fake_tensor import FakeTensor

    cuda0 = torch.device("cuda", 0)
    real_device = FakeTensor.device

    def device(self: Any) -> Any:
        # torch's stub declares Tensor.device as an overloaded method; at runtime it is a property
        d = real_device.fget(self)  # type: ignore[attr-defined]
        if state.dispatch_depth == 0 and d.type == "cpu" and state.on_gpu(self):
            return cuda0
        return d

    FakeTensor.device = property(device)  # type: ignore[assignment]

    def tolist(self: Any) -> Any:
        state.note("values read from fake tensors (.tolist/.numpy) taken as zeros")
        return _zeros_list(tuple(self.shape), self.dtype.is_floating_point)

    FakeTensor.tolist = tolist  # type: ignore[assignment]
    patch_fake_swap(torch)


def patch_fake_swap(torch: Any) -> None:
    """Let ``Module.to``/``.cuda()`` swap fake parameters.

    ``Module._apply`` swaps a FakeTensor parameter with its moved copy (``torch.utils.swap_tensors``),
    which refuses tensors with weak references; FakeTensorMode's own memo holds one for every
    fake tensor. The memo only maps real tensors to their fakes, so the probe lets the swap
    ignore weak references to fake tensors.
    """
    import torch.utils as tu
    from torch._subclasses.fake_tensor import FakeTensor

    shim = types.ModuleType("weakref")
    shim.__dict__.update(weakref.__dict__)
    shim.getweakrefs = lambda o: [] if isinstance(o, FakeTensor) else weakref.getweakrefs(o)  # type: ignore[attr-defined]
    if getattr(tu, "weakref", None) is weakref:
        tu.weakref = shim  # type: ignore[attr-defined]
