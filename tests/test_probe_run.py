"""The script probe on corpus scripts, with the real torch on the CPU (no GPU needed).

Each probe starts the job's Python (this venv's) in a child process; a run takes ~4-15 s here.
"""
from __future__ import annotations

import os
import shutil
import sys
import time

import pytest

from slurm_coloc.probe.probe import probe_script

pytestmark = pytest.mark.slow  # real probe/torch/subprocess work: left out of the fast command

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "benchmarks", "probe_corpus")
SLOW_S = 120  # these tests check figures, not speed (benchmarks do): the 2-core machine is shared


@pytest.fixture(autouse=True)
def job_env(monkeypatch, tmp_path):
    """The job's ``python`` is this venv's (as after ``source venv/bin/activate``); a private cache."""
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    # the probe runs a script's `source ~/.bashrc` as the job would; this machine's root .bashrc puts pyenv
    # first
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def corpus(name, **kw):
    kw.setdefault("timeout_s", SLOW_S)
    d = os.path.join(CORPUS, name)
    return probe_script(os.path.join(d, "job.sh"), submit_dir=d, **kw)


def tree(d):
    return sorted((os.path.relpath(os.path.join(p, f), d), os.path.getmtime(os.path.join(p, f)))
                  for p, _, fs in os.walk(d) for f in fs)


def test_mnist_gets_a_figure_and_cache_repeats_fast():
    r = corpus("mnist_cnn")
    assert r.estimate is not None, r.reason
    assert r.estimate.method == "probe" and r.detail["optimizers"] == ["Adadelta"]
    # context 612 + libs 146 + replayed reserved x 1.105 + 16: a small CNN needs about 1 GiB
    assert 900 < r.estimate.mem_mib < 1500
    assert "train.py --batch-size 128 --epochs 1" in r.ran
    t0 = time.monotonic()
    again = corpus("mnist_cnn")
    assert again.cached and time.monotonic() - t0 <= 0.2
    assert again.estimate.mem_mib == r.estimate.mem_mib


def test_gan_two_optimizers_each_stepped():
    r = corpus("dcgan")
    assert r.estimate is not None, r.reason
    assert r.detail["optimizers"] == ["Adam"] and r.detail["steps"] == 4  # 2 steps of each of 2 Adams


def test_gradient_accumulation_bf16(tmp_path):
    job = tmp_path / "job.sh"
    job.write_text(f"#!/bin/bash\npython {CORPUS}/nanogpt/train.py --n_layer=2 --n_head=4 --n_embd=128 "
                   "--block_size=64 --batch_size=4 --gradient_accumulation_steps=3\n")
    r = probe_script(str(job), submit_dir=str(tmp_path), timeout_s=SLOW_S)
    assert r.estimate is not None, r.reason
    # 3 micro-steps per step: the 3rd of each cycle repeats the 2nd and is skipped (probe/inject/repeats.py)
    assert r.detail["forwards"] == 4 and r.detail["autocast"] == ["bfloat16"]
    assert "gradient accumulation: 2 repeated micro-step(s)" in " ".join(r.detail["notes"])
    assert r.estimate.detail["precision"] == "bf16"


def test_stdout_hygiene(tmp_path, capfd):
    (tmp_path / "train.py").write_text(
        "import sys, torch\nprint('number of parameters: 10.65M')\nprint('noise', file=sys.stderr)\n"
        "m = torch.nn.Linear(8, 2).cuda()\no = torch.optim.SGD(m.parameters(), 0.1)\n"
        "for _ in range(3):\n    m(torch.randn(4, 8, device='cuda')).sum().backward(); o.step()\n")
    (tmp_path / "job.sh").write_text("#!/bin/bash\npython train.py\n")
    scratch_before = set(os.listdir(tmp_path / "tmp")) if (tmp_path / "tmp").exists() else set()
    r = probe_script(str(tmp_path / "job.sh"), submit_dir=str(tmp_path), keep_log=True)
    out, err = capfd.readouterr()
    assert r.estimate is not None, r.reason
    assert "10.65M" not in out and "noise" not in out and "noise" not in err
    assert "number of parameters: 10.65M" in r.log_text
    assert scratch_before == (set(os.listdir(tmp_path / "tmp")) if (tmp_path / "tmp").exists() else set())


def test_hanging_data_loader_falls_back_within_limit():
    t0 = time.monotonic()
    r = corpus("hang_loader", timeout_s=10)
    assert time.monotonic() - t0 < 20
    assert r.estimate is None
    assert "time limit of 10 s" in r.reason and "train.py" in r.reason and "__getitem__" in r.reason


def test_file_writing_script_writes_only_in_scratch(tmp_path, monkeypatch):
    d = os.path.join(CORPUS, "writes_files")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    before = tree(d)
    r = corpus("writes_files")
    assert r.estimate is not None, r.reason
    assert tree(d) == before  # nothing created or changed next to the script
    assert {"runs/exp1/config.json", "runs/exp1/train.log"} <= set(r.detail["scratch_files"])
    assert r.detail["outside_writes"] == []
    assert any(n.startswith("torch.save skipped") for n in r.detail["notes"])
    assert not [n for n in os.listdir(tmp_path) if n.startswith("coloc-probe-")]  # scratch removed


def test_writes_into_existing_subdirectories_stay_in_scratch(tmp_path, monkeypatch):
    """A run directory left by an earlier run: its files are linked in the mirror, written as copies."""
    job = tmp_path / "job"
    shutil.copytree(os.path.join(CORPUS, "writes_files"), job)
    run = job / "runs" / "exp1"
    run.mkdir(parents=True)
    (run / "config.json").write_text("{}\n")
    (run / "train.log").write_text("earlier run\n")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    before = [(p, open(os.path.join(job, p), "rb").read()) for p, _ in tree(job)]
    listing = tree(job)
    r = probe_script(str(job / "job.sh"), submit_dir=str(job), timeout_s=SLOW_S)
    assert r.estimate is not None, r.reason
    assert tree(job) == listing
    assert [(p, open(os.path.join(job, p), "rb").read()) for p, _ in tree(job)] == before
    assert r.detail["outside_writes"] == []
    assert {"runs/exp1/config.json", "runs/exp1/train.log"} <= set(r.detail["scratch_files"])


def test_missing_data_is_the_reason(tmp_path):
    job = tmp_path / "job.sh"
    job.write_text(f"python {CORPUS}/mnist_cnn/train.py --data {tmp_path}/no-such-dir\n")
    r = probe_script(str(job), submit_dir=str(tmp_path))
    assert r.estimate is None and r.reason.startswith("data missing")


def test_changed_user_module_invalidates_cache(tmp_path):
    (tmp_path / "helper.py").write_text("WIDTH = 64\n")
    (tmp_path / "train.py").write_text(
        "import torch\nfrom helper import WIDTH\nm = torch.nn.Linear(WIDTH, WIDTH).cuda()\n"
        "o = torch.optim.Adam(m.parameters())\n"
        "for _ in range(3):\n    m(torch.randn(2, WIDTH, device='cuda')).sum().backward(); o.step()\n")
    (tmp_path / "job.sh").write_text("python train.py\n")
    first = probe_script(str(tmp_path / "job.sh"), submit_dir=str(tmp_path))
    assert str(tmp_path / "helper.py") in first.detail["user_files"]
    assert probe_script(str(tmp_path / "job.sh"), submit_dir=str(tmp_path)).cached
    (tmp_path / "helper.py").write_text("WIDTH = 4096\n")
    third = probe_script(str(tmp_path / "job.sh"), submit_dir=str(tmp_path))
    assert not third.cached
    assert third.detail["peak_reserved_b"] > first.detail["peak_reserved_b"]


def test_no_command_reason(tmp_path):
    (tmp_path / "job.sh").write_text("#!/bin/bash\n./simulate --gpu\n")
    r = probe_script(str(tmp_path / "job.sh"), submit_dir=str(tmp_path))
    assert r.estimate is None and "no python" in r.reason


@pytest.mark.parametrize("name,optimizer,autocast,note", [
    ("lightning_mnist", "SGD", ["float16"], "Lightning Trainer: loggers, checkpointing"),
    ("hf_trainer", "AdamW", ["float16"], "Hugging Face TrainingArguments: save_strategy=no"),
    ("accelerate_cls", "AdamW", ["bfloat16"], ""),
    ("convnext_amp", "AdamW", ["float16"], ""),
])
def test_frameworks_probed_without_directives(name, optimizer, autocast, note, tmp_path, monkeypatch):
    pytest.importorskip({"lightning_mnist": "lightning", "hf_trainer": "transformers",
                         "accelerate_cls": "accelerate", "convnext_amp": "timm"}[name])
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    d = os.path.join(CORPUS, name)
    before = tree(d)
    r = corpus(name, timeout_s=120)
    assert r.estimate is not None, r.reason
    assert r.detail["optimizers"] == [optimizer] and r.detail["autocast"] == autocast
    assert r.detail["steps"] == 2 and r.detail["outside_writes"] == []
    assert not note or any(n.startswith(note) for n in r.detail["notes"]), r.detail["notes"]
    assert r.detail["scratch_files"] == [] and tree(d) == before


def test_torch_without_cpu_fp16_autocast_falls_back_with_reason():
    """Where CPU autocast lacks float16 (older torch), entering CUDA fp16 autocast ends the probe with a
    reason."""
    import subprocess

    code = (
        "import torch\n"
        "from slurm_coloc.probe.inject import cudaapi, fakecuda\n"
        "cudaapi.cpu_autocast_dtypes = lambda torch: ['bfloat16']\n"
        "class T: alloc = None\n"
        "st = fakecuda.ProbeState(T())\n"
        "got = []\n"
        "st.fail = got.append\n"
        "cudaapi.patch_autocast(torch, st)\n"
        "with torch.autocast('cuda', dtype=torch.bfloat16):\n    pass\n"
        "assert got == [], got\n"
        "with torch.autocast('cuda', dtype=torch.float16):\n    pass\n"
        "print(got[0])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "CPU autocast has no float16" in out.stdout and torch_version() in out.stdout


def torch_version():
    import torch

    return torch.__version__


def test_cuda_generator_and_capture_check_stay_off_the_driver(tmp_path):
    """``torch.Generator(device="cuda")`` (seeded synthetic data, as benchmarks/device/workloads.py does) and
    the optimizers' CUDA-graph capture check must not reach a real CUDA runtime: on a host with the NVIDIA
    driver but no visible device (the H100 machine's probe run) both raised ``cudaErrorNoDevice`` and the
    probe fell back."""
    (tmp_path / "train.py").write_text(
        "import torch\n"
        "dev = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
        "g = torch.Generator(device=dev).manual_seed(0)\n"
        "x = torch.randn((64, 512), device=dev, generator=g)\n"
        "m = torch.nn.Linear(512, 512).to(dev)\n"
        "opt = torch.optim.Adadelta(m.parameters())\n"
        "assert not torch.cuda.is_current_stream_capturing()\n"
        "for _ in range(3):\n"
        "    opt.zero_grad(); m(x).sum().backward(); opt.step()\n")
    (tmp_path / "job.sh").write_text("#!/bin/bash\npython train.py\n")
    r = probe_script(str(tmp_path / "job.sh"), submit_dir=str(tmp_path), use_cache=False)
    assert r.estimate is not None, r.reason
    assert "Adadelta" in r.ran


def test_data_beside_the_working_directory_is_read(tmp_path):
    """pytorch/examples' MNIST scripts read ``../data`` from their own folder: the probe's mirror of the
    working directory sits beside links to its siblings, so the data is found, and nothing is written
    there."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.txt").write_text("16\n")
    (tmp_path / "data" / "y.txt").write_text("4\n")
    proj = tmp_path / "mnist"
    proj.mkdir()
    (proj / "refs").mkdir()  # pytorch/vision's references/classification read ../../data
    (proj / "refs" / "train.py").write_text(
        "import torch\n"
        "n = int(open('../../data/y.txt').read())\n"
        "model = torch.nn.Linear(n, 4).cuda()\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(3):\n"
        "    model(torch.randn(8, n, device='cuda')).sum().backward()\n"
        "    opt.step()\n")
    (proj / "refs" / "job.sh").write_text("#!/bin/bash\npython train.py\n")
    (proj / "main.py").write_text(
        "import torch\n"
        "n = int(open('../data/x.txt').read())\n"
        "model = torch.nn.Linear(n, 4).cuda()\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(3):\n"
        "    model(torch.randn(8, n, device='cuda')).sum().backward()\n"
        "    opt.step()\n")
    (proj / "job.sh").write_text("#!/bin/bash\npython main.py\n")
    before = tree(tmp_path)
    r = probe_script(str(proj / "job.sh"), submit_dir=str(proj), use_cache=False)
    assert r.estimate is not None, r.reason
    assert r.detail["steps"] == 2 and r.detail["outside_writes"] == []
    deep = probe_script(str(proj / "refs" / "job.sh"), submit_dir=str(proj / "refs"), use_cache=False)
    assert deep.estimate is not None, deep.reason
    assert tree(tmp_path) == before

def test_probe_counts_the_flops_of_one_training_iteration(tmp_path):
    """Between the first two optimizer steps: one forward + backward + step of the MLP (analytic count),
    carried through the estimate and the probe cache."""
    (tmp_path / "train.py").write_text(
        "import torch\nfrom torch import nn\n"
        "model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 10)).cuda()\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for i in range(10):\n"
        "    x = torch.randn(64, 512, device='cuda')\n"
        "    y = torch.randint(0, 10, (64,), device='cuda')\n"
        "    opt.zero_grad()\n"
        "    nn.functional.cross_entropy(model(x), y).backward()\n"
        "    opt.step()\n")
    (tmp_path / "job.sh").write_text("#!/bin/bash\npython train.py\n")
    r = probe_script(str(tmp_path / "job.sh"), submit_dir=str(tmp_path))
    assert r.estimate is not None, r.reason
    fwd = [2 * 64 * 512 * 1024, 2 * 64 * 1024 * 10]
    # forward, weight gradients, and the input gradient of the second layer only (the data needs none)
    assert r.estimate.flops_per_step == r.detail["flops_per_step"] == 2 * sum(fwd) + fwd[1]
    again = probe_script(str(tmp_path / "job.sh"), submit_dir=str(tmp_path))
    assert again.cached and again.estimate.flops_per_step == r.estimate.flops_per_step
