"""The device mode of the probe's fake GPU (job's Python): ``device="cuda"``, moves, pre-1.0 CUDA spellings.

A ``TorchFunctionMode`` (entered by ``inject/main.py`` for the whole program, below the host fast mode
of ``fakecuda.py``): factories and ops naming a CUDA device run as GPU ops (``fakecuda.GpuOps``),
``.cuda()``/``.to("cuda")`` make fake GPU tensors, ``.cpu()``/``.numpy()`` of GPU tensors read zeros,
and ``device``/``is_cuda``/``get_device`` report ``cuda:0`` for GPU memory.

The pre-1.0 spellings, whose real versions reach the CUDA driver (``Found no NVIDIA driver``):

* the typed constructors ``torch.cuda.FloatTensor``, ``LongTensor``, ... (``TYPED``): called with sizes, a
  ``torch.Size``, data (a list, a numpy array) or a tensor, they make fake GPU tensors of their dtype, and
  ``isinstance(x, torch.cuda.FloatTensor)`` holds for a fake GPU tensor of that dtype;
* ``Tensor.type``: ``x.type(torch.cuda.FloatTensor)``, ``x.type('torch.cuda.LongTensor')`` move to the fake
  GPU with that dtype, ``x.type('torch.FloatTensor')`` of a GPU tensor to the host, and ``x.type()`` of a GPU
  tensor names its CUDA type;
* ``torch.set_default_tensor_type(torch.cuda.FloatTensor)`` (or its name) sets the default dtype, and
  factories without a ``device=`` make GPU tensors from then on.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

from slurm_coloc.probe.inject.fakecuda import ProbeState, is_cuda_device

TYPED = {"FloatTensor": "float32", "DoubleTensor": "float64", "HalfTensor": "float16",
         "BFloat16Tensor": "bfloat16", "ByteTensor": "uint8", "CharTensor": "int8", "ShortTensor": "int16",
         "IntTensor": "int32", "LongTensor": "int64", "BoolTensor": "bool"}
_HOST_NAME = {v: k for k, v in TYPED.items()}


def _typed_class(torch: Any, state: ProbeState, name: str, dtype: Any) -> type:
    """The stand-in of ``torch.cuda.<name>``: a class whose call makes a fake GPU tensor of ``dtype``."""

    def make(*args: Any, **kwargs: Any) -> Any:
        kwargs.pop("device", None)
        if not args:
            return torch.empty((0,), dtype=dtype, device="cuda")
        if len(args) == 1 and isinstance(args[0], torch.Size):
            return torch.empty(tuple(args[0]), dtype=dtype, device="cuda")
        if all(isinstance(a, int) and not isinstance(a, bool) for a in args):
            return torch.empty(args, dtype=dtype, device="cuda")
        if len(args) == 1 and isinstance(args[0], torch.Tensor):
            return args[0].to(device="cuda", dtype=dtype)
        if len(args) == 1:  # a list or a numpy array: its values, on the host first (real), then moved
            return torch.as_tensor(args[0], dtype=dtype).to("cuda")
        raise TypeError(f"torch.cuda.{name}(): arguments not understood by the probe: {args!r}")

    class _Meta(type):
        def __call__(cls, *args: Any, **kwargs: Any) -> Any:
            return make(*args, **kwargs)

        def __instancecheck__(cls, obj: Any) -> bool:
            return isinstance(obj, torch.Tensor) and obj.dtype == dtype and state.on_gpu(obj)

        def __repr__(cls) -> str:
            return f"<class 'torch.cuda.{name}'>"

    return _Meta(name, (), {"__module__": "torch.cuda", "dtype": dtype, "is_cuda": True,
                            "__qualname__": name})


def patch_typed_tensors(torch: Any, state: ProbeState) -> Dict[str, type]:
    """Replace ``torch.cuda.<Type>Tensor`` and ``torch.set_default_tensor_type`` (module docstring)."""
    made: Dict[str, type] = {}
    for name, dt in TYPED.items():
        dtype = getattr(torch, dt, None)
        if dtype is None:
            continue
        made[name] = _typed_class(torch, state, name, dtype)
        setattr(torch.cuda, name, made[name])
    real_default = getattr(torch, "set_default_tensor_type", None)
    entered: List[Any] = []
    if real_default is not None:
        def set_default_tensor_type(t: Any) -> None:
            dtype = _cuda_dtype(torch, made, t)
            if dtype is None:
                real_default(t)
                return
            torch.set_default_dtype(dtype)
            if not entered:
                entered.append(_default_cuda_mode(torch))
                entered[0].__enter__()  # above the probe's modes, for the rest of the program
            state.note("torch.set_default_tensor_type(torch.cuda.*): default device cuda")

        torch.set_default_tensor_type = set_default_tensor_type
    return made


def _default_cuda_mode(torch: Any) -> Any:
    """A function mode giving factories without a ``device=`` the device ``cuda`` (as ``DeviceContext``, which
    ``torch.set_default_device`` puts below every other mode, where the probe's device mode never sees it)."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._device import _device_constructors

    ctors = _device_constructors()

    class _DefaultCuda(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = kwargs or {}
            if func in ctors and kwargs.get("device") is None:
                kwargs["device"] = "cuda"
            return func(*args, **kwargs)

    return _DefaultCuda()


def _cuda_dtype(torch: Any, made: Dict[str, type], t: Any) -> Optional[Any]:
    """The dtype of a CUDA tensor type (a stand-in class or a ``torch.cuda.XTensor`` name), else None."""
    if isinstance(t, type) and t in made.values():
        return t.dtype  # type: ignore[attr-defined]
    if isinstance(t, str) and t.startswith("torch.cuda.") and t[len("torch.cuda."):] in TYPED:
        return getattr(torch, TYPED[t[len("torch.cuda."):]])
    return None


def type_handler(torch: Any, state: ProbeState, made: Dict[str, type],
                 to_gpu: Callable[[Any, Any], Any], to_host: Callable[[Any, Any], Any]
                 ) -> Callable[[Any, Any, Dict[str, Any]], Any]:
    """The device mode's ``Tensor.type`` handler (module docstring); ``made``: the typed classes."""

    def handler(func: Any, args: Any, kwargs: Dict[str, Any]) -> Any:
        t = args[0]
        target = args[1] if len(args) > 1 else kwargs.get("dtype")
        if target is None:
            if state.on_gpu(t):
                return "torch.cuda." + _HOST_NAME.get(str(t.dtype).replace("torch.", ""), "FloatTensor")
            return func(*args, **kwargs)
        dtype = _cuda_dtype(torch, made, target)
        if dtype is not None:
            return to_gpu(t, dtype)
        if state.on_gpu(t):
            if isinstance(target, torch.dtype):
                return to_gpu(t, target)
            name = target if isinstance(target, str) else getattr(target, "__name__", "")
            host = getattr(torch, name.replace("torch.", ""), None) if name else None
            if isinstance(host, type) and name.replace("torch.", "") in TYPED:
                return to_host(t, getattr(torch, TYPED[name.replace("torch.", "")]))
        return func(*args, **kwargs)

    return handler


def make_device_mode(torch: Any, state: ProbeState) -> Any:
    """A ``TorchFunctionMode`` (not entered) mapping the device ``cuda`` to GPU-tagged fake CPU tensors.

    Calls naming a CUDA ``device=`` run as GPU ops (:class:`GpuOps`); tensor methods that move, report or read
    devices are answered by :func:`_device_handlers`.
    """
    from torch.overrides import TorchFunctionMode

    cpu = torch.device("cpu")
    parse_to = torch._C._nn._parse_to  # Module.to(device=...) parses its arguments: not a factory
    handlers = _device_handlers(torch, state)
    cuda0 = torch.device("cuda", 0)
    T = torch.Tensor
    dev_get, is_cuda_get = T.device.__get__, T.is_cuda.__get__

    class _Device(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = dict(kwargs or {})
            if func is dev_get:
                return cuda0 if state.on_gpu(args[0]) else func(*args)
            if func is is_cuda_get:
                return state.on_gpu(args[0])
            handler = handlers.get(func)
            if handler is not None:
                return handler(func, args, kwargs)
            dev = kwargs.get("device")
            if dev is not None and func is not parse_to and is_cuda_device(torch, dev):
                kwargs["device"] = cpu
                return state.gpu.run(func, args, kwargs)
            return func(*args, **kwargs)

    return _Device()


class _Moves:
    """Moves between the host and the fake GPU (``.cuda()``, ``.cpu()``, ``.to(...)``)."""

    def __init__(self, torch: Any, state: ProbeState) -> None:
        self.torch = torch
        self.state = state
        self.cuda0 = torch.device("cuda", 0)
        self.cpu = torch.device("cpu")

    def to_gpu(self, t: Any, dtype: Any = None, memory_format: Any = None) -> Any:
        """``t`` as a fake GPU tensor (itself if one of ``dtype``); None dtype/memory format keep ``t``'s."""
        if self.state.on_gpu(t) and (dtype is None or dtype == t.dtype):
            return t
        made = self._host_to_gpu(t, dtype, memory_format)
        if made is not None:
            return made
        kw: Dict[str, Any] = {"dtype": dtype or t.dtype}
        if memory_format is not None:
            kw["memory_format"] = memory_format
        return self.state.gpu.run(self.torch.ops.aten._to_copy.default, (t,), kw)

    def _host_to_gpu(self, t: Any, dtype: Any, memory_format: Any) -> Any:
        """A real host tensor's GPU copy made as a new fake tensor of its shape, dtype and layout, or None
        where the copy must be the copy op itself (a fake tensor, one autograd follows, a non-strided or
        unusual layout).

        A factory: no real-to-fake conversion of the host tensor, which cost about 10 ms a batch.
        """
        torch = self.torch
        from torch._subclasses.fake_tensor import FakeTensor

        if isinstance(t, FakeTensor) or t.layout != torch.strided or (t.requires_grad
                                                                      and torch.is_grad_enabled()):
            return None
        kw: Dict[str, Any] = {"dtype": dtype or t.dtype, "device": self.cpu}
        if memory_format is None or memory_format == torch.preserve_format:
            if t.is_contiguous():
                memory_format = torch.contiguous_format
            elif t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
                memory_format = torch.channels_last
            else:
                return None
        kw["memory_format"] = memory_format
        return self.state.gpu.run(torch.empty, (tuple(t.shape),), kw)

    def to_host(self, t: Any, dtype: Any = None) -> Any:
        """``t`` on the host: a GPU tensor reads as real CPU zeros of its shape (the probe has no values)."""
        from slurm_coloc.estimate.gpulike import has_no_data

        if not self.state.on_gpu(t) and not has_no_data(self.torch, t):
            return t if dtype is None or dtype == t.dtype else t.to(dtype)
        self.state.note("GPU tensors copied to the host (.cpu()/.to('cpu')) read as zeros")
        return self.torch.zeros(tuple(t.shape), dtype=dtype or t.dtype)

    def tensor_to(self, t: Any, args: Any, kwargs: Dict[str, Any]) -> Any:
        """``t.to(*args, **kwargs)``; None for a dtype-only call or a device neither CUDA nor CPU."""
        torch = self.torch
        device = kwargs.get("device")
        dtype = kwargs.get("dtype")
        for a in args:
            if isinstance(a, torch.dtype):
                dtype = a
            elif isinstance(a, torch.Tensor):
                device, dtype = (self.cuda0 if self.state.on_gpu(a) else a.device), a.dtype
            elif isinstance(a, (str, torch.device, int)) and not isinstance(a, bool):
                device = self.cuda0 if isinstance(a, int) else a
        if device is None:
            return None
        if is_cuda_device(torch, device):
            return self.to_gpu(t, dtype, kwargs.get("memory_format"))
        if torch.device(device).type == "cpu":
            return self.to_host(t, dtype)
        return None


def _device_handlers(torch: Any, state: ProbeState) -> Dict[Any, Callable[[Any, Any, Dict[str, Any]], Any]]:
    """``{tensor function: handler(func, args, kwargs)}`` for the device mode: devices reported, moves,
    pinning, value reads of fake tensors (zeros) and deep copies of fake tensors."""
    from slurm_coloc.estimate.gpulike import has_no_data

    T = torch.Tensor
    on_gpu = state.on_gpu
    mv = _Moves(torch, state)

    def numpy(func: Any, args: Any, kwargs: Dict[str, Any]) -> Any:
        if not has_no_data(torch, args[0]):
            return func(*args, **kwargs)
        import numpy

        state.note("values read from fake tensors (.tolist/.numpy) taken as zeros")
        return numpy.zeros(tuple(args[0].shape), dtype=str(args[0].dtype).replace("torch.", ""))

    def deepcopy(func: Any, args: Any, kwargs: Dict[str, Any]) -> Any:
        if not has_no_data(torch, args[0]):
            return func(*args, **kwargs)
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

    def to(func: Any, args: Any, kwargs: Dict[str, Any]) -> Any:
        out = mv.tensor_to(args[0], args[1:], kwargs)
        return out if out is not None else func(*args, **kwargs)

    return {
        T.get_device: lambda f, a, k: 0 if on_gpu(a[0]) else -1,
        T.cuda: lambda f, a, k: mv.to_gpu(a[0], memory_format=k.get("memory_format")),
        T.cpu: lambda f, a, k: mv.to_host(a[0]),
        T.pin_memory: lambda f, a, k: a[0],
        T.record_stream: lambda f, a, k: None,
        T.is_pinned: lambda f, a, k: False,
        # CUDA tensors: a no-op (torch docs: Tensor.share_memory_)
        T.share_memory_: lambda f, a, k: a[0] if on_gpu(a[0]) else f(*a, **k),
        T.numpy: numpy,
        T.__deepcopy__: deepcopy,
        T.to: to,
        T.type: type_handler(torch, state, state.typed, lambda t, d: mv.to_gpu(t, d),
                             lambda t, d: mv.to_host(t, d)),
    }
