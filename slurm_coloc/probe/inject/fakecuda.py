"""One CUDA device that exists without a GPU: only GPU memory and kernels are simulated.

Host tensors are real (data loading, numpy, CPU random numbers run as in the job). GPU tensors are fake CPU
tensors (``FakeTensor``: the autograd engine refuses fake ``cuda`` ones without a driver) replayed through the
estimator's allocator model (``estimate/tracker.py``); a tensor is "on the GPU" when a GPU op made its
storage (:class:`GpuOps`), and GPU ops run under dispatch modes pushed for that op only. Values read back
are zeros (``gpulike.py`` for ``all()``/``any()``); ``torch.cuda`` and CUDA autocast are ``cudaapi.py``'s.
"""
from __future__ import annotations

import types
import weakref
from typing import Any, Callable, Dict, List, Optional


class ProbeState:
    """What the probe saw and the switches its modes share (``cuda_op``: the op being dispatched makes GPU
    tensors; ``nccl_group``: the program asked for an NCCL group; ``fail``: ends the probe with a reason)."""

    def __init__(self, tracker: Any) -> None:
        self.tracker = tracker
        self.gpu: Any = None
        self.cuda_op = False
        self.dispatch_depth = 0
        self.autocast_dtypes: List[str] = []
        self.nccl_group = False
        self.notes: List[str] = []
        self.fail: Optional[Callable[[str], None]] = None
        self.typed: Dict[str, type] = {}  # torch.cuda.FloatTensor ... stand-ins (devicemode.py)

    def note(self, text: str) -> None:
        """Add one short line to the result's ``notes``, once."""
        if text not in self.notes:
            self.notes.append(text)

    def on_gpu(self, t: Any) -> bool:
        """Whether ``t``'s storage replays as GPU memory (none, as sparse or nested: host memory)."""
        try:
            return t.untyped_storage()._cdata in self.tracker.handles
        except Exception:  # tensors without storage (sparse, nested) are host
            return False


def is_cuda_device(torch: Any, d: Any) -> bool:
    """Whether ``d`` (``torch.device``, ``"cuda:1"``, an ``int`` device index) names a CUDA device."""
    if isinstance(d, int) and not isinstance(d, bool):
        return d >= 0
    if isinstance(d, torch.device):
        return d.type == "cuda"
    if isinstance(d, str):
        return d.split(":")[0].strip() == "cuda"
    return False


def tag_gpu_ops(state: ProbeState) -> None:
    """Let the tracker replay only the storages made while :class:`GpuOps` runs an op (``state.cuda_op``)."""
    orig_track = state.tracker.track

    def track(t: Any) -> None:
        if state.cuda_op:
            orig_track(t)

    state.tracker.track = track  # instance attribute: the tracker calls self.track


class GpuOps:
    """Runs GPU ops under the GPU dispatch modes; every other op runs on the CPU with no Python mode.

    The dispatch modes (``modes``, lowest first: :func:`make_fake_gpu_mode`'s, the FLOP counter, the tracker)
    are pushed around one op, with ``state.cuda_op`` set, when it has a ``FakeTensor`` argument
    (:meth:`install` wraps ``FakeTensor.__torch_dispatch__``) or the device mode runs a CUDA factory or move
    (:meth:`run`). ``optional`` (the FLOP counter) is pushed only while ``use_optional``.
    """

    def __init__(self, torch: Any, modes: List[Any], scalar_answer: Optional[Callable[[Any], Any]] = None,
                 state: Optional[ProbeState] = None, optional: Any = None) -> None:
        self.torch = torch
        self.all_modes = modes
        self.optional = optional
        self.use_optional = False
        self.modes = [m for m in modes if m is not optional]
        self.state = state
        self.depth = 0
        # a value read of a fake tensor that no mode answered (the tracker does)
        self.scalar_answer = scalar_answer

    def set_optional(self, on: bool) -> None:
        """Push the optional mode with the others (True) or leave it out (False)."""
        self.use_optional = on
        self.modes = [m for m in self.all_modes if on or m is not self.optional]

    def run(self, func: Any, args: Any = (), kwargs: Any = None) -> Any:
        """``func(*args, **kwargs)`` with the GPU modes pushed (outputs fake GPU tensors); nested calls run it
        as is. Exceptions pass through, the modes exited first."""
        if self.depth:
            return func(*args, **(kwargs or {}))
        st = self.state
        self.depth += 1
        entered = []
        if st is not None:
            prev = st.cuda_op
            st.cuda_op = True
            st.dispatch_depth += 1
        try:
            for m in self.modes:
                m.__enter__()
                entered.append(m)
            return func(*args, **(kwargs or {}))
        finally:
            for m in reversed(entered):
                m.__exit__(None, None, None)
            self.depth -= 1
            if st is not None:
                st.cuda_op = prev
                st.dispatch_depth -= 1

    def install(self) -> None:
        """Route ops with fake arguments through :meth:`run` (``FakeTensor.__torch_dispatch__`` wrapped)."""
        from torch._subclasses.fake_tensor import FakeTensor

        orig = FakeTensor.__dict__["__torch_dispatch__"].__func__
        prim_device = self.torch.ops.prim.device.default
        scalar_reads = (self.torch.ops.aten._local_scalar_dense.default, self.torch.ops.aten.item.default)
        gpu = self

        def __torch_dispatch__(cls: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if gpu.depth or func is prim_device:
                return orig(cls, func, types, args, kwargs if kwargs is not None else {})
            try:
                return gpu.run(func, args, kwargs)
            except Exception:
                # ``.item()`` of a tensor made under ``torch.inference_mode()`` reaches the fake mode without
                # the tracker's answer (torchvision's references: ``acc1.item()``): answered here the same way
                if func not in scalar_reads or gpu.scalar_answer is None or not args:
                    raise
                return gpu.scalar_answer(args[0])

        FakeTensor.__torch_dispatch__ = classmethod(__torch_dispatch__)  # type: ignore[method-assign, assignment]


def make_fake_gpu_mode(torch: Any, fake_mode: Any) -> Any:
    """The lowest dispatch mode: runs each (GPU) op in ``fake_mode``, a never-entered
    ``FakeTensorMode(allow_non_fake_inputs=True)``: real CPU inputs of a GPU op become fake tensors."""
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


def make_host_fast_mode(torch: Any) -> Any:
    """The highest of the probe's function modes: host calls skip the modes below it.

    A host call has no ``FakeTensor`` argument, no CUDA ``device=``, and is none of the functions the device
    mode changes for host tensors too (moves, ``.type``, pinning, ``.numpy``, copies); it runs with
    torch-function handling off, so host work costs what it costs in the job.
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
            if func is T.type and len(args) == 2 and isinstance(args[1], torch.dtype) and not kwargs \
                    and not isinstance(args[0], FakeTensor):
                # ``.type(torch.int64)`` of a host tensor (word_language_model's tokenizer: once a line)
                with torch._C.DisableTorchFunction():
                    return func(*args)
            if func in special or "device" in kwargs or any_fake(args) or any_fake(kwargs.values()):
                return func(*args, **kwargs)
            with torch._C.DisableTorchFunction():
                return func(*args, **kwargs)

    return _HostFast()


def patch_fake_tensor(torch: Any, state: ProbeState) -> None:
    """Adapt ``FakeTensor`` to a program that believes it runs on a GPU (and :func:`patch_fake_swap`).

    ``FakeTensor.device`` (not seen by function modes) reports ``cuda:0`` for GPU-tagged tensors outside
    dispatch, the real fake device inside; ``FakeTensor.tolist`` returns zeros at once (a sampler's
    ``randperm(n).tolist()`` would read n values one by one).
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
    real_is_cuda: Any = FakeTensor.is_cuda

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
    """Let ``Module.to``/``.cuda()`` swap fake parameters: ``torch.utils.swap_tensors`` refuses tensors with
    weak references, and FakeTensorMode's memo (real tensors to fakes only) holds one for every fake tensor.
    """
    import torch.utils as tu
    from torch._subclasses.fake_tensor import FakeTensor

    shim = types.ModuleType("weakref")
    shim.__dict__.update(weakref.__dict__)
    shim.getweakrefs = lambda o: [] if isinstance(o, FakeTensor) else weakref.getweakrefs(o)  # type: ignore[attr-defined]
    if getattr(tu, "weakref", None) is weakref:
        tu.weakref = shim  # type: ignore[attr-defined]
