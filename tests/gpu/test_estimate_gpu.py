"""Estimates against peaks measured on the real GPU (run on the device: pytest -m gpu).

Each case trains in a fresh Python process (the step of docs/estimator.md: zero_grad, forward,
cross-entropy, backward, optimizer step; 3 steps) and reports the device's used memory minus
the idle figure read before its CUDA context existed, i.e. NVML's view of that one process
(the test must be alone on the GPU). The estimate must not be below it and not above 2x it.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from slurm_coloc.estimate import ModelSpec, estimate_peak

pytestmark = pytest.mark.gpu

CHILD = textwrap.dedent("""
    import json, sys, torch
    from slurm_coloc.estimate.loader import load_callable
    from slurm_coloc.estimate.spec import ModelSpec
    spec = json.loads(sys.argv[1])
    idle = torch.cuda.device_memory_used(0)
    fn = load_callable(ModelSpec(spec["model"], (1,), 1))
    dev = torch.device("cuda")
    with dev:
        model = fn(**spec["kwargs"])
    model = model.to(dev).train()
    ps = [p for p in model.parameters() if p.requires_grad]
    opt = {"sgd": lambda: torch.optim.SGD(ps, lr=0.01),
           "sgd-momentum": lambda: torch.optim.SGD(ps, lr=0.01, momentum=0.9),
           "adam": lambda: torch.optim.Adam(ps), "adamw": lambda: torch.optim.AdamW(ps)}[spec["optimizer"]]()
    shape = (spec["batch_size"], *spec["input_shape"])
    x = (torch.randint(0, 100, shape, device=dev) if spec["input_dtype"] == "int64"
         else torch.randn(shape, device=dev))
    amp = spec["precision"] != "fp32"
    dt = torch.float16 if spec["precision"] == "amp-fp16" else torch.bfloat16
    scaler = torch.amp.GradScaler("cuda", enabled=spec["precision"] == "amp-fp16")
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dt, enabled=amp):
            out = model(x)
            out = out.reshape(-1, out.shape[-1]) if out.dim() > 2 else out
            loss = torch.nn.functional.cross_entropy(out, torch.zeros(out.shape[0], dtype=torch.long, device=dev))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    torch.cuda.synchronize()
    used = torch.cuda.device_memory_used(0)
    print(json.dumps({"nvml_mib": (used - idle) / 2**20,
                      "reserved_mib": torch.cuda.max_memory_reserved() / 2**20}))
""")

ZOO = str(Path(__file__).resolve().parents[2] / "benchmarks" / "estimator" / "zoo.py")
CASES = [
    ModelSpec("torchvision.models:resnet18", (3, 32, 32), 128, optimizer="sgd-momentum"),
    ModelSpec("torchvision.models:resnet50", (3, 224, 224), 32, optimizer="sgd"),
    ModelSpec("torchvision.models:mobilenet_v3_small", (3, 224, 224), 64, optimizer="adamw",
              precision="bf16"),
    ModelSpec(ZOO + ":mlp", (1024,), 512, kwargs={"in_features": 1024, "width": 2048,
              "depth": 4}, optimizer="adam"),
    ModelSpec(ZOO + ":transformer_lm", (256,), 16, kwargs={"vocab_size": 100,
              "d_model": 512, "n_layers": 6, "n_heads": 8, "max_len": 256}, input_dtype="int64",
              optimizer="adamw", precision="amp-fp16"),
]


@pytest.mark.parametrize("spec", CASES, ids=lambda s: f"{s.model.split(':')[1]}-{s.batch_size}-{s.precision}")
def test_estimate_bounds_measured_peak(spec: ModelSpec) -> None:
    est = estimate_peak(spec, "H100")
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec.to_json())],
                         capture_output=True, text=True, timeout=300, check=True)
    measured = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"\n{spec.model} bs={spec.batch_size} {spec.precision}: estimate {est.mem_mib} MiB "
          f"({est.method}), measured {measured['nvml_mib']:.0f} MiB, reserved {measured['reserved_mib']:.0f}")
    assert est.mem_mib >= measured["nvml_mib"], (est, measured)
    assert est.mem_mib <= 2 * measured["nvml_mib"], (est, measured)
