"""What the CPU/meta trace does differently from the GPU run of a well-formed batch, made to do as the GPU
does. Torch is imported only inside the functions.

Value reads: the trace runs on ``meta`` (fp32) or fake CPU tensors (AMP), shapes without values. Reading one
back (``.item()``, ``bool(t)``, ``if (t == 0).all():``, as Hugging Face transformers 5.x causal LMs do with
``use_cache=False``) dispatches ``aten._local_scalar_dense``, which meta tensors refuse.
:class:`ScalarAssumptions` answers as a well-formed batch would: a 0-dim ``all`` result (validity checks)
``True``, a 0-dim ``any`` result (anomaly checks: NaN, ids out of range, padding) ``False``, any other boolean
``False``, any other number ``0`` (the zero-filled token ids, in ``[0, vocab)``); each assumed read is counted
in the estimate's detail.

CUDA kernels, imitated by ``TorchFunctionMode``s (not entered): :func:`make_sdpa_mode` (fused attention),
:func:`make_cuda_fp32_mode` (CUDA autocast's float32 functions under AMP), :func:`make_cuda_dropout_mode`
(dropout's one-byte mask). Measured on the H100 (``benchmarks/device/sdpa_probe.py``, ``mem_snapshot.py``;
docs/estimator.md).
"""
from __future__ import annotations

import contextlib
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, Sequence, Union

if TYPE_CHECKING:
    import torch as torch_t

ORIGIN_OPS = ("all", "any")
NOTE = ("data-dependent reads (.item()/bool()) answered without data: all() -> True, "
        "any() -> False, other booleans False, numbers 0 (a well-formed, unpadded batch)")


class ScalarAssumptions:
    """Which 0-dim tensors came from ``all``/``any``, and value reads answered; ``counts``: assumed reads by
    kind (``all``, ``any``, ``bool``, ``number``)."""

    def __init__(self) -> None:
        self.origin: Dict[int, str] = {}
        self.counts: Dict[str, int] = {}

    def note_output(self, func: Callable[..., object], storage_key: int) -> None:
        """Record that the 0-dim output with ``storage_key`` came from ``func`` (``ORIGIN_OPS`` only)."""
        name = func.__name__.split(".")[0]
        if name in ORIGIN_OPS:
            self.origin[storage_key] = name

    def forget(self, storage_key: int) -> None:
        """The storage died: its key may be reused by an unrelated tensor."""
        self.origin.pop(storage_key, None)

    def answer(self, torch: ModuleType, t: "torch_t.Tensor") -> Union[bool, int, float]:
        """0-dim ``t``'s assumed value, counted: True (``all``), False (``any``, bool), else 0.0 or 0."""
        kind = self.origin.get(t.untyped_storage()._cdata, "")
        if kind == "all":
            value: Union[bool, int, float] = True
        elif kind == "any":
            value = False
        elif t.dtype == torch.bool:
            kind, value = "bool", False
        else:
            kind = "number"
            value = 0.0 if (t.dtype.is_floating_point or t.dtype.is_complex) else 0
        self.counts[kind] = self.counts.get(kind, 0) + 1
        return value

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def has_no_data(torch: ModuleType, t: object) -> bool:
    """Whether ``t`` is a tensor without values: on ``meta``, or a ``FakeTensor``."""
    if not isinstance(t, torch.Tensor):
        return False
    if t.device.type == "meta":
        return True
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def pick_output(torch: ModuleType, out: object) -> Any:
    """The tensor the step's loss is computed from, given what ``model(x)`` returned; None when none is found.

    A tensor as is; a tensor ``.logits`` (Hugging Face ``ModelOutput``); a dict's ``"logits"``, else its first
    tensor value; a tuple or list's first element (recursively, at most 8 levels).
    """
    for _ in range(8):  # bounded: nested containers
        if isinstance(out, torch.Tensor):
            return out
        logits = getattr(out, "logits", None)
        if isinstance(logits, torch.Tensor):
            return logits
        if isinstance(out, dict):
            if isinstance(out.get("logits"), torch.Tensor):
                return out["logits"]
            vals = [v for v in out.values() if v is not None]
            out = next((v for v in vals if isinstance(v, torch.Tensor)), vals[0] if vals else None)
        elif isinstance(out, (tuple, list)):
            out = out[0] if out else None
        else:
            return None
    return None


def _cuda_sdpa(torch: ModuleType, sdpa: Callable[..., "torch_t.Tensor"], args: Sequence[Any],
               kwargs: Dict[str, Any]) -> Any:
    """``F.scaled_dot_product_attention(*args, **kwargs)`` with the kernel CUDA would choose (see below)."""
    q, k, v = args[:3]
    mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
    p = args[4] if len(args) > 4 else kwargs.get("dropout_p", 0.0)
    causal = args[5] if len(args) > 5 else kwargs.get("is_causal", False)
    if mask is not None and mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device)
    if mask is not None and causal:
        causal = False  # the additive mask already holds the causal pattern
    if (mask is not None and mask.is_floating_point() and mask.dim() > 0 and mask.shape[-1] > 1
            and mask.stride(-1) != 1):
        # CUDA's fused kernels refuse a bias whose last dim is not contiguous (T5's position
        # bias, a permuted embedding): the math backend runs, in float32 for fp16/bf16 inputs,
        # and keeps B x H x T x T float32 tensors (benchmarks/device/sdpa_probe.py on the H100:
        # 688-720 MiB kept per call at B=32, H=8, T=512 instead of 20 MiB).
        with torch.autocast("cpu", enabled=False):
            out = torch.ops.aten._scaled_dot_product_attention_math(
                q.float(), k.float(), v.float(), mask.float(), float(p), bool(causal),
                scale=kwargs.get("scale"))[0]
        return out.to(q.dtype)
    if q.dim() == 4 and k.shape[-1] == v.shape[-1] and kwargs.get("enable_gqa") is not True:
        if mask is not None:
            mask = mask.to(q.dtype).expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, mask, True, float(p), bool(causal), scale=kwargs.get("scale"))[0]
    return sdpa(*args, **kwargs)


def make_sdpa_mode(torch: ModuleType) -> Any:
    """A mode routing ``F.scaled_dot_product_attention`` to CUDA's efficient kernel: on meta/CPU the math
    fallback materialises the B*H*T*T attention matrix, on an H100 the fused kernels keep only the output and
    a B*H*T log-sum-exp (``_scaled_dot_product_efficient_attention`` has meta kernels and a derivative).
    Inside ``F.multi_head_attention_forward`` the modes are popped: :func:`patch_functional_sdpa` covers that
    call."""
    from torch.overrides import TorchFunctionMode

    sdpa = torch.nn.functional.scaled_dot_product_attention

    class _Sdpa(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = kwargs or {}
            return _cuda_sdpa(torch, sdpa, args, kwargs) if func is sdpa else func(*args, **kwargs)

    return _Sdpa()


@contextlib.contextmanager
def patch_functional_sdpa(torch: ModuleType) -> Iterator[None]:
    """Within the block, ``torch.nn.functional.scaled_dot_product_attention`` (the global
    ``F.multi_head_attention_forward`` calls) picks CUDA's kernel, so ``nn.MultiheadAttention`` with
    ``need_weights=False`` (``nn.TransformerEncoderLayer``, torchvision's ViT) traces the fused kernel's
    memory instead of the math path's B x H x T x T matrices."""
    F = torch.nn.functional
    sdpa = F.scaled_dot_product_attention

    def cuda_sdpa(*args: Any, **kwargs: Any) -> Any:
        return _cuda_sdpa(torch, sdpa, args, kwargs)

    F.scaled_dot_product_attention = cuda_sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = sdpa


def make_cuda_dropout_mode(torch: ModuleType, on_gpu: Callable[["torch_t.Tensor"], bool]) -> Any:
    """A mode running training dropout as CUDA does (``native_dropout``): CUDA's fused kernel
    (``at::dropout``, ``is_fused_kernel_acceptable``: a CUDA input, 0 < p < 1) saves a one-byte ``bool`` mask
    for the backward, CPU and meta a noise tensor of the input's dtype (4 bytes per element in fp32)."""
    from torch.overrides import TorchFunctionMode

    funcs = {torch.nn.functional.dropout, torch.dropout}

    class _Dropout(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = kwargs or {}
            if func in funcs and args and isinstance(args[0], torch.Tensor):
                x = args[0]
                p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
                train = args[2] if len(args) > 2 else kwargs.get("training", kwargs.get("train", True))
                inplace = args[3] if len(args) > 3 else kwargs.get("inplace", False)
                if (train and not inplace and 0.0 < float(p) < 1.0 and x.is_floating_point() and x.numel() > 0
                        and on_gpu(x)):
                    return torch.ops.aten.native_dropout(x, float(p), True)[0]
            return func(*args, **kwargs)

    return _Dropout()


# Functions CUDA autocast runs in float32 that CPU autocast (which the AMP trace uses, on fake CPU
# tensors) leaves in fp16/bf16: "CUDA Ops that can autocast to float32" of the torch.amp docs
# minus CPU autocast's own fp32 list (aten/src/ATen/autocast_mode.cpp). Without them a traced AMP
# job held half the bytes the GPU holds for softmax/LayerNorm outputs: swin_t AMP traced 8-12% below
# torch's peak allocated on the H100, with them 2,019 vs 2,033 MiB (data/hopper, config 9968).
_CUDA_FP32_NAMES = {
    "torch.nn.functional": ("softmax", "log_softmax", "softmin", "layer_norm", "group_norm", "softplus",
                            "normalize", "cosine_similarity"),
    "torch": ("softmax", "log_softmax", "layer_norm", "group_norm", "exp", "expm1", "log", "log10", "log1p",
              "log2", "pow", "reciprocal", "rsqrt", "sum", "cumsum", "cumprod", "norm", "renorm", "acos",
              "asin", "cosh", "sinh", "tan", "erfinv", "dist", "pdist", "cosine_similarity"),
    "torch.Tensor": ("softmax", "log_softmax", "exp", "expm1", "log", "log10", "log1p", "log2", "pow",
                     "__pow__", "__rpow__", "__rtruediv__", "reciprocal", "rsqrt", "sum", "cumsum", "cumprod",
                     "norm", "renorm", "acos", "asin", "cosh", "sinh", "tan", "erfinv", "dist"),
}


def make_cuda_fp32_mode(torch: ModuleType) -> Any:
    """A mode running under CPU autocast the functions in ``_CUDA_FP32_NAMES`` as CUDA autocast does:
    fp16/bf16 arguments cast to float32, autocast off."""
    import importlib

    from torch.overrides import TorchFunctionMode
    from torch.utils._pytree import tree_flatten, tree_map

    funcs = set()
    for mod, names in _CUDA_FP32_NAMES.items():
        owner: Any = torch.Tensor if mod == "torch.Tensor" else importlib.import_module(mod)
        for n in names:
            f = getattr(owner, n, None)
            if f is not None:
                funcs.add(f)
    low = (torch.float16, torch.bfloat16)

    def up(a: object) -> object:
        return a.float() if isinstance(a, torch.Tensor) and a.dtype in low else a

    class _CudaFp32(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = kwargs or {}
            if func in funcs and torch.is_autocast_enabled("cpu") and any(
                    isinstance(a, torch.Tensor) and a.dtype in low for a in tree_flatten((args, kwargs))[0]):
                with torch.autocast("cpu", enabled=False):
                    return func(*tree_map(up, args), **tree_map(up, kwargs))
            return func(*args, **kwargs)

    return _CudaFp32()
