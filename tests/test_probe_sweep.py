"""Sweep reuse: one probe per training configuration. Submissions of one script that differ only
in arguments no shape depends on (learning rate, seed, epochs, output paths) reuse the first probe, and the
``ran`` line (``--explain``) says so; an argument that changes the batch or the model probes afresh. Real
probes (real CPU torch) through ``probe_script``'s real per-user cache; the argument reader is pure.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from slurm_coloc.probe.probe import probe_script
from slurm_coloc.probe.words import config_args

pytestmark = pytest.mark.slow  # real probe/torch/subprocess work: left out of the fast command

TRAIN = """\
import argparse
import torch
p = argparse.ArgumentParser()
p.add_argument("--lr", type=float, default=0.1)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--epochs", type=int, default=1)
p.add_argument("--output-dir", default="out")
p.add_argument("--batch-size", type=int, default=8)
a = p.parse_args()
m = torch.nn.Linear(512, 512).cuda()
opt = torch.optim.SGD(m.parameters(), lr=a.lr)
for _ in range(3):
    m(torch.randn(a.batch_size, 512, device="cuda")).sum().backward()
    opt.step()
"""


@pytest.fixture(autouse=True)
def env(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))


def _submit(tmp_path: Path, args: str, refresh: bool = False):
    (tmp_path / "train.py").write_text(TRAIN)
    job = tmp_path / "job.sh"
    job.write_text("#!/bin/bash\n#SBATCH --gres=gpu:1\npython train.py \"$@\"\n")
    return probe_script(str(job), tuple(args.split()), submit_dir=str(tmp_path), refresh=refresh)


def test_a_learning_rate_sweep_reuses_one_probe(tmp_path):
    first = _submit(tmp_path, "--lr 0.1 --seed 1 --epochs 10 --output-dir runs/a")
    assert first.estimate is not None and not first.cached, first.reason
    again = _submit(tmp_path, "--lr=0.001 --seed 2 --epochs 20 --output-dir runs/b")
    assert again.cached and again.estimate == first.estimate
    assert ("reused for this submission, which differs only in arguments that change no shape, dtype, model "
            "or batch (--lr 0.1 --seed 1 --epochs 10 --output-dir runs/a -> --lr=0.001 --seed 2 --epochs 20 "
            "--output-dir runs/b)") in again.ran
    explained = _submit(tmp_path, "--lr 0.01 --seed 1 --epochs 10 --output-dir runs/a", refresh=True)
    assert explained.cached and "reused for this submission" in explained.ran  # --explain says it was reused


def test_a_batch_size_change_probes_afresh(tmp_path):
    first = _submit(tmp_path, "--lr 0.1 --batch-size 8")
    other = _submit(tmp_path, "--lr 0.1 --batch-size 4096")
    assert not other.cached and other.estimate is not None
    assert other.detail["peak_allocated_b"] > first.detail["peak_allocated_b"]


def test_the_same_submission_under_explain_probes_afresh(tmp_path):
    _submit(tmp_path, "--lr 0.1")
    assert not _submit(tmp_path, "--lr 0.1", refresh=True).cached


@pytest.mark.parametrize("args, kept", [
    (["--lr", "0.1", "data/"], ["data/"]),
    (["--learning-rate=3e-4", "--arch", "resnet50"], ["--arch", "resnet50"]),
    (["-lr", "-0.5", "--batch-size", "64"], ["--batch-size", "64"]),
    (["--seed", "--amp"], ["--amp"]),          # a valueless inert option never eats the next option
    (["--epochs", "5", "--num-layers", "12"], ["--num-layers", "12"]),
    (["--output_dir", "/scratch/x", "--img_size", "64"], ["--img_size", "64"]),
])
def test_config_args_drop_only_inert_options(args, kept):
    assert config_args(args)[0] == kept
