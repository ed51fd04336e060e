"""FLOPs of one training step: counted in the estimator's trace, carried in the job comment, read by the
placer.

Real PyTorch (meta and fake tensors), the real comment builder and parser, the packaged calibration.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_coloc.comment import JobComment, parse_comment
from slurm_coloc.config import Config
from slurm_coloc.estimate import cache
from slurm_coloc.estimate.combine import traced_estimate
from slurm_coloc.estimate.decision import explain_lines
from slurm_coloc.estimate.spec import Estimate, ModelSpec
from slurm_coloc.estimate.trace import trace_spec
from slurm_coloc.placement import intensity
from slurm_coloc.submit.directives import parse_script
from slurm_coloc.submit.plan import build_plan
from slurm_coloc.submit.request import split_command_line

jc = JobComment.from_fields  # a coloc JSON object as the placer reads it

MLP_FILE = '''
import torch
from torch import nn


def mlp(width=256, depth=3, classes=10, inp=64):
    layers, d = [], inp
    for _ in range(depth):
        layers += [nn.Linear(d, width), nn.ReLU()]
        d = width
    return nn.Sequential(*layers, nn.Linear(d, classes))


class Concat(nn.Module):
    """Layers that take lists of tensors (DenseNet-like): module inputs are many tensors."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(32, 32)
        self.b = nn.Linear(64, 32)
        self.c = nn.Linear(96, 10)

    def forward(self, x):
        y = torch.relu(self.a(x))
        z = torch.relu(self.b(torch.cat([x, y], 1)))
        return self.c(torch.cat([x, y, z], 1))


def concat():
    return Concat()
'''


@pytest.fixture()
def model_file(tmp_path: Path) -> Path:
    p = tmp_path / "models.py"
    p.write_text(MLP_FILE)
    return p


def mlp_flops(batch: int, dims: list) -> int:
    """Analytic FLOPs of one step of an MLP with Linear layers ``dims[i] -> dims[i+1]``: forward
    2*in*out*batch per Linear; backward the weight gradient (same) and the input gradient (same) except for
    the first Linear, whose input (the data) needs none. Optimizer and element-wise ops count 0 in torch's
    formulas."""
    per = [2 * batch * a * b for a, b in zip(dims, dims[1:])]
    return sum(per) * 3 - per[0]


@pytest.mark.parametrize("precision", ["fp32", "amp-fp16"])
def test_mlp_flops_equal_the_analytic_count(model_file: Path, precision: str) -> None:
    spec = ModelSpec(model=f"{model_file}:mlp", kwargs={"width": 128, "depth": 2, "inp": 48},
                     input_shape=(48,),
                     batch_size=16, optimizer="adam", precision=precision)
    got = trace_spec(spec).flops_per_step
    # 2*16*(48*128 + 128*128 + 128*10) = 761,856 forward; x3, less the first layer's input gradient (196,608)
    assert got == mlp_flops(16, [48, 128, 128, 10]) == 2_088_960
    assert trace_spec(spec, count_flops=False).flops_per_step is None


@pytest.mark.slow
@pytest.mark.parametrize("model,kwargs,shape,batch,precision", [
    ("models.py:mlp", {}, (64,), 32, "fp32"),
    ("models.py:concat", {}, (32,), 8, "fp32"),  # module inputs of several tensors (DenseNet-like)
    ("torchvision.models:resnet18", {"num_classes": 10}, (3, 32, 32), 8, "fp32"),
    ("torchvision.models:resnet18", {"num_classes": 10}, (3, 32, 32), 8, "amp-fp16"),
    ("torchvision.models:densenet121", {"num_classes": 10}, (3, 32, 32), 2, "fp32"),
    ("torchvision.models:VisionTransformer",
     {"image_size": 32, "patch_size": 8, "num_layers": 2, "num_heads": 2,
                                              "hidden_dim": 64, "mlp_dim": 128, "num_classes": 10},
                                              (3, 32, 32), 4,
     "bf16"),
])
def test_memory_estimate_unchanged_by_flop_counting(model_file: Path, model, kwargs, shape, batch,
                                                    precision) -> None:
    spec = ModelSpec(model=model, kwargs=kwargs, input_shape=shape, batch_size=batch, optimizer="adamw",
                     precision=precision, base_dir=str(model_file.parent))
    on, off = trace_spec(spec), trace_spec(spec, count_flops=False)
    assert on.flops_per_step and on.flops_per_step > 0 and off.flops_per_step is None
    assert (on.peak_allocated_b, on.peak_reserved_b, on.ops, on.conv_workspace_max_b) == \
        (off.peak_allocated_b, off.peak_reserved_b, off.ops, off.conv_workspace_max_b)
    est = traced_estimate(spec, "H100")
    assert est.flops_per_step == on.flops_per_step
    assert est.mem_mib > 0 and est.detail["trace_floor_mib"] > 0


@pytest.mark.slow
def test_plain_flop_counter_with_module_tracker_would_change_densenet_memory(monkeypatch) -> None:
    """Why the trace drops FlopCounterMode's ModuleTracker: with it, DenseNet's replayed peak moves."""
    import torch.utils.flop_counter as fc

    from slurm_coloc.estimate import trace

    spec = ModelSpec(model="torchvision.models:densenet121", kwargs={"num_classes": 1000},
                     input_shape=(3, 224, 224), batch_size=32, optimizer="sgd-momentum")
    ours = trace_spec(spec)
    monkeypatch.setattr(trace, "make_flop_counter", lambda: fc.FlopCounterMode(display=False))
    plain = trace_spec(spec)
    assert plain.flops_per_step == ours.flops_per_step
    assert plain.peak_reserved_b != ours.peak_reserved_b or plain.peak_allocated_b != ours.peak_allocated_b


def test_cache_keeps_flops_and_reads_old_entries_as_none(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache.store("k", Estimate(mem_mib=900, method="analytic", gpu_model="H100", flops_per_step=123_456))
    got = cache.lookup("k")
    assert got is not None and got.flops_per_step == 123_456 and got.mem_mib == 900
    path = Path(cache.cache_path())
    data = json.loads(path.read_text())
    del data["entries"]["k"]["flops_per_step"]  # an entry written before FLOPs were counted
    path.write_text(json.dumps(data))
    old = cache.lookup("k")
    assert old is not None and old.mem_mib == 900 and old.flops_per_step is None


def test_comment_carries_flops_and_the_placer_reads_them(tmp_path: Path, model_file: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/sh\n#COLOC model={model_file}:mlp input=64 batch=32 optimizer=sgd\npython3 "
                      "t.py\n")
    cmd = split_command_line([str(script)])
    parsed = parse_script(str(script))
    plan = build_plan(cmd, parsed, Config(gpu_mem_gib=80, headroom_mib=256),
                      lambda spec, gpu: traced_estimate(spec, gpu))
    flops = trace_spec(parsed.spec).flops_per_step
    assert flops == mlp_flops(32, [64, 256, 256, 256, 10])
    text = next(a for a in plan.argv(None) if a.startswith("--comment="))
    coloc = parse_comment(text)
    assert coloc is not None and coloc["flops_per_step"] == flops and isinstance(coloc["flops_per_step"], int)
    f = intensity.features(jc(coloc))
    assert f.gflop_per_step == pytest.approx(flops / 1e9) and not f.from_proxy
    without = intensity.features(jc({k: v for k, v in coloc.items() if k != "flops_per_step"}))
    assert without.from_proxy and without.gflop_per_step == pytest.approx(32 * 64 * 3e-6)
    assert any("GFLOP per training step" in line for line in explain_lines(plan.decision))


def test_predictor_uses_flops_over_the_proxy() -> None:
    """A transformer's proxy is ~0 (one id per token) though it ran at 87 % SM activity alone
    (h100-placement-passes): with counted FLOPs (BERT-base, batch 16, 256 tokens: 2,223 GFLOP per step) the
    prediction is high."""
    cal = intensity.load_calibration()
    spec = {"model": "bert", "input_shape": [256], "batch_size": 16, "precision": "fp32"}
    proxy = intensity.predict(intensity.features(jc({"spec": spec})), cal)
    counted = intensity.predict(intensity.features(jc({"spec": spec, "flops_per_step": 2_222_702_346_240})),
                                cal)
    assert proxy.smact < 0.2 < 0.7 < counted.smact
