"""The fake GPU covers the legacy and less common CUDA spellings of real code (docs/estimator.md
"CUDA surfaces the probe covers": one test per row).

Each row's snippet makes a 16 MiB tensor (``BIG_B``) through the surface under test inside a real training
loop (real CPU torch, the real probe child): the probe must give a figure, its replayed peak must hold the
16 MiB (the tensor is GPU memory of the right dtype, not a host tensor), and no reason or log line may be the
driver error the real constructors raise without a GPU ("Found no NVIDIA driver").
"""
from __future__ import annotations

import os
import sys
import textwrap

import pytest

from slurm_coloc.probe.probe import probe_script

pytestmark = pytest.mark.slow  # real probe/torch/subprocess work: left out of the fast command

BIG_B = 16 << 20
LOOP = """
import os
import numpy as np
import torch
from torch.autograd import Variable
model = torch.nn.Linear(8, 1).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
{snippet}
    loss = model(torch.randn(4, 8).cuda()).sum() + big.float().sum() * 0
    opt.zero_grad()
    loss.backward()
    opt.step()
"""
ROWS = {
    "FloatTensor(sizes)": "big = torch.cuda.FloatTensor(2048, 2048)",
    "LongTensor(torch.Size)": "big = torch.cuda.LongTensor(torch.Size([1024, 2048])).fill_(1)",
    "ByteTensor(sizes).zero_()": "big = torch.cuda.ByteTensor(4096, 4096).zero_()",
    "Tensor(np.random.normal(...)) in Variable": (
        "Tensor = torch.cuda.FloatTensor if torch.cuda.is_available() else torch.FloatTensor\n"
        "big = Variable(Tensor(np.random.normal(0, 1, (2048, 2048))), requires_grad=False)\n"
        "assert isinstance(big, torch.cuda.FloatTensor) and big.is_cuda"),
    "FloatTensor(list)": "big = torch.cuda.FloatTensor([[0.5] * 2048] * 2048)",
    ".type('torch.cuda.FloatTensor')": (
        "big = torch.randn(2048, 2048).type('torch.cuda.FloatTensor')\n"
        "assert big.type() == 'torch.cuda.FloatTensor', big.type()"),
    ".type(torch.cuda.HalfTensor)": (
        "big = torch.randn(2048, 4096).type(torch.cuda.HalfTensor)\n"
        "assert big.dtype == torch.float16 and isinstance(big, torch.cuda.HalfTensor)\n"
        "assert not isinstance(big, torch.cuda.FloatTensor)"),
    "set_device / current_device() as an index": (
        "torch.cuda.set_device(0)\n"
        "big = torch.empty(2048, 2048, device=torch.cuda.current_device())\n"
        "model.cuda(torch.cuda.current_device())"),
    ".cuda(non_blocking=True) of pinned memory": (
        "big = torch.randn(2048, 2048).pin_memory().cuda(non_blocking=True)"),
    "DataLoader(pin_memory=True)": (
        "ds = torch.utils.data.TensorDataset(torch.randn(8, 2048, 256))\n"
        "dl = torch.utils.data.DataLoader(ds, batch_size=8, pin_memory=True, num_workers=0)\n"
        "big = next(iter(dl))[0].cuda(non_blocking=True)"),
    "streams and events": (
        "s, e0, e1 = torch.cuda.Stream(), torch.cuda.Event(enable_timing=True), torch.cuda.Event()\n"
        "e0.record()\n"
        "with torch.cuda.stream(s):\n"
        "    big = torch.empty(2048, 2048, device='cuda')\n"
        "torch.cuda.current_stream().wait_stream(s)\n"
        "big.record_stream(torch.cuda.current_stream())\n"
        "e1.record(); e1.synchronize(); ms = e0.elapsed_time(e1); torch.cuda.synchronize()"),
    "cudnn and TF32 switches": (
        "torch.backends.cudnn.benchmark = True\n"
        "torch.backends.cudnn.deterministic = True\n"
        "torch.backends.cudnn.enabled = True\n"
        "torch.backends.cudnn.allow_tf32 = True\n"
        "torch.backends.cuda.matmul.allow_tf32 = True\n"
        "assert torch.backends.cudnn.is_available() in (True, False)\n"
        "big = torch.zeros(2048, 2048).cuda()"),
    "torch.cuda.amp.autocast / GradScaler": (
        "scaler = torch.cuda.amp.GradScaler()\n"
        "with torch.cuda.amp.autocast():\n"
        "    big = torch.randn(2048, 2048, device='cuda')\n"
        "    amp_loss = model(torch.randn(4, 8, device='cuda')).sum()\n"
        "scaler.scale(amp_loss).backward()\n"
        "scaler.step(opt)\n"
        "scaler.update()"),
    "Variable(volatile=True)": (
        "big = Variable(torch.randn(2048, 2048).cuda(), volatile=True)"),
    "set_default_tensor_type(torch.cuda.FloatTensor)": (
        "torch.set_default_tensor_type(torch.cuda.FloatTensor)\n"
        "big = torch.empty(2048, 2048)\n"
        "assert big.is_cuda"),
}


@pytest.fixture(autouse=True)
def job_env(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _probe(tmp_path, body: str):
    (tmp_path / "train.py").write_text(body)
    job = tmp_path / "job.sh"
    job.write_text("#!/bin/bash\n#SBATCH --gres=gpu:1\npython train.py\n")
    return probe_script(str(job), submit_dir=str(tmp_path), use_cache=False, keep_log=True)


@pytest.mark.parametrize("row", sorted(ROWS))
def test_legacy_cuda_surface_is_gpu_memory(row: str, tmp_path) -> None:
    r = _probe(tmp_path, LOOP.format(snippet=textwrap.indent(ROWS[row], "    ")))
    assert "NVIDIA driver" not in r.reason and "NVIDIA driver" not in r.log_text, r.log_text[-1500:]
    assert r.estimate is not None, (r.reason, r.log_text[-1500:])
    assert r.detail["steps"] >= 2
    assert r.detail["peak_allocated_b"] >= BIG_B, (row, r.detail["peak_allocated_b"])
    if "autocast" in row:
        assert r.detail["autocast"] == ["float16"]


def test_makedirs_of_an_existing_folder_is_no_outside_write(tmp_path) -> None:
    """GAN scripts' ``os.makedirs("images", exist_ok=True)`` on a folder that exists (here an absolute path
    outside the scratch directory) changes nothing: not flagged; a new folder there is."""
    (tmp_path / "out" / "images").mkdir(parents=True)
    made = tmp_path / "out" / "new"
    snippet = (f"os.makedirs({str(tmp_path / 'out' / 'images')!r}, exist_ok=True)\n"
               f"os.makedirs({str(made)!r}, exist_ok=True)\n"
               "big = torch.cuda.FloatTensor(2048, 2048)")
    r = _probe(tmp_path, LOOP.format(snippet=textwrap.indent(snippet, "    ")))
    assert r.estimate is not None, r.reason
    assert r.detail["outside_writes"] == [str(made)]
