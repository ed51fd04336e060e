"""The pre-1.0 CUDA spellings of real code on the probe's fake GPU (job's Python).

* the typed constructors ``torch.cuda.FloatTensor``, ``LongTensor``, ... (``TYPED``): called with sizes, a
  ``torch.Size``, data (a list, a numpy array) or a tensor, they make fake GPU tensors of their dtype, and
  ``isinstance(x, torch.cuda.FloatTensor)`` holds for a fake GPU tensor of that dtype;
* ``Tensor.type``: ``x.type(torch.cuda.FloatTensor)``, ``x.type('torch.cuda.LongTensor')`` move to the fake
  GPU with that dtype, ``x.type('torch.FloatTensor')`` of a GPU tensor to the host, and ``x.type()`` of a GPU
  tensor names its CUDA type;
* ``torch.set_default_tensor_type(torch.cuda.FloatTensor)`` (or its name) sets the default dtype, and
  factories without a ``device=`` make GPU tensors from then on.

The real ones reach the CUDA driver (``Found no NVIDIA driver``).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

from slurm_coloc.probe.inject.fakecuda import ProbeState

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
