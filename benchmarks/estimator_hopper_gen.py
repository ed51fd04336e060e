#!/usr/bin/env python3
"""Generate the Hopper memory data set: train many small configurations, measure their peaks.

Run ON THE GPU MACHINE (one GPU, nothing else on it), e.g.::

    /opt/torch/.venv/bin/python3 -m benchmarks.estimator_hopper_gen \
        --out $OUT/hopper_runs.csv --have data/hopper/hopper_runs.csv --budget-s 540

A driver process (imports torch but never touches CUDA) forks one fresh child per *group*
(model, kwargs, input shape, optimizer, precision). The child, for each of the group's batch
sizes in ascending order, builds the model on the GPU, trains ``STEPS`` steps of forward,
cross-entropy, backward, optimizer step (``zero_grad(set_to_none=True)`` first; AMP fp16 =
autocast + GradScaler; bf16 = autocast bf16), synchronises and reports torch's peak reserved /
allocated; the driver then reads NVML's per-process used memory for the child. The model, the
optimizer and the tensors are freed and ``empty_cache()`` called before the next batch size,
so each row's allocator starts empty; ``seq_in_process`` says whether the row was the child's
first (0: a pristine process) or a later one. Rows are appended; config ids already in
``--have`` or ``--out`` are skipped (resumable). The config list is deterministic (``--seed``).

``--set paper18`` runs instead the GPUMemNet paper's 18 real (model, batch size) configs
(``benchmarks/estimator/zoo_paper.py``, ``paper18``: torchvision CNNs, Xception, Hugging Face BERT /
XLNet / GPT-2 from config; needs ``transformers``), one fresh child per config (all rows
``seq_in_process`` 0), family ``paper18``, group ids 900000+ (config id = group*16), e.g.::

    /opt/torch/.venv/bin/python3 -m benchmarks.estimator_hopper_gen --set paper18 \
        --out $OUT/paper18_runs.csv --have data/hopper/paper18_runs.csv --budget-s 500

``--set unseen`` runs 57 real-model configs (30, then 27 more) whose architectures no Hopper family and no paper18
config holds (``UNSEEN``: torchvision MaxViT, ResNet-152, DenseNet-201, VGG-19-BN, ConvNeXt-Base,
RegNetY-3.2GF, Inception-v3, Swin-S, ViT-L/16, EfficientNet-B4/V2-M, ... and Hugging Face Llama,
Mistral, Qwen2, GPT-NeoX, RoBERTa, DistilBERT, ALBERT, T5, ELECTRA, GPT-2, BERT built from config
by ``examples/hf_models.py``), one fresh child each, family ``unseen``, group ids 910000+.

(This is a script, not package code: the package's one NVML gateway is slurm_coloc/nvml.)
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import multiprocessing as mp
import os
import random
import sys
import time
from typing import Any, Dict, List

from benchmarks.estimator.zoo import builder

STEPS = 3
FIELDS = [
    "config_id", "family", "model", "kwargs_json", "input_shape", "input_dtype", "batch_size",
    "optimizer", "precision", "seq_in_process", "status", "nvml_mib", "torch_max_reserved_mib",
    "torch_max_allocated_mib", "torch_reserved_end_mib", "params", "step_ms", "nvml_source",
    "gpu_name", "driver", "torch_version", "error",
]
TV = "torchvision.models:"
OPTS = ["sgd", "sgd-momentum", "adam", "adamw"]
ACTS = ["relu", "gelu", "silu", "tanh", "leakyrelu", "elu", "softplus", "sigmoid", "mish"]
TV_FAMILIES = {
    "resnet": ["resnet18", "resnet34", "resnet50", "resnet101", "wide_resnet50_2", "resnext50_32x4d"],
    "vgg": ["vgg11", "vgg13", "vgg16", "vgg11_bn", "vgg16_bn"],
    "mobilenet": ["mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large", "mnasnet1_0"],
    "efficientnet": ["efficientnet_b0", "efficientnet_b1", "efficientnet_b2", "efficientnet_v2_s"],
    "densenet": ["densenet121", "densenet169"],
    "convnext": ["convnext_tiny", "convnext_small"],
    "regnet": ["regnet_y_400mf", "regnet_y_800mf", "regnet_x_400mf", "regnet_y_1_6gf"],
    "shufflenet": ["shufflenet_v2_x0_5", "shufflenet_v2_x1_0", "squeezenet1_0", "squeezenet1_1"],
    "vit": ["vit_b_16", "vit_b_32"],
    "swin": ["swin_t", "swin_v2_t"],
    "alexnet": ["alexnet", "googlenet"],
}


def _bs(rng: random.Random, lo: int, hi: int, k: int) -> List[int]:
    pool = sorted({int(2 ** rng.uniform(math.log2(lo), math.log2(hi)))
                   for _ in range(4 * k)})
    return sorted(rng.sample(pool, min(k, len(pool))))


def make_groups(seed: int, n: int) -> List[Dict[str, Any]]:
    """``n`` deterministic groups (dicts with family, model, kwargs, shape, dtype, batch sizes...)."""
    rng = random.Random(seed)
    fams = ["mlp", "cnn", "transformer", "seqenc"] + sorted(TV_FAMILIES)
    weights = [5, 4, 4, 2] + [1] * len(TV_FAMILIES)
    groups = []
    for gid in range(n):
        fam = rng.choices(fams, weights)[0]
        k = rng.choice([1, 2, 3, 4])
        g: Dict[str, Any] = {"group": gid, "family": fam, "optimizer": rng.choice(OPTS),
                             "precision": rng.choices(["fp32", "amp-fp16", "bf16"], [3, 2, 1])[0],
                             "input_dtype": "float32"}
        if fam == "mlp":
            fin = int(2 ** rng.uniform(5, 12))
            g.update(model="slurm_coloc.estimate.zoo:mlp", shape=[fin], kwargs=dict(
                in_features=fin, out_features=int(2 ** rng.uniform(1, 10)), depth=rng.randint(1, 10),
                width=int(2 ** rng.uniform(5, 12.5)), arch=rng.choice(["uniform", "pyramid"]),
                activation=rng.choice(ACTS), batchnorm=rng.random() < 0.3,
                dropout=rng.choice([0.0, 0.0, 0.2, 0.5])), batch_sizes=_bs(rng, 16, 4096, k))
        elif fam == "cnn":
            hw = rng.choice([28, 32, 32, 64, 96, 128, 224])
            c = rng.choice([1, 3])
            g.update(model="slurm_coloc.estimate.zoo:cnn", shape=[c, hw, hw], kwargs=dict(
                in_channels=c, num_classes=rng.choice([10, 100, 1000]), stages=rng.randint(2, 5),
                blocks=rng.randint(1, 3), base_channels=rng.choice([16, 32, 48, 64, 96]),
                kernel=rng.choice([3, 3, 5]), activation=rng.choice(ACTS[:6]),
                batchnorm=rng.random() < 0.7, dropout=rng.choice([0.0, 0.3])),
                batch_sizes=_bs(rng, 8, 1024 if hw <= 32 else (256 if hw <= 96 else 96), k))
        elif fam == "transformer":
            d = rng.choice([128, 192, 256, 384, 512, 768])
            t = rng.choice([64, 128, 256, 512, 1024])
            g.update(model="slurm_coloc.estimate.zoo:transformer_lm", shape=[t], input_dtype="int64",
                     kwargs=dict(vocab_size=rng.choice([1000, 5000, 8192, 16384, 32000]), d_model=d,
                                 n_layers=rng.randint(1, 8), n_heads=rng.choice([2, 4, 8]),
                                 ff_mult=rng.choice([2, 4]), dropout=rng.choice([0.0, 0.1]),
                                 activation=rng.choice(["relu", "gelu"]), max_len=t),
                     batch_sizes=_bs(rng, 2, max(4, 32768 // t), k))
        elif fam == "seqenc":
            t = rng.choice([16, 32, 64, 128, 256])
            dim = rng.choice([16, 64, 128, 512])
            g.update(model="slurm_coloc.estimate.zoo:seq_classifier", shape=[t, dim], kwargs=dict(
                in_dim=dim, num_classes=rng.choice([2, 10, 100]), d_model=rng.choice([64, 128, 256, 512]),
                n_layers=rng.randint(1, 6), n_heads=rng.choice([2, 4, 8]), ff_mult=rng.choice([2, 4]),
                dropout=0.1, activation=rng.choice(["relu", "gelu"])), batch_sizes=_bs(rng, 8, 512, k))
        else:
            name = rng.choice(TV_FAMILIES[fam])
            hw = 224 if fam in ("vit", "swin") else rng.choice([32, 64, 96, 128, 160, 224])
            if name in ("alexnet", "googlenet") and hw < 64:
                hw = 64
            kw: Dict[str, Any] = {"num_classes": rng.choice([10, 100, 1000])}
            if name == "googlenet":
                kw.update(aux_logits=False, init_weights=False)
            g.update(model=TV + name, shape=[3, hw, hw], kwargs=kw,
                     batch_sizes=_bs(rng, 2, 128 if hw >= 160 else 256, k))
        groups.append(g)
    return groups


PAPER18_GROUP0 = 900000  # paper18 group ids; the random set's are < --groups (6000)


UNSEEN_GROUP0 = 910000
_TV = "torchvision.models:"
_HF = "examples.hf_models:"
# (model, kwargs, per-sample shape, input dtype, batch size, optimizer, precision)
UNSEEN: List[tuple] = [
    (_TV + "maxvit_t", {}, [3, 224, 224], "float32", 32, "adamw", "fp32"),
    (_TV + "maxvit_t", {}, [3, 224, 224], "float32", 64, "adamw", "amp-fp16"),
    (_TV + "resnet152", {}, [3, 224, 224], "float32", 64, "sgd-momentum", "fp32"),
    (_TV + "resnet152", {}, [3, 224, 224], "float32", 128, "sgd-momentum", "bf16"),
    (_TV + "densenet201", {}, [3, 224, 224], "float32", 64, "adam", "fp32"),
    (_TV + "vgg19_bn", {}, [3, 224, 224], "float32", 64, "sgd-momentum", "fp32"),
    (_TV + "vgg19_bn", {}, [3, 224, 224], "float32", 128, "sgd-momentum", "amp-fp16"),
    (_TV + "convnext_base", {}, [3, 224, 224], "float32", 32, "adamw", "bf16"),
    (_TV + "convnext_base", {}, [3, 224, 224], "float32", 64, "adamw", "fp32"),
    (_TV + "regnet_y_3_2gf", {}, [3, 224, 224], "float32", 64, "sgd-momentum", "fp32"),
    (_TV + "shufflenet_v2_x2_0", {}, [3, 224, 224], "float32", 256, "sgd", "amp-fp16"),
    (_TV + "inception_v3", {"aux_logits": False, "init_weights": False}, [3, 299, 299], "float32", 64, "adam",
     "amp-fp16"),
    (_TV + "swin_s", {}, [3, 224, 224], "float32", 32, "adamw", "fp32"),
    (_TV + "vit_l_16", {}, [3, 224, 224], "float32", 16, "adamw", "bf16"),
    (_TV + "efficientnet_b4", {}, [3, 224, 224], "float32", 64, "adam", "fp32"),
    (_TV + "efficientnet_v2_m", {}, [3, 224, 224], "float32", 32, "adam", "amp-fp16"),
    (_TV + "mnasnet1_3", {}, [3, 224, 224], "float32", 128, "sgd-momentum", "fp32"),
    (_TV + "resnet18", {"num_classes": 10}, [3, 32, 32], "float32", 512, "sgd-momentum", "fp32"),
    (_TV + "wide_resnet101_2", {}, [3, 224, 224], "float32", 32, "sgd-momentum", "amp-fp16"),
    (_HF + "llama", {}, [512], "int64", 16, "adamw", "bf16"),
    (_HF + "mistral", {}, [1024], "int64", 8, "adamw", "fp32"),
    (_HF + "qwen2", {}, [256], "int64", 16, "adamw", "amp-fp16"),
    (_HF + "gpt_neox", {}, [512], "int64", 16, "adamw", "fp32"),
    (_HF + "roberta", {}, [256], "int64", 32, "adamw", "fp32"),
    (_HF + "distilbert", {}, [512], "int64", 32, "adamw", "amp-fp16"),
    (_HF + "albert", {}, [512], "int64", 16, "adamw", "fp32"),
    (_HF + "t5_encoder", {}, [512], "int64", 32, "adamw", "bf16"),
    (_HF + "electra", {}, [512], "int64", 32, "adamw", "fp32"),
    (_HF + "gpt2", {}, [1024], "int64", 8, "adamw", "amp-fp16"),
    (_HF + "bert", {}, [128], "int64", 64, "adamw", "fp32"),
    # second batch (2026-11-24, after the first 30 were scored): other batch sizes and precisions, two more archs
    (_TV + "maxvit_t", {}, [3, 224, 224], "float32", 16, "adamw", "bf16"),
    (_TV + "resnet152", {}, [3, 224, 224], "float32", 32, "sgd-momentum", "amp-fp16"),
    (_TV + "densenet201", {}, [3, 224, 224], "float32", 128, "adam", "amp-fp16"),
    (_TV + "vgg19_bn", {}, [3, 224, 224], "float32", 32, "sgd-momentum", "bf16"),
    (_TV + "convnext_base", {}, [3, 224, 224], "float32", 16, "adamw", "amp-fp16"),
    (_TV + "regnet_y_3_2gf", {}, [3, 224, 224], "float32", 128, "sgd-momentum", "amp-fp16"),
    (_TV + "inception_v3", {"aux_logits": False, "init_weights": False}, [3, 299, 299], "float32", 128, "adam", "fp32"),
    (_TV + "swin_s", {}, [3, 224, 224], "float32", 64, "adamw", "bf16"),
    (_TV + "vit_l_16", {}, [3, 224, 224], "float32", 32, "adamw", "fp32"),
    (_TV + "efficientnet_b4", {}, [3, 224, 224], "float32", 128, "adam", "bf16"),
    (_TV + "efficientnet_v2_m", {}, [3, 224, 224], "float32", 64, "adam", "fp32"),
    (_TV + "mnasnet1_3", {}, [3, 224, 224], "float32", 256, "sgd-momentum", "amp-fp16"),
    (_TV + "wide_resnet101_2", {}, [3, 224, 224], "float32", 64, "sgd-momentum", "fp32"),
    (_TV + "resnext101_32x8d", {}, [3, 224, 224], "float32", 32, "sgd-momentum", "fp32"),
    (_TV + "regnet_x_8gf", {}, [3, 224, 224], "float32", 64, "sgd-momentum", "bf16"),
    (_HF + "llama", {}, [1024], "int64", 8, "adamw", "fp32"),
    (_HF + "mistral", {}, [512], "int64", 16, "adamw", "bf16"),
    (_HF + "qwen2", {}, [512], "int64", 8, "adamw", "fp32"),
    (_HF + "gpt_neox", {}, [1024], "int64", 8, "adamw", "amp-fp16"),
    (_HF + "roberta", {}, [512], "int64", 16, "adamw", "bf16"),
    (_HF + "distilbert", {}, [256], "int64", 64, "adamw", "fp32"),
    (_HF + "albert", {}, [256], "int64", 32, "adamw", "amp-fp16"),
    (_HF + "t5_encoder", {}, [256], "int64", 64, "adamw", "fp32"),
    (_HF + "t5_encoder", {}, [512], "int64", 16, "adamw", "amp-fp16"),
    (_HF + "electra", {}, [256], "int64", 64, "adamw", "bf16"),
    (_HF + "gpt2", {}, [512], "int64", 16, "adamw", "fp32"),
    (_HF + "bert", {}, [512], "int64", 16, "adamw", "amp-fp16"),
]


def _one_config_groups(configs: List[Dict[str, Any]], group0: int, family: str) -> List[Dict[str, Any]]:
    """One group (one fresh child, ``seq_in_process`` 0) per config dict, ids ``group0 + i``."""
    return [{"group": group0 + i, "family": family, "model": c["model"], "kwargs": c["kwargs"],
             "shape": c["shape"], "input_dtype": c["input_dtype"], "optimizer": c["optimizer"],
             "precision": c["precision"], "batch_sizes": [c["batch_size"]]}
            for i, c in enumerate(configs)]


def unseen_groups() -> List[Dict[str, Any]]:
    """``UNSEEN`` as groups (one fresh child each, ids ``UNSEEN_GROUP0 + i``)."""
    keys = ("model", "kwargs", "shape", "input_dtype", "batch_size", "optimizer", "precision")
    return _one_config_groups([dict(zip(keys, u)) for u in UNSEEN], UNSEEN_GROUP0, "unseen")


def paper18_groups() -> List[Dict[str, Any]]:
    """The GPUMemNet paper's 18 real (model, batch size) configs (``estimator/zoo_paper.py``),
    one group (one fresh child, ``seq_in_process`` 0) each, ids ``PAPER18_GROUP0 + i``."""
    from benchmarks.estimator.zoo_paper import paper18

    return _one_config_groups(paper18(), PAPER18_GROUP0, "paper18")


def _child(g: Dict[str, Any], conn: Any) -> None:
    """Runs in a forked process: train each batch size, report torch figures, wait for the ack."""
    import torch

    fn = builder(g["model"])
    dev = torch.device("cuda")
    torch.cuda.init()
    for seq, bs in enumerate(g["batch_sizes"]):
        rec: Dict[str, Any] = {"batch_size": bs, "seq_in_process": seq}
        try:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            with torch.device(dev):
                model = fn(**g["kwargs"])
            model = model.to(dev).train()
            params = [p for p in model.parameters() if p.requires_grad]
            rec["params"] = sum(p.numel() for p in params)
            o = g["optimizer"]
            if o == "sgd":
                opt = torch.optim.SGD(params, lr=0.01)
            elif o == "sgd-momentum":
                opt = torch.optim.SGD(params, lr=0.01, momentum=0.9)
            elif o == "adam":
                opt = torch.optim.Adam(params, lr=1e-3)
            else:
                opt = torch.optim.AdamW(params, lr=1e-3)
            shape = (bs, *g["shape"])
            if g["input_dtype"] == "int64":
                vocab = g["kwargs"].get("vocab_size") or g["kwargs"].get("vocab") or 1000
                x = torch.randint(0, vocab, shape, device=dev)
            else:
                x = torch.randn(shape, device=dev)
            amp = g["precision"] != "fp32"
            dt = torch.float16 if g["precision"] == "amp-fp16" else torch.bfloat16
            scaler = torch.amp.GradScaler("cuda", enabled=g["precision"] == "amp-fp16")
            t0 = 0.0
            for step in range(STEPS):
                if step == 1:
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                opt.zero_grad(set_to_none=True)
                with torch.autocast("cuda", dtype=dt, enabled=amp):
                    out = model(x)
                    if hasattr(out, "logits"):  # Hugging Face ModelOutput
                        out = out.logits
                    if isinstance(out, (tuple, list)):
                        out = out[0]
                    logits = out.reshape(-1, out.shape[-1]) if out.dim() > 2 else out
                    y = torch.randint(0, logits.shape[-1], (logits.shape[0],), device=dev)
                    loss = torch.nn.functional.cross_entropy(logits, y)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                del out, logits, loss, y
            torch.cuda.synchronize()
            rec["step_ms"] = round((time.perf_counter() - t0) * 1000 / (STEPS - 1), 2)
            rec.update(status="ok", torch_max_reserved_mib=torch.cuda.max_memory_reserved() / 2**20,
                       torch_max_allocated_mib=torch.cuda.max_memory_allocated() / 2**20,
                       torch_reserved_end_mib=torch.cuda.memory_reserved() / 2**20)
            conn.send(rec)
            conn.recv()  # driver has read NVML
            del model, opt, params, x
        except torch.OutOfMemoryError as exc:
            rec.update(status="oom", error=str(exc).splitlines()[0][:120])
            conn.send(rec)
            conn.recv()
            break
        except Exception as exc:  # record and stop this group
            rec.update(status="error", error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
            conn.send(rec)
            conn.recv()
            break
    conn.send(None)


def _nvml_mib(pynvml: Any, handle: Any, pid: int, baseline_mib: float) -> tuple:
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    for p in procs:
        if p.pid == pid and p.usedGpuMemory:
            return p.usedGpuMemory / 2**20, "process"
    if len(procs) == 1 and procs[0].usedGpuMemory:
        return procs[0].usedGpuMemory / 2**20, "only-process"
    return pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20 - baseline_mib, "device-minus-idle"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--have", default="data/hopper/hopper_runs.csv")
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--groups", type=int, default=6000)
    ap.add_argument("--budget-s", type=float, default=540)
    ap.add_argument("--child-timeout-s", type=float, default=None,
                    help="seconds a child may take per row (default 90; 240 for --set paper18)")
    ap.add_argument("--set", choices=["random", "paper18", "unseen"], default="random",
                    help="random: the seeded groups; paper18: the GPUMemNet paper's 18 real models; "
                         "unseen: 57 real-model configs of architectures in no other set")
    args = ap.parse_args()
    if args.child_timeout_s is None:
        args.child_timeout_s = 90.0 if args.set == "random" else 240.0
    start = time.time()
    import pynvml
    import torch
    import torchvision.models  # noqa: F401  imported before fork so children start fast

    import benchmarks.estimator.zoo  # noqa: F401
    import benchmarks.estimator.zoo_paper  # noqa: F401
    if args.set in ("paper18", "unseen"):
        # the BERT/GPT-2/XLNet builders' classes, imported before fork like torchvision's
        from transformers import BertForMaskedLM, GPT2LMHeadModel, XLNetForSequenceClassification  # noqa: F401

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    gpu = pynvml.nvmlDeviceGetName(h)
    gpu = gpu.decode() if isinstance(gpu, bytes) else gpu
    drv = pynvml.nvmlSystemGetDriverVersion()
    drv = drv.decode() if isinstance(drv, bytes) else drv
    baseline = pynvml.nvmlDeviceGetMemoryInfo(h).used / 2**20
    done = set()
    for path in (args.have, args.out):
        if os.path.isfile(path):
            with open(path, newline="") as fh:
                done |= {int(r["config_id"]) // 16 for r in csv.DictReader(fh)}
    new = not os.path.isfile(args.out)
    fh = open(args.out, "a", newline="")
    w = csv.DictWriter(fh, FIELDS)
    if new:
        w.writeheader()
    ctx = mp.get_context("fork")
    n_rows = n_groups = 0
    make = {"paper18": paper18_groups, "unseen": unseen_groups}.get(
        args.set, lambda: make_groups(args.seed, args.groups))
    todo = make()
    for g in todo:
        if g["group"] in done:
            continue
        if time.time() - start > args.budget_s:
            break
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_child, args=(g, child))
        p.start()
        n_groups += 1
        while True:
            if not parent.poll(args.child_timeout_s):
                p.kill()
                break
            rec = parent.recv()
            if rec is None:
                break
            nv, src = (None, "")
            if rec["status"] == "ok":
                nv, src = _nvml_mib(pynvml, h, p.pid, baseline)
            parent.send(True)
            row = {"config_id": g["group"] * 16 + rec["seq_in_process"], "family": g["family"],
                   "model": g["model"], "kwargs_json": json.dumps(g["kwargs"], sort_keys=True),
                   "input_shape": ",".join(map(str, g["shape"])), "input_dtype": g["input_dtype"],
                   "optimizer": g["optimizer"], "precision": g["precision"], "nvml_mib": nv,
                   "nvml_source": src, "gpu_name": gpu, "driver": drv, "torch_version": torch.__version__}
            row.update({k: v for k, v in rec.items() if k in FIELDS})
            w.writerow(row)
            n_rows += 1
        p.join(5)
        fh.flush()
    fh.close()
    print(f"groups {n_groups} rows {n_rows} in {time.time() - start:.0f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
