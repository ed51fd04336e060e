#!/usr/bin/env python3
"""Does one convolution-size feature explain what the trace misses (cuDNN workspace)? A negative result kept.

For every Hopper row of a convolutional family, builds the model on the meta device, runs one forward with hooks
and takes, over the non-depthwise ``Conv2d`` layers: the largest input, the largest output, the largest and the
summed im2col size (C_in/groups x k x k x H_out x W_out x batch), the largest input of a k > 1 convolution, all in
bytes (fp32; halved for AMP/bf16 rows). Then prints, per family and feature, the correlation with the residual
``torch max reserved - replayed reserved`` (MiB) and the median and p95 of residual / feature::

    .venv/bin/python -W ignore benchmarks/estimator_conv_probe.py      # ~10 min on 2 cores (1,553 rows)

Result 2026-11-23 (3,089 rows; docs/estimator.md "cnn"): within the generated cnn family the largest conv input
correlates at +0.92, but residual / feature has a median of 0.3 (resnet) to 9.8 (convnext) across families and a
p95 of 9 to 100+, so no single coefficient transfers from the training families to unseen ones: not used.
"""
from __future__ import annotations

import csv
import importlib
import json
import os
import sys
from typing import Dict, List

import numpy as np
import torch

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from slurm_coloc.estimate import train  # noqa: E402

FAMILIES = ("cnn", "vgg", "resnet", "densenet", "alexnet", "convnext", "regnet", "efficientnet", "mobilenet",
            "shufflenet")
KEYS = ("max_in_b", "max_out_b", "max_im2col_b", "sum_im2col_b", "max_k3_in_b")


def conv_features(row: Dict[str, str]) -> Dict[str, int]:
    """The five conv-size features (bytes at fp32) of one data-set row's model and batch."""
    mod, attr = row["model"].split(":")
    fn = getattr(importlib.import_module(mod), attr)
    kw = json.loads(row["kwargs_json"])
    try:
        with torch.device("meta"):
            model = fn(**kw)
    except Exception:  # builders that compute on tensors at build time (regnet): build on CPU, then move
        model = fn(**kw).to("meta")
    st = dict.fromkeys(KEYS, 0)

    def hook(m: torch.nn.Module, inp: tuple, out: torch.Tensor) -> None:
        if isinstance(m, torch.nn.Conv2d) and not (m.groups > 1 and m.groups == m.in_channels):
            k = m.kernel_size[0] * m.kernel_size[1]
            col = (m.in_channels // m.groups) * k * out.shape[-1] * out.shape[-2] * out.shape[0] * 4
            st["max_in_b"] = max(st["max_in_b"], inp[0].numel() * 4)
            st["max_out_b"] = max(st["max_out_b"], out.numel() * 4)
            st["max_im2col_b"] = max(st["max_im2col_b"], col)
            st["sum_im2col_b"] += col
            if k > 1:
                st["max_k3_in_b"] = max(st["max_k3_in_b"], inp[0].numel() * 4)

    for m in model.modules():
        if not list(m.children()):
            m.register_forward_hook(hook)
    shape = (int(row["batch_size"]), *[int(d) for d in row["input_shape"].split(",")])
    with torch.no_grad():
        model(torch.empty(shape, device="meta"))
    return st


def main() -> int:
    with open(os.path.join(train.HOPPER_DIR, "hopper_runs.csv"), newline="") as fh:
        runs = {r["config_id"]: r for r in csv.DictReader(fh) if r["family"] in FAMILIES}
    rows = [r for r in train.load_hopper() if r["config_id"] in runs]
    feats = {r["config_id"]: conv_features(runs[r["config_id"]]) for r in rows}
    for key in KEYS:
        for fam in FAMILIES:
            xs: List[float] = []
            ys: List[float] = []
            for r in rows:
                if r["family"] != fam:
                    continue
                x = feats[r["config_id"]][key] / 2**20
                xs.append(x / 2 if r["precision"] != "fp32" else x)
                ys.append(r["torch_reserved_mib"] - r["sim_reserved_mib"])
            x_a, y_a = np.array(xs), np.array(ys)
            if len(x_a) < 5:
                continue
            big = x_a > 50
            med = float(np.median(y_a[big] / x_a[big])) if big.any() else float("nan")
            print(f"{key:14s} {fam:12s} n={len(x_a):4d} corr={np.corrcoef(x_a, y_a)[0, 1]:+.2f} "
                  f"median resid/x={med:+.2f} p95 resid/x={np.quantile(y_a / np.maximum(x_a, 1), 0.95):+.2f}")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
