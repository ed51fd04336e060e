"""The AMP trace follows CUDA autocast's float32 list: softmax/LayerNorm outputs are fp32."""
from __future__ import annotations

import torch

from slurm_coloc.estimate.gpulike import make_cuda_fp32_mode
from slurm_coloc.estimate.spec import ModelSpec
from slurm_coloc.estimate.trace import trace_spec


def test_cuda_fp32_list_functions_run_in_float32_under_cpu_autocast():
    x = torch.randn(4, 8)
    w = torch.randn(8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = torch.softmax(x @ w, -1)
        with make_cuda_fp32_mode(torch):
            y = x @ w
            s = torch.nn.functional.softmax(y, dim=-1)
            ln = torch.nn.functional.layer_norm(y, (8,))
            e = y.exp()
    assert plain.dtype == torch.bfloat16  # what CPU autocast alone gives
    assert y.dtype == torch.bfloat16  # matmul stays in the low precision, as on CUDA
    assert s.dtype == ln.dtype == e.dtype == torch.float32
    with make_cuda_fp32_mode(torch):  # autocast off: nothing is cast
        assert torch.softmax(x.bfloat16(), -1).dtype == torch.bfloat16


def test_amp_trace_holds_float32_softmax_outputs(tmp_path):
    (tmp_path / "m.py").write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.a = torch.nn.Linear(64, 64); self.b = torch.nn.Linear(64, 10)\n"
        "    def forward(self, x):\n"
        "        h = self.a(x)\n"
        "        p = torch.softmax(h @ h.transpose(1, 2), -1)\n"  # B x T x T attention-like
        "        return self.b(p @ h).mean(1)\n"
        "def build():\n"
        "    return M()\n")
    fp32 = trace_spec(ModelSpec("m.py:build", (1024, 64), 16, optimizer="sgd", base_dir=str(tmp_path)))
    bf16 = trace_spec(ModelSpec("m.py:build", (1024, 64), 16, optimizer="sgd", precision="bf16",
                                base_dir=str(tmp_path)))
    # The B x T x T softmax output is saved for backward in float32 under CUDA autocast, so the
    # bf16 job holds about as much as the fp32 one (CPU autocast alone gives ~64%: 170 vs 268 MiB).
    assert bf16.peak_allocated_b > 0.9 * fp32.peak_allocated_b


_SDPA_MODEL = (
    "import torch\n"
    "class M(torch.nn.Module):\n"
    "    def __init__(self, contiguous):\n"
    "        super().__init__(); self.contiguous = contiguous\n"
    "        self.q = torch.nn.Linear(64, 64); self.out = torch.nn.Linear(64, 10)\n"
    "        self.bias = torch.nn.Parameter(torch.zeros(256, 256, 4))  # (T, T, H), as T5's embedding\n"
    "    def forward(self, x):\n"
    "        b, t, _ = x.shape\n"
    "        q = self.q(x).view(b, t, 4, 16).transpose(1, 2)\n"
    "        mask = self.bias.permute(2, 0, 1).unsqueeze(0)  # (1, H, T, T), last-dim stride H\n"
    "        if self.contiguous:\n"
    "            mask = mask.contiguous()\n"
    "        o = torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)\n"
    "        return self.out(o.transpose(1, 2).reshape(b, t, 64)).mean(1)\n"
    "def build(contiguous=False):\n"
    "    return M(contiguous)\n")


def test_attention_bias_with_strided_last_dim_takes_the_math_path(tmp_path):
    """CUDA's fused SDPA kernels refuse such a bias (T5): the trace must hold the B x H x T x T tensors."""
    (tmp_path / "m.py").write_text(_SDPA_MODEL)
    peaks = {}
    for prec in ("fp32", "bf16"):
        for contiguous in (True, False):
            spec = ModelSpec("m.py:build", (256, 64), 32, kwargs={"contiguous": contiguous}, optimizer="sgd",
                             precision=prec, base_dir=str(tmp_path))
            peaks[prec, contiguous] = trace_spec(spec).peak_allocated_b
    bhtt_fp32 = 32 * 4 * 256 * 256 * 4  # 32 MiB: one float32 attention matrix
    for prec in ("fp32", "bf16"):
        assert peaks[prec, False] > peaks[prec, True] + 1.5 * bhtt_fp32, (prec, peaks)
