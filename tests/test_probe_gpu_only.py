"""The probe fakes only the GPU: host tensors hold real values, evaluation work is bounded and measured.

Upstream failures, each as a small program of the same pattern: torchvision's RandomResizedCrop
reading ``torch.empty(1).uniform_(...).item()`` (pytorch/examples imagenet), numpy interop on CPU tensors
(examples/train_digits.py via scikit-learn), an evaluation loop of many no-grad batches before the first
optimizer step (nanoGPT's ``estimate_loss``: 2 x 200 batches), and an evaluation loader with a larger
batch (mnist's test pass).
"""
from __future__ import annotations

import os
import shutil
import textwrap

import pytest

from slurm_coloc.probe.probe import probe_script

pytestmark = pytest.mark.slow  # real probe/torch/subprocess work: left out of the fast command

MIB = 1 << 20
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


from tests.test_probe_cuda_paths import job_env  # noqa: E402,F401  (autouse: the job's PATH, a fresh cache)


def probe(tmp_path, name, body, *args):
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    job = tmp_path / f"{name}.sh"
    job.write_text(f"#!/bin/bash\n#SBATCH --gres=gpu:1\npython {name}.py {' '.join(args)}\n")
    return probe_script(str(job), submit_dir=str(tmp_path), use_cache=False, keep_log=True)


HOST_VALUES = """
    import numpy as np
    import torch, torch.nn as nn
    import torchvision.transforms as T
    u = torch.empty(1).uniform_(0.5, 1.0).item()
    if not 0.5 <= u <= 1.0:
        raise SystemExit(f"CPU RNG gave {u}")
    a = torch.randn(64, 3)
    if float(np.abs(a.numpy()).sum()) == 0.0 or torch.from_numpy(np.ones(3)).sum().item() != 3.0:
        raise SystemExit("numpy interop read no values")
    crop = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip()])
    model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 30 * 30, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        x = torch.stack([crop(torch.rand(3, 48, 48)) for _ in range(8)])
        if x.abs().sum().item() == 0.0:
            raise SystemExit("transforms produced no values")
        loss = nn.functional.cross_entropy(model(x.cuda()), torch.randint(0, 10, (8,)).cuda())
        opt.zero_grad()
        loss.backward()
        opt.step()
        if not loss.is_cuda or loss.cpu().dim() != 0:
            raise SystemExit("the loss left the GPU")
"""


def test_host_tensors_hold_real_values(tmp_path):
    r = probe(tmp_path, "host", HOST_VALUES)
    assert r.estimate is not None, (r.reason, r.log_text[-2000:])
    assert r.detail["steps"] >= 2


EVAL_FIRST = """
    import torch, torch.nn as nn
    model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(8)]).cuda()
    opt = torch.optim.AdamW(model.parameters())

    @torch.no_grad()
    def estimate_loss(iters):
        model.eval()
        losses = torch.zeros(iters)
        for k in range(iters):
            losses[k] = model(torch.randn(32, 256).cuda()).square().mean().item()
        model.train()
        return losses.mean()

    print("val", float(estimate_loss(int(__import__("sys").argv[1]))))
    for _ in range(3):
        loss = model(torch.randn(32, 256, device="cuda")).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_evaluation_loop_before_the_first_step_is_bounded(tmp_path):
    r = probe(tmp_path, "evalfirst", EVAL_FIRST, "400")
    assert r.estimate is not None, (r.reason, r.log_text[-2000:])
    notes = " ".join(r.detail["notes"])
    assert "398 repeated no-grad forward(s)" in notes
    short = probe(tmp_path, "evalfirst", EVAL_FIRST, "2")
    assert short.estimate is not None and "repeated" not in " ".join(short.detail["notes"])
    # the skipped repeats hold the memory the first two did: the figure does not change
    assert r.detail["peak_reserved_b"] == short.detail["peak_reserved_b"]


EVAL_LOADER = """
    import sys
    import torch, torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset
    model = nn.Sequential(nn.Linear(1024, 8192), nn.ReLU(), nn.Linear(8192, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ds = TensorDataset(torch.randn(512, 1024), torch.randint(0, 10, (512,)))
    train = DataLoader(ds, batch_size=16, shuffle=True)
    test = DataLoader(ds, batch_size=int(sys.argv[1]))
    for x, y in train:
        loss = nn.functional.cross_entropy(model(x.cuda()), y.cuda())
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_the_eval_loaders_batch_is_replayed(tmp_path):
    small = probe(tmp_path, "evalload", EVAL_LOADER, "16")
    big = probe(tmp_path, "evalload", EVAL_LOADER, "2048")
    assert small.estimate is not None and big.estimate is not None, (big.reason, big.log_text[-2000:])
    assert "evaluation pass replayed" in " ".join(big.detail["notes"])
    assert "evaluation pass replayed" not in " ".join(small.detail["notes"])
    # 2048 x 8192 fp32 hidden activations = 64 MiB (no-grad: not kept for a backward)
    assert big.detail["peak_reserved_b"] - small.detail["peak_reserved_b"] >= 60 * MIB


def test_the_projects_own_example_is_probed_without_directives(tmp_path, monkeypatch):
    shutil.copy(os.path.join(REPO, "examples", "train_digits.py"), tmp_path / "train_digits.py")
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --gres=gpu:1\npython train_digits.py --epochs 1\n")
    r = probe_script(str(script), submit_dir=str(tmp_path), use_cache=False, keep_log=True)
    assert r.estimate is not None, (r.reason, r.log_text[-2000:])
    assert "Adam" in r.ran


MODULE_TO_KWARGS = """
    import sys
    import torch, torch.nn as nn
    model = nn.Sequential(*[nn.Linear(4096, 4096) for _ in range(4)])
    if sys.argv[1] == "kw":
        model.to(device=torch.device("cuda"), dtype=None)   # timm's train.py
    else:
        model.to("cuda")
    opt = torch.optim.Adam(model.parameters())
    for _ in range(3):
        loss = model(torch.randn(8, 4096).to(device="cuda")).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_module_to_with_device_keyword_moves_the_parameters(tmp_path):
    kw = probe(tmp_path, "modto", MODULE_TO_KWARGS, "kw")
    pos = probe(tmp_path, "modto", MODULE_TO_KWARGS, "pos")
    assert kw.estimate is not None and pos.estimate is not None, (kw.reason, kw.log_text[-2000:])
    # 4 x 64 MiB of parameters, their gradients and Adam's two states: >= 1 GiB on the GPU
    assert kw.detail["peak_allocated_b"] >= 1024 * MIB
    assert kw.detail["peak_reserved_b"] == pos.detail["peak_reserved_b"]


INFERENCE_MODE_READ = """
    import torch, torch.nn as nn
    model = nn.Linear(16, 10).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        x, y = torch.randn(8, 16).cuda(), torch.randint(0, 10, (8,)).cuda()
        out = model(x)
        loss = nn.functional.cross_entropy(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.inference_mode():   # torchvision's references/classification utils.accuracy
            acc = out.argmax(1).eq(y).flatten().sum(dtype=torch.float32) * (100.0 / 8)
        print(f"acc {acc.item():.1f} loss {loss.item():.3f}")
"""


def test_value_read_of_an_inference_mode_tensor_after_a_step(tmp_path):
    r = probe(tmp_path, "infer", INFERENCE_MODE_READ)
    assert r.estimate is not None, (r.reason, r.log_text[-2000:])
    assert r.detail["steps"] >= 2


GENERATE = """
    import sys
    import torch, torch.nn as nn

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(65, 256)
            self.body = nn.Sequential(*[nn.Linear(256, 256) for _ in range(4)])
            self.head = nn.Linear(256, 65)

        def forward(self, idx, targets=None):
            logits = self.head(self.body(self.emb(idx)))
            if targets is None:
                return logits, None
            return logits, nn.functional.cross_entropy(logits.view(-1, 65), targets.view(-1))

    model = LM().cuda()
    opt = torch.optim.AdamW(model.parameters())
    n_new, big = int(sys.argv[1]), sys.argv[2] == "big"
    for it in range(3):
        x = torch.randint(0, 65, (32, 128)).cuda()
        _, loss = model(x, x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if it == 0:   # minGPT's chargpt: sample between the first two steps, the sequence growing
            model.eval()
            idx = torch.zeros((64 if big else 1, 4), dtype=torch.long).cuda()
            with torch.no_grad():
                for _ in range(n_new):
                    logits, _ = model(idx[:, -128:])
                    probs = torch.softmax(logits[:, -1, :], dim=-1)
                    idx = torch.cat((idx, torch.multinomial(probs, 1)), dim=1)
            if tuple(idx.shape) != ((64 if big else 1), 4 + n_new):
                raise SystemExit(f"generated {tuple(idx.shape)}")
            model.train()
"""


def test_a_generation_loop_is_answered_from_learned_shapes(tmp_path):
    short = probe(tmp_path, "gen", GENERATE, "2", "small")
    long = probe(tmp_path, "gen", GENERATE, "60", "small")
    for r in (short, long):
        assert r.estimate is not None, (r.reason, r.log_text[-2000:])
    notes = " ".join(long.detail["notes"])
    # 2 calls traced (sequence 4 and 5), the other 58 answered: the output (1, t, 65) follows the input (1, t)
    assert "58 no-grad forward(s) with inputs no larger than the training call's" in notes
    assert "within the replayed peak" in notes
    assert long.detail["peak_reserved_b"] == short.detail["peak_reserved_b"]


def test_a_generation_loop_larger_than_the_training_call_is_traced(tmp_path):
    # batch 64 > the training batch 32: not dominated, every call traced
    r = probe(tmp_path, "gen", GENERATE, "6", "big")
    assert r.estimate is not None, (r.reason, r.log_text[-2000:])
    assert "no larger than the training call" not in " ".join(r.detail["notes"])


DDP_UNDER_SLURM = """
    import os
    import torch, torch.nn as nn
    import torch.distributed as dist
    model = nn.Sequential(nn.Linear(2048, 4096), nn.ReLU(), nn.Linear(4096, 2048)).cuda()
    if "SLURM_PROCID" in os.environ:  # torchvision's references: a DDP group of the Slurm task
        dist.init_process_group("nccl", init_method="env://", world_size=1,
                                rank=int(os.environ["SLURM_PROCID"]))
        model = nn.parallel.DistributedDataParallel(model, device_ids=[0])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        loss = model(torch.randn(64, 2048).cuda()).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_batch_step_variables_and_ddp_gradient_buckets(tmp_path):
    """The probe sees the batch step's SLURM_PROCID, as the job does, so a script that starts DDP under Slurm
    is traced through DDP, and DDP's gradient buckets (one flat copy of the 16.8M trainable parameters, 64 MiB
    in float32) are counted: the estimate exceeds the same program's without DDP by at least that much."""
    with_ddp = probe(tmp_path, "ddp", DDP_UNDER_SLURM)
    assert with_ddp.estimate is not None, (with_ddp.reason, with_ddp.log_text[-2000:])
    assert any("gradient bucket" in n for n in with_ddp.detail.get("notes", [])), with_ddp.detail
    plain = probe(tmp_path, "plain", DDP_UNDER_SLURM.replace('"SLURM_PROCID" in os.environ', "False"))
    assert plain.estimate is not None, (plain.reason, plain.log_text[-2000:])
    params_mib = (2048 * 4096 * 2 + 4096 + 2048) * 4 / MIB
    assert with_ddp.estimate.mem_mib - plain.estimate.mem_mib >= params_mib * 0.99, (with_ddp.estimate,
                                                                                      plain.estimate)


def test_an_nccl_group_adds_its_communicators_memory(tmp_path):
    """An NCCL group's communicator holds GPU memory outside the caching allocator (564 MiB on the H100s,
    ``benchmarks/device/nccl_overhead.py``): the same DDP program estimates that much more with ``nccl`` (or
    no backend: torch picks NCCL for CUDA) than with ``gloo``, and says why."""
    from slurm_coloc.estimate.spec import gpu_model

    gloo = probe(tmp_path, "gloo", DDP_UNDER_SLURM.replace('"nccl"', '"gloo"'))
    nccl = probe(tmp_path, "nccl", DDP_UNDER_SLURM)
    default = probe(tmp_path, "default", DDP_UNDER_SLURM.replace('"nccl", ', ""))
    for r in (gloo, nccl, default):
        assert r.estimate is not None, (r.reason, r.log_text[-2000:])
    added = gpu_model("H100").nccl_mib
    assert added == 564
    assert nccl.estimate.mem_mib - gloo.estimate.mem_mib == added, (nccl.estimate, gloo.estimate)
    assert default.estimate.mem_mib == nccl.estimate.mem_mib
    assert nccl.estimate.detail["nccl_mib"] == added and "nccl_mib" not in gloo.estimate.detail
    assert any("NCCL group" in n for n in nccl.detail["notes"]) and not any("NCCL group" in n
                                                                            for n in gloo.detail["notes"])


@pytest.mark.parametrize("value", ["true", 1, "yes", None, {"nccl": True}, [True], 10 ** 300])
def test_a_result_file_with_a_garbage_nccl_group_adds_nothing(value):
    """The probe's result file is written by the user's program's process: only a JSON ``true`` adds the NCCL
    figure; any other value estimates as if the key were absent, without raising."""
    from slurm_coloc.probe.probe import estimate_from_result

    base = {"status": "ok", "peak_allocated_b": 10 ** 9, "peak_reserved_b": 10 ** 9}
    plain = estimate_from_result(base)
    assert estimate_from_result({**base, "nccl_group": value}) == plain
    assert estimate_from_result({**base, "nccl_group": True}).mem_mib == plain.mem_mib + 564
