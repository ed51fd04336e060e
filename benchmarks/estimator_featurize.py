#!/usr/bin/env python3
"""Trace every Hopper row's spec on this machine (meta/fake tensors) and cache the results.

    .venv/bin/python -m benchmarks.estimator_featurize data/hopper/hopper_runs.csv data/hopper/hopper_traces.csv

Writes one row per config_id with the traced figures (sim peak allocated/reserved, params,
activations per sample, layer counts, dominant activation). Resumable: skips ids already there.
"""
from __future__ import annotations

import csv
import json
import os
import sys
import time

from benchmarks.estimator.features import COUNT_KEYS
from benchmarks.estimator.zoo import model_ref
from slurm_coloc.errors import EstimateError
from slurm_coloc.estimate.spec import ModelSpec
from slurm_coloc.estimate.trace import trace_spec

FIELDS = ["config_id", "sim_peak_allocated_b", "sim_peak_reserved_b", "params", "param_b",
          "acts_per_sample", "depth", "activation", "trace_s", "error", "depthwise_max_hw"] + [
              f"n_{k}" for k in COUNT_KEYS]


def spec_of(row: dict) -> ModelSpec:
    """The ModelSpec a data-set row describes."""
    return ModelSpec(model=model_ref(row["model"]), kwargs=json.loads(row["kwargs_json"]),
                     input_shape=tuple(int(d) for d in row["input_shape"].split(",")),
                     input_dtype=row["input_dtype"], batch_size=int(row["batch_size"]),
                     optimizer=row["optimizer"], precision=row["precision"])


def main() -> int:
    src, dst = sys.argv[1], sys.argv[2]
    have = set()
    if os.path.isfile(dst):
        with open(dst, newline="") as fh:
            have = {r["config_id"] for r in csv.DictReader(fh)}
    out = open(dst, "a", newline="")
    w = csv.DictWriter(out, FIELDS)
    if not have:
        w.writeheader()
    with open(src, newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["status"] == "ok" and r["config_id"] not in have]
    for r in rows:
        t0 = time.time()
        rec = {"config_id": r["config_id"]}
        try:
            tr = trace_spec(spec_of(r))
            rec.update(sim_peak_allocated_b=tr.peak_allocated_b, sim_peak_reserved_b=tr.peak_reserved_b,
                       params=tr.params, param_b=tr.param_b, acts_per_sample=tr.activations_per_sample,
                       depth=tr.layer_counts["leaf"], activation=tr.activation_fn,
                       depthwise_max_hw=tr.depthwise_max_hw,
                       **{f"n_{k}": tr.layer_counts[k] for k in COUNT_KEYS})
        except EstimateError as exc:
            rec["error"] = exc.one_line()
        rec["trace_s"] = round(time.time() - t0, 3)
        w.writerow(rec)
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
