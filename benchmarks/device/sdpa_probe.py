#!/usr/bin/env python3
"""Which SDPA kernel does CUDA pick, and what does it keep, for a float attention bias (issue 3).

    /opt/torch/.venv/bin/python3 -m benchmarks.device.sdpa_probe

T5-style: q, k, v (32, 8, 512, 64) from bf16 autocast; an additive bias (1, 8, 512, 512) that
requires grad, in float32 (T5's relative position bias) or in the query's dtype, contiguous or, as
T5's ``compute_bias`` makes it, a permuted (T, T, H) embedding output (last-dim stride H). Prints, per case,
the memory held after the forward (saved for backward), the peak of forward + backward and the
CUDA kernels that ran (profiler names containing attention/gemm/softmax).
"""
import torch
import torch.nn.functional as F

B, H, T, D = 32, 8, 512, 64
for mask_dtype, grad, dropout, permuted in ((torch.float32, True, 0.1, False), (torch.bfloat16, True, 0.1, False),
                                           (torch.float32, False, 0.1, False), (None, False, 0.1, False),
                                           (torch.float32, True, 0.0, False), (torch.float32, True, 0.1, True),
                                           (torch.bfloat16, True, 0.1, True), (torch.float32, False, 0.1, True)):
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    if mask_dtype is None:
        mask = None
    elif permuted:  # T5's compute_bias: an embedding (T, T, H) permuted to (1, H, T, T): last-dim stride H
        emb = torch.randn(T, T, H, device="cuda", dtype=mask_dtype, requires_grad=grad)
        mask = emb.permute(2, 0, 1).unsqueeze(0)
    else:
        mask = torch.randn(1, H, T, T, device="cuda", dtype=mask_dtype, requires_grad=grad)
    base = torch.cuda.memory_allocated()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
        kept = torch.cuda.memory_allocated() - base
        out.float().sum().backward()
        torch.cuda.synchronize()
    words = ("attention", "fmha", "softmax", "gemm", "flash", "cutlass")
    names = sorted({e.key[:60] for e in prof.key_averages() if any(s in e.key.lower() for s in words)})
    print(f"mask {mask_dtype} grad {grad} dropout {dropout} permuted {permuted}: out {out.dtype}, "
          f"kept after forward {kept / 2**20:.0f} MiB, "
          f"peak {(torch.cuda.max_memory_allocated() - base) / 2**20:.0f} MiB; kernels: {names[:6]}", flush=True)
    del q, k, v, mask, out
    if mask_dtype is not None and permuted:
        del emb
