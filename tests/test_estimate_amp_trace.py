"""The AMP trace follows CUDA autocast's float32 list (issue 3): softmax/LayerNorm outputs are fp32."""
from __future__ import annotations

import torch

from slurm_coloc.estimate.spec import ModelSpec
from slurm_coloc.estimate.trace import _make_cuda_fp32_mode, trace_spec


def test_cuda_fp32_list_functions_run_in_float32_under_cpu_autocast():
    x = torch.randn(4, 8)
    w = torch.randn(8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = torch.softmax(x @ w, -1)
        with _make_cuda_fp32_mode(torch):
            y = x @ w
            s = torch.nn.functional.softmax(y, dim=-1)
            ln = torch.nn.functional.layer_norm(y, (8,))
            e = y.exp()
    assert plain.dtype == torch.bfloat16  # what CPU autocast alone gives
    assert y.dtype == torch.bfloat16  # matmul stays in the low precision, as on CUDA
    assert s.dtype == ln.dtype == e.dtype == torch.float32
    with _make_cuda_fp32_mode(torch):  # autocast off: nothing is cast
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
