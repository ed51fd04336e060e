"""Gradient accumulation in the probe: repeated micro-steps of one optimizer cycle are skipped, safely.

nanoGPT's ``train_gpt2.py`` runs 40 forward+backward micro-steps per ``optimizer.step()``; the probe traces
the first two of each cycle and answers the rest (``probe/inject/repeats.py``). The figure must equal the
k=2 figure (later micro-steps hold the 2nd one's memory), FLOPs per step must count all k micro-steps, and
a micro-step that differs (another shape) must run.
"""
from __future__ import annotations

import pytest

from tests.test_probe_cuda_paths import job_env  # noqa: F401  (autouse: the job's PATH, a fresh cache)
from tests.test_probe_gpu_only import MIB, probe

pytestmark = pytest.mark.slow  # real probe/torch/subprocess work: left out of the fast command

ACCUM = """
    import sys
    import torch, torch.nn as nn
    k, mode = int(sys.argv[1]), sys.argv[2]

    class Net(nn.Module):   # returns its loss, as Hugging Face models do
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(512, 4096), nn.GELU(), nn.Linear(4096, 512))

        def forward(self, x):
            return self.body(x).square().mean()

    model = Net().cuda()
    opt = torch.optim.AdamW(model.parameters())
    for it in range(3):
        for micro in range(k):
            b = 64
            if mode == "last_big" and micro == k - 1:
                b = 2048                      # a different micro-step: must be traced
            elif mode == "varlen":
                b = 64 + 8 * micro            # every micro-step its own shape
            x = torch.randn(b, 512).cuda()
            loss = model(x)
            loss /= k                         # in place, as the Hugging Face Trainer scales it
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
"""


def test_repeated_micro_steps_are_skipped_and_hold_the_same_memory(tmp_path):
    two = probe(tmp_path, "accum", ACCUM, "2", "same")
    three = probe(tmp_path, "accum", ACCUM, "3", "same")
    eight = probe(tmp_path, "accum", ACCUM, "8", "same")
    for r in (two, three, eight):
        assert r.estimate is not None, (r.reason, r.log_text[-2000:])
    notes8 = " ".join(eight.detail["notes"])
    assert "gradient accumulation: 12 repeated micro-step(s)" in notes8  # 6 per cycle, 2 cycles
    assert "micro-step" not in " ".join(two.detail["notes"])
    # micro-steps 3..k hold the memory of the 2nd: the same replayed peaks as k=2
    assert eight.detail["peak_reserved_b"] == two.detail["peak_reserved_b"]
    # never below; a stand-in output's graph lives until the next micro-step (no backward frees it): <= 1 MiB
    assert 0 <= eight.detail["peak_allocated_b"] - two.detail["peak_allocated_b"] <= MIB
    assert eight.estimate.mem_mib == two.estimate.mem_mib
    # FLOPs per optimizer step count all k micro-steps (the FLOP counter counts GEMMs only here)
    f2, f3, f8 = (r.detail["flops_per_step"] for r in (two, three, eight))
    assert f2 and f3 and f8
    assert abs(f3 - 1.5 * f2) <= 0.01 * f2
    assert abs(f8 - 4 * f2) <= 0.01 * f2


def test_a_micro_step_of_another_shape_is_traced(tmp_path):
    same = probe(tmp_path, "accum", ACCUM, "8", "same")
    big = probe(tmp_path, "accum", ACCUM, "8", "last_big")
    assert same.estimate is not None and big.estimate is not None, (big.reason, big.log_text[-2000:])
    # micro-steps 3..7 of each cycle are skipped, the 8th (batch 2048) runs: its activations count
    assert "gradient accumulation: 10 repeated micro-step(s)" in " ".join(big.detail["notes"])
    # 2048 x 4096 fp32 hidden pre- and post-GELU activations held for backward: 2 x 32 MiB
    assert big.detail["peak_allocated_b"] - same.detail["peak_allocated_b"] >= 60 * MIB


def test_micro_steps_of_changing_shapes_are_not_skipped(tmp_path):
    r = probe(tmp_path, "accum", ACCUM, "6", "varlen")
    assert r.estimate is not None, (r.reason, r.log_text[-2000:])
    assert "micro-step" not in " ".join(r.detail["notes"])
    assert r.detail["forwards"] >= 12  # every micro-step of both cycles ran
