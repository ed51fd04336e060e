"""What the GPU does differently from the CPU/meta trace, imitated by ``TorchFunctionMode``s the trace enters.

* :func:`make_sdpa_mode`: ``F.scaled_dot_product_attention`` takes CUDA's fused memory-efficient kernel
  (the CPU math path materialises T x T), except where CUDA falls back to float32 math (a bias whose last
  dimension is not contiguous);
* :func:`make_cuda_fp32_mode`: under AMP, functions CUDA autocast runs in float32 and CPU autocast does not
  run in float32.

Measured on the H100 (``benchmarks/device/sdpa_probe.py``, ``mem_snapshot.py``; docs/estimator.md). Torch is
imported only inside the functions.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator


def _cuda_sdpa(torch: Any, sdpa: Any, args: Any, kwargs: Any) -> Any:
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


def make_sdpa_mode(torch: Any) -> Any:
    """A ``TorchFunctionMode`` (not entered) routing ``F.scaled_dot_product_attention`` to CUDA's efficient
    kernel.

    On meta/CPU the math fallback materialises the B*H*T*T attention matrix; on an H100 the fused kernels keep
    only the output and a B*H*T log-sum-exp. ``_scaled_dot_product_efficient_attention`` has meta kernels and
    a derivative, so the traced allocations match the GPU's. Inside ``F.multi_head_attention_forward`` the
    modes are popped, so that SDPA call is not seen: :func:`patch_functional_sdpa` covers it.
    """
    from torch.overrides import TorchFunctionMode

    sdpa = torch.nn.functional.scaled_dot_product_attention

    class _Sdpa(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = kwargs or {}
            if func is sdpa:
                return _cuda_sdpa(torch, sdpa, args, kwargs)
            return func(*args, **kwargs)

    return _Sdpa()


@contextlib.contextmanager
def patch_functional_sdpa(torch: Any) -> Iterator[None]:
    """Within the block, ``torch.nn.functional.scaled_dot_product_attention`` picks CUDA's kernel.

    The module attribute is what ``F.multi_head_attention_forward`` calls (a global of
    ``torch/nn/functional.py``), so ``nn.MultiheadAttention`` with ``need_weights=False`` (as
    ``nn.TransformerEncoderLayer`` and torchvision's ViT call it) traces the fused kernel's memory,
    as on the GPU, instead of the math path's B x H x T x T matrices. Restored on exit.
    """
    F = torch.nn.functional
    sdpa = F.scaled_dot_product_attention

    def cuda_sdpa(*args: Any, **kwargs: Any) -> Any:
        return _cuda_sdpa(torch, sdpa, args, kwargs)

    F.scaled_dot_product_attention = cuda_sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = sdpa


def make_cuda_dropout_mode(torch: Any, on_gpu: Callable[[Any], bool]) -> Any:
    """A ``TorchFunctionMode`` (not entered) running training dropout as CUDA does: ``native_dropout``.

    CUDA's fused kernel (``at::dropout``, ``is_fused_kernel_acceptable``: a CUDA input, 0 < p < 1) saves a
    one-byte ``bool`` mask for the backward; on CPU and meta the same call saves a noise tensor of the input's
    dtype (4 bytes per element in fp32).
    """
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


def make_cuda_fp32_mode(torch: Any) -> Any:
    """A ``TorchFunctionMode`` (not entered): under CPU autocast, CUDA autocast's float32 functions run in
    float32.

    As CUDA autocast does: floating fp16/bf16 arguments are cast to float32 and the function runs with
    autocast off. The list is ``_CUDA_FP32_NAMES`` (torch.amp docs minus ``aten/src/ATen/autocast_mode.cpp``'s
    CPU fp32 list).
    """
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

    def up(a: Any) -> Any:
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
