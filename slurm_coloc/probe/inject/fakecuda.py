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
        gpu: the :class:`GpuOps` that runs GPU ops on fake tensors (set by ``main.py``).
        cuda_op: whether the op being dispatched makes GPU tensors.
        autocast_dtypes: dtype names of the CUDA autocast regions entered.
        notes: things the probe changed or assumed, one short line each.
        fail: ends the probe with a reason (set by ``main.py``), for what this torch cannot imitate.
    """

    def __init__(self, tracker: Any) -> None:
        self.tracker = tracker
        self.gpu: Any = None
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
    """The highest of the GPU dispatch modes (:class:`GpuOps`): the op being dispatched makes GPU memory.

    While it runs an op, ``state.cuda_op`` is True, so the tracker below replays the op's new
    storages as GPU memory, and ``state.dispatch_depth`` counts the nesting (``FakeTensor.device``
    reports the real fake device inside).
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    class _GpuTag(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            prev = state.cuda_op
            state.cuda_op = True
            state.dispatch_depth += 1
            try:
                return func(*args, **(kwargs or {}))
            finally:
                state.cuda_op = prev
                state.dispatch_depth -= 1

    orig_track = state.tracker.track

    def track(t: Any) -> None:
        if state.cuda_op:
            orig_track(t)

    state.tracker.track = track  # instance attribute: the tracker calls self.track
    return _GpuTag()


class GpuOps:
    """Runs GPU ops under the GPU dispatch modes; every other op runs on the CPU with no Python mode.

    Only GPU work is simulated. The dispatch modes (``modes``, lowest first: the fake-tensor mode of
    :func:`make_fake_gpu_mode`, the FLOP counter, the allocator tracker, :func:`make_gpu_tag_mode`)
    are not entered for the whole program: they are pushed around one op at a time, when

    * an op has a ``FakeTensor`` argument (every fake tensor of the probe is GPU memory): ``FakeTensor``'s
      own ``__torch_dispatch__`` (the subclass handler, which the dispatcher calls for such ops only) is
      wrapped by :meth:`install`;
    * the device mode runs a factory with a CUDA device or a move to the GPU (:meth:`run`).

    Data loading, transforms, numpy interop and CPU RNG (ops on real CPU tensors) never enter Python
    dispatch, so they cost what they cost in the job.
    """

    def __init__(self, torch: Any, modes: List[Any]) -> None:
        self.torch = torch
        self.modes = modes
        self.depth = 0

    def run(self, func: Any, args: Any = (), kwargs: Any = None) -> Any:
        """``func(*args, **kwargs)`` with the GPU modes pushed: its outputs are fake GPU tensors."""
        if self.depth:
            return func(*args, **(kwargs or {}))
        self.depth += 1
        entered = []
        try:
            for m in self.modes:
                m.__enter__()
                entered.append(m)
            return func(*args, **(kwargs or {}))
        finally:
            for m in reversed(entered):
                m.__exit__(None, None, None)
            self.depth -= 1

    def install(self) -> None:
        """Route ops with fake arguments through :meth:`run` (``FakeTensor.__torch_dispatch__`` wrapped)."""
        from torch._subclasses.fake_tensor import FakeTensor

        orig = FakeTensor.__dict__["__torch_dispatch__"].__func__
        prim_device = self.torch.ops.prim.device.default
        gpu = self

        def __torch_dispatch__(cls: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if gpu.depth or func is prim_device:
                return orig(cls, func, types, args, kwargs if kwargs is not None else {})
            return gpu.run(func, args, kwargs)

        FakeTensor.__torch_dispatch__ = classmethod(__torch_dispatch__)  # type: ignore[method-assign, assignment]


def make_fake_gpu_mode(torch: Any, fake_mode: Any) -> Any:
    """The lowest dispatch mode: runs each op it gets (only GPU ops reach it) in ``fake_mode``.

    ``fake_mode`` is a ``FakeTensorMode(allow_non_fake_inputs=True)`` that is never entered: real
    CPU inputs of a GPU op (a batch moved to the GPU, a CPU scalar tensor) become fake tensors of
    the same shape, dtype and values' absence, so only GPU memory and kernels are simulated.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    class _FakeGpu(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            return fake_mode.__torch_dispatch__(func, types, args, kwargs or {})

    return _FakeGpu()


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
    parse_to = torch._C._nn._parse_to  # Module.to(device=...) parses its arguments: not a factory

    def to_gpu(t: Any, dtype: Any = None, memory_format: Any = None) -> Any:
        if state.on_gpu(t) and (dtype is None or dtype == t.dtype):
            return t
        kw: Dict[str, Any] = {"dtype": dtype or t.dtype}
        if memory_format is not None:
            kw["memory_format"] = memory_format
        return state.gpu.run(torch.ops.aten._to_copy.default, (t,), kw)

    def to_host(t: Any, dtype: Any = None) -> Any:
        if not state.on_gpu(t) and not has_no_data(torch, t):
            return t if dtype is None or dtype == t.dtype else t.to(dtype)
        # a GPU tensor read back to the host: real CPU zeros of its shape (the probe has no values)
        state.note("GPU tensors copied to the host (.cpu()/.to('cpu')) read as zeros")
        return torch.zeros(tuple(t.shape), dtype=dtype or t.dtype)

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
            if func is T.share_memory_ and state.on_gpu(args[0]):
                return args[0]  # CUDA tensors: a no-op (torch docs: Tensor.share_memory_)
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
            if dev is not None and func is not parse_to and _is_cuda_device(torch, dev):
                kwargs["device"] = cpu
                return state.gpu.run(func, args, kwargs)
            return func(*args, **kwargs)

    return _Device()


def make_host_fast_mode(torch: Any) -> Any:
    """The highest of the probe's function modes: host calls skip the modes below it.

    A call is a host call when no argument is a ``FakeTensor`` (GPU memory in the probe), no
    ``device=`` keyword names CUDA, and the function is none of those the device mode changes for
    host tensors too (moves, ``.type``, pinning, ``.numpy``, copies). It runs with torch-function
    handling off, so data loading and CPU preprocessing cost what they cost in the job, not a pass
    through four Python modes per op; the dispatch modes still see it (``make_gpu_tag_mode`` runs
    it on the CPU kernel at once).
    """
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.overrides import TorchFunctionMode

    T = torch.Tensor
    special = {T.to, T.cuda, T.cpu, T.type, T.pin_memory, T.record_stream, T.is_pinned, T.numpy,
               T.__deepcopy__, T.share_memory_, T.new_empty, T.new_zeros, T.new_ones, T.new_full,
               T.new_tensor, torch.nn.functional.scaled_dot_product_attention}
    for name in ("_to_copy", "to_dense"):
        f = getattr(T, name, None)
        if f is not None:
            special.add(f)

    def any_fake(xs: Any) -> bool:
        for x in xs:
            if isinstance(x, FakeTensor):
                return True
            if isinstance(x, (list, tuple)) and x and any_fake(x):
                return True
        return False

    class _HostFast(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = kwargs or {}
            if func in special or "device" in kwargs or any_fake(args) or any_fake(kwargs.values()):
                return func(*args, **kwargs)
            with torch._C.DisableTorchFunction():
                return func(*args, **kwargs)

    return _HostFast()


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


def signed_like(real: Any, impl: Callable[..., Any]) -> Callable[..., Any]:
    """``impl`` behind ``real``'s signature: arguments are checked as ``real`` checks them.

    The stand-in binds its arguments to ``inspect.signature(real)`` first, so a call the real
    function accepts (``device=`` keywords, defaults) is accepted and one it refuses raises the same
    ``TypeError``; ``functools.wraps`` gives it ``real``'s name, docstring and signature. Each call
    makes a new function object (``torch._dynamo`` refuses one object under two names).
    """
    import functools
    import inspect

    try:
        sig: Optional[inspect.Signature] = inspect.signature(real)
    except (TypeError, ValueError):
        sig = None

    def f(*args: Any, **kwargs: Any) -> Any:
        if sig is not None:
            sig.bind(*args, **kwargs)
        return impl(*args, **kwargs)

    if callable(real):
        with contextlib.suppress(Exception):
            functools.update_wrapper(f, real)
    return f


def cuda_api_table(torch: Any, state: ProbeState) -> Dict[str, Any]:
    """The ``torch.cuda`` names the fake device stands in for, with their stand-in implementations.

    Implementations take any arguments; :func:`patch_cuda_api` puts each behind the real function's
    signature (:func:`signed_like`). Classes (``Stream``, ``Event``, ``CUDAGraph``) are :class:`_Dummy`.
    """
    alloc = state.tracker.alloc
    props = types.SimpleNamespace(
        name=H100_NAME, total_memory=H100_TOTAL_B, major=9, minor=0, multi_processor_count=132,
        is_integrated=False, is_multi_gpu_board=False, L2_cache_size=50 << 20, warp_size=32,
        max_threads_per_multi_processor=2048, gcnArchName="", uuid="probe", pci_bus_id=0, pci_device_id=0,
        pci_domain_id=0, regs_per_multiprocessor=65536, shared_memory_per_block=49152,
        shared_memory_per_multiprocessor=233472, shared_memory_per_block_optin=232448)

    def stats(*a: Any, **k: Any) -> Dict[str, Any]:
        return {"allocated_bytes.all.current": alloc.allocated_b, "allocated_bytes.all.peak": alloc.peak_allocated_b,
                "reserved_bytes.all.current": alloc.reserved_b, "reserved_bytes.all.peak": alloc.peak_reserved_b,
                "active_bytes.all.current": alloc.allocated_b, "active_bytes.all.peak": alloc.peak_allocated_b,
                "num_alloc_retries": 0, "num_ooms": 0}

    return {
        "is_available": lambda *a, **k: True, "device_count": lambda *a, **k: 1,
        "current_device": lambda *a, **k: 0, "is_initialized": lambda *a, **k: True, "init": noop,
        "_lazy_init": noop, "set_device": noop,
        "get_device_name": lambda *a, **k: H100_NAME, "get_device_properties": lambda *a, **k: props,
        "get_device_capability": lambda *a, **k: (9, 0), "is_bf16_supported": lambda *a, **k: True,
        "is_tf32_supported": lambda *a, **k: True,
        "get_arch_list": lambda *a, **k: ["sm_90"], "synchronize": noop, "empty_cache": noop,
        "ipc_collect": noop, "manual_seed": noop, "manual_seed_all": noop, "seed": noop,
        "seed_all": noop, "initial_seed": lambda *a, **k: 0, "set_per_process_memory_fraction": noop,
        "get_per_process_memory_fraction": lambda *a, **k: 1.0,
        "memory_allocated": lambda *a, **k: alloc.allocated_b,
        "max_memory_allocated": lambda *a, **k: alloc.peak_allocated_b,
        "memory_reserved": lambda *a, **k: alloc.reserved_b,
        "max_memory_reserved": lambda *a, **k: alloc.peak_reserved_b,
        "memory_cached": lambda *a, **k: alloc.reserved_b,
        "max_memory_cached": lambda *a, **k: alloc.peak_reserved_b,
        "reset_peak_memory_stats": noop, "reset_max_memory_allocated": noop, "reset_max_memory_cached": noop,
        "reset_accumulated_memory_stats": noop,
        "mem_get_info": lambda *a, **k: (H100_TOTAL_B - alloc.reserved_b, H100_TOTAL_B),
        "memory_summary": lambda *a, **k: "", "memory_snapshot": lambda *a, **k: [],
        "memory_stats": stats, "memory_stats_as_nested_dict": lambda *a, **k: {},
        "utilization": lambda *a, **k: 0, "memory_usage": lambda *a, **k: 0, "temperature": lambda *a, **k: 0,
        "power_draw": lambda *a, **k: 0, "clock_rate": lambda *a, **k: 0,
        "Stream": _Dummy, "Event": _Dummy, "CUDAGraph": _Dummy, "ExternalStream": _Dummy,
        "current_stream": lambda *a, **k: _Dummy(), "default_stream": lambda *a, **k: _Dummy(),
        "set_stream": noop, "stream": lambda *a, **k: contextlib.nullcontext(),
        "device": _DeviceContext, "device_of": _DeviceContext,
        "is_current_stream_capturing": lambda *a, **k: False, "can_device_access_peer": lambda *a, **k: False,
        "get_rng_state": lambda *a, **k: torch.get_rng_state(), "set_rng_state": noop,
        "get_rng_state_all": lambda *a, **k: [torch.get_rng_state()], "set_rng_state_all": noop,
        "get_gencode_flags": lambda *a, **k: "-gencode compute=compute_90,code=sm_90",
        "get_sync_debug_mode": lambda *a, **k: 0, "set_sync_debug_mode": noop,
    }


class _DeviceContext:
    """``torch.cuda.device(d)`` / ``device_of(t)``: a context manager that changes nothing (one GPU)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.idx = 0

    def __enter__(self) -> "_DeviceContext":
        return self

    def __exit__(self, *exc: Any) -> bool:
        return False


def patch_cuda_api(torch: Any, state: ProbeState) -> None:
    """Make ``torch.cuda`` describe one idle H100 whose memory statistics are the replay's.

    Every name of :func:`cuda_api_table` that this torch has is replaced by a stand-in with the real
    function's signature (:func:`signed_like`); names this torch lacks are added as they are.
    """
    cuda = torch.cuda
    for name, value in cuda_api_table(torch, state).items():
        real = getattr(cuda, name, None)
        if isinstance(value, type):
            setattr(cuda, name, value)
        elif real is not None and callable(real) and not isinstance(real, type):
            setattr(cuda, name, signed_like(real, value))
        else:
            setattr(cuda, name, _fresh(value))
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
        for name, value in (("current_stream", lambda *a, **k: _Dummy()), ("current_device_index", lambda *a: 0),
                            ("current_device_idx", lambda *a: 0), ("device_count", lambda *a: 1),
                            ("is_available", lambda *a, **k: True), ("synchronize", noop),
                            ("set_device_index", noop), ("set_device_idx", noop), ("set_stream", noop),
                            ("current_accelerator", lambda *a, **k: torch.device("cuda"))):
            real = getattr(acc, name, None)
            if real is not None:
                setattr(acc, name, signed_like(real, value))
    mem = getattr(cuda, "memory", None)
    if mem is not None:
        for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
                     "reset_peak_memory_stats", "empty_cache", "mem_get_info", "memory_stats",
                     "memory_summary", "memory_snapshot", "set_per_process_memory_fraction",
                     "reset_max_memory_allocated", "reset_accumulated_memory_stats", "memory_cached",
                     "max_memory_cached", "memory_stats_as_nested_dict", "get_per_process_memory_fraction"):
            if hasattr(mem, name):
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
    real_is_cuda = FakeTensor.is_cuda

    def is_cuda(self: Any) -> bool:
        if state.dispatch_depth == 0 and state.on_gpu(self):
            return True
        return bool(real_is_cuda.__get__(self))

    FakeTensor.is_cuda = property(is_cuda)  # type: ignore[assignment]

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
