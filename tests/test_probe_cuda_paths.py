"""The script probe takes the code paths a CUDA device takes, where they change memory (CPU torch, no GPU).

Three of them were found by the corpus on the H100 (docs/estimator.md "Script probe"): the fused SDPA
kernel inside ``nn.MultiheadAttention``, dropout's one-byte mask, and the optimizers' foreach path.
"""
from __future__ import annotations

import os
import sys
import textwrap

import pytest

from slurm_coloc.probe.probe import probe_script

pytestmark = pytest.mark.slow  # real probe/torch/subprocess work: left out of the fast command

MIB = 1 << 20


@pytest.fixture(autouse=True)
def job_env(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def probe(tmp_path, name, body, *args):
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    job = tmp_path / f"{name}.sh"
    job.write_text(f"#!/bin/bash\npython {name}.py {' '.join(args)}\n")
    r = probe_script(str(job), submit_dir=str(tmp_path), use_cache=False, keep_log=True)
    assert r.estimate is not None, (r.reason, r.log_text[-2000:])
    return r


ENCODER = """
    import sys
    import torch, torch.nn as nn
    layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 2).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        x = torch.randn(8, 1024, 64, device="cuda")
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_multihead_attention_traces_the_fused_kernel(tmp_path):
    # The math path would keep B x H x T x T = 8 x 4 x 1024 x 1024 fp32 = 128 MiB per layer (softmax output);
    # the fused kernel keeps the output and a B x H x T log-sum-exp. Everything else is a few MiB.
    r = probe(tmp_path, "enc", ENCODER)
    assert r.detail["peak_allocated_b"] < 64 * MIB + 64 * MIB  # + the two 32 MiB cuBLAS workspaces


DROPOUT = """
    import sys
    import torch, torch.nn as nn
    p = float(sys.argv[1])
    model = nn.Sequential(*[m for _ in range(8) for m in (nn.Linear(1024, 1024), nn.Dropout(p))]).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        loss = model(torch.randn(4096, 1024, device="cuda")).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_dropout_keeps_a_one_byte_mask_as_on_cuda(tmp_path):
    with_p = probe(tmp_path, "drop", DROPOUT, "0.5").detail["peak_allocated_b"]
    without = probe(tmp_path, "drop", DROPOUT, "0.0").detail["peak_allocated_b"]
    # 8 dropouts of a 4096 x 1024 fp32 activation: the next Linear saves the dropout's output instead of
    # its input (same size), so each dropout adds only its mask: 4 MiB of bool on CUDA, where CPU's path
    # would keep a 16 MiB float noise tensor.
    per_dropout_mib = (with_p - without) / 8 / MIB
    assert 3.5 <= per_dropout_mib <= 6, per_dropout_mib


FOREACH = """
    import torch, torch.nn as nn
    import torch.optim.adam as adam
    multi, single = adam._multi_tensor_adam, adam._single_tensor_adam
    def m(*a, **k):
        print("PATH foreach", flush=True)
        return multi(*a, **k)
    def s(*a, **k):
        print("PATH single", flush=True)
        return single(*a, **k)
    adam._multi_tensor_adam, adam._single_tensor_adam = m, s
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)).cuda()
    opt = torch.optim.Adam(model.parameters())
    for _ in range(3):
        loss = model(torch.randn(32, 256, device="cuda")).logsumexp(1).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
"""


def test_optimizer_takes_the_foreach_path_as_on_cuda(tmp_path):
    r = probe(tmp_path, "fe", FOREACH)
    assert "PATH foreach" in r.log_text and "PATH single" not in r.log_text


MANUAL_SGD = """
    import torch, torch.nn as nn
    model = nn.LSTM(256, 512, 2).cuda()
    head = nn.Linear(512, 1000).cuda()
    for i in range(50):
        x = torch.randn(35, 20, 256, device="cuda")
        out, _ = model(x)
        loss = head(out).logsumexp(-1).mean()
        model.zero_grad()
        loss.backward()
        for p in list(model.parameters()) + list(head.parameters()):
            p.data.add_(p.grad, alpha=-0.1)
        print(f"step {i} loss {loss:5.2f} ppl {loss.exp():8.2f}")
"""


def test_a_loop_without_an_optimizer_stops_after_its_second_backward(tmp_path):
    """pytorch/examples' word language model updates its parameters by hand: no optimizer step ever comes, so
    the probe stops after the second backward() (before: it ran the whole epoch and failed at its end), and
    printing a fake scalar with a format spec (f"{loss:5.2f}") works as on a real tensor."""
    r = probe(tmp_path, "manual", MANUAL_SGD)
    assert r.detail["steps"] == 0 and r.detail["forwards"] == 2 * 2  # the LSTM and the head, twice
    assert any(n.startswith("no torch.optim optimizer: stopped after backward() 2")
               for n in r.detail["notes"])
    # parameters (2-layer LSTM 256->512, head 512->1000) and their gradients are held at the stop
    params_b = 4 * (4 * 512 * (256 + 512 + 2) + 4 * 512 * (512 + 512 + 2) + 512 * 1000 + 1000)
    assert r.detail["peak_allocated_b"] >= 2 * params_b
    assert "step 0 loss  0.00" in r.log_text and "step 1" not in r.log_text  # stopped in the 2nd backward


def test_cudnn_benchmark_is_named_in_the_notes(tmp_path):
    """Autotuning's extra reservation is not modelled: the probe says so when the program turns it on."""
    body = """
        import torch, torch.nn as nn
        torch.backends.cudnn.benchmark = {flag}
        model = nn.Conv2d(3, 8, 3).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            model(torch.randn(4, 3, 32, 32, device="cuda")).sum().backward()
            opt.step()
    """
    on = probe(tmp_path, "bench_on", body.format(flag=True))
    off = probe(tmp_path, "bench_off", body.format(flag=False))
    assert any(n.startswith("cudnn.benchmark = True") for n in on.detail["notes"])
    assert not any(n.startswith("cudnn.benchmark") for n in off.detail["notes"])
