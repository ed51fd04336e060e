"""The ``torch.cuda`` API of the probe's fake GPU: one idle H100, CUDA autocast, real signatures.

Runs inside the job's Python (``inject/main.py``). :func:`patch_cuda_api` replaces every name of
:func:`cuda_api_table` that the job's torch has by a stand-in behind the real function's signature
(:func:`signed_like`: ``device=`` keywords and defaults as documented, a refused keyword refused the same
way); memory statistics are the allocator replay's. :func:`patch_autocast` turns ``autocast("cuda")``
into CPU autocast with the same dtype.
"""
from __future__ import annotations

import contextlib
import types
from typing import Any, Callable, Dict, List, Optional

from slurm_coloc.probe.inject.fakecuda import ProbeState, is_cuda_device

H100_NAME = "NVIDIA H100 80GB HBM3"
H100_TOTAL_B = 81559 * (1 << 20)


def cpu_autocast_dtypes(torch: Any) -> List[str]:
    """The subset of ``["bfloat16", "float16"]`` CPU autocast accepts in this torch (older ones lack
    ``float16``).

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
            except Exception:  # refused outright by this version
                continue
        if not any("not supported" in str(w.message) or "Disabling" in str(w.message) for w in seen):
            out.append(str(dtype).replace("torch.", ""))
    return out


def patch_autocast(torch: Any, state: ProbeState) -> None:
    """``autocast("cuda", dtype)`` becomes CPU autocast with the same dtype (fp16 by default, as CUDA).

    Where this torch's CPU autocast lacks the dtype, the probe ends with that reason (``state.fail``) rather
    than trace the step in float32; ``state.autocast_dtypes`` gets each dtype entered.
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
    """``impl`` behind ``real``'s signature: a call ``real`` refuses raises the same ``TypeError``.

    The stand-in binds its arguments to ``inspect.signature(real)`` first (none inspectable: no check);
    ``functools.wraps`` gives it ``real``'s name, docstring and signature. Each call makes a new function
    object (``torch._dynamo`` refuses one object under two names).
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


def _h100_properties() -> types.SimpleNamespace:
    """What ``torch.cuda.get_device_properties`` gives on an H100 80GB (sm_90, 132 SMs; memory in bytes)."""
    return types.SimpleNamespace(
        name=H100_NAME, total_memory=H100_TOTAL_B, major=9, minor=0, multi_processor_count=132,
        is_integrated=False, is_multi_gpu_board=False, L2_cache_size=50 << 20, warp_size=32,
        max_threads_per_multi_processor=2048, gcnArchName="", uuid="probe", pci_bus_id=0, pci_device_id=0,
        pci_domain_id=0, regs_per_multiprocessor=65536, shared_memory_per_block=49152,
        shared_memory_per_multiprocessor=233472, shared_memory_per_block_optin=232448)


def cuda_api_table(torch: Any, state: ProbeState) -> Dict[str, Any]:
    """``torch.cuda`` name -> stand-in for the fake device: an idle H100 (sm_90, ``H100_TOTAL_B``), memory in
    bytes from ``state.tracker.alloc``.

    Stand-ins take any arguments (:func:`patch_cuda_api` puts each behind the real signature); classes
    (``Stream``, ``Event``, ``CUDAGraph``) are :class:`_Dummy`.
    """
    alloc = state.tracker.alloc
    props = _h100_properties()

    def stats(*a: Any, **k: Any) -> Dict[str, Any]:
        return {"allocated_bytes.all.current": alloc.allocated_b,
                "allocated_bytes.all.peak": alloc.peak_allocated_b,
                "reserved_bytes.all.current": alloc.reserved_b,
                "reserved_bytes.all.peak": alloc.peak_reserved_b,
                "active_bytes.all.current": alloc.allocated_b,
                "active_bytes.all.peak": alloc.peak_allocated_b,
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

    def __exit__(self, *exc: Any) -> None:
        return None


def patch_cuda_api(torch: Any, state: ProbeState) -> None:
    """Make ``torch.cuda`` describe one idle H100 whose memory statistics are the replay's.

    Every name of :func:`cuda_api_table` this torch has gets a stand-in with the real signature
    (:func:`signed_like`); names it lacks are added as they are. Also ``torch.Generator`` (a CUDA device gives
    a CPU generator), ``torch.accelerator`` (torch >= 2.6) and ``torch.cuda.memory``.
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
            return real_generator("cpu" if is_cuda_device(torch, device) else device)

    torch.Generator = Generator
    graphs = getattr(cuda, "graphs", None)
    # imported by name in older torch
    if graphs is not None and hasattr(graphs, "is_current_stream_capturing"):
        graphs.is_current_stream_capturing = cuda.is_current_stream_capturing
    acc = getattr(torch, "accelerator", None)
    if acc is not None:  # torch >= 2.6: optimizers ask it whether a CUDA graph is being captured
        for name, value in (("current_stream", lambda *a, **k: _Dummy()),
                            ("current_device_index", lambda *a: 0),
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
