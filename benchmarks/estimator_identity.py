#!/usr/bin/env python3
"""Check that the estimator's traced figures have not changed (guard for speed work on issue 3).

Traces a fixed selection of Hopper configs (``data/hopper/hopper_runs.csv``: the fastest row of every
(model, precision) pair, then the fastest of those, ResNet-50 and every family always included) and compares every
traced field with ``data/hopper/hopper_traces.csv`` (peak allocated/reserved bytes, params, bytes,
activations, layer counts, activation, depthwise input size); fp32 rows run first, and each line
says whether ``torch._dynamo`` was imported by then (``no-dynamo``: the trace ran with the
``lazyimports`` stand-ins). ``--save`` writes the full estimate
(``combine.traced_estimate``: figure and detail) of each row; ``--compare`` checks a later run
against such a file, so "before" and "after" a change are compared bit for bit.

    .venv/bin/python -W ignore -m benchmarks.estimator_identity --n 30 --save /tmp/before.json
    .venv/bin/python -W ignore -m benchmarks.estimator_identity --n 30 --compare /tmp/before.json

Exit status 1 on any difference.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

from benchmarks.estimator.features import COUNT_KEYS
from benchmarks.estimator_featurize import spec_of

REPO = Path(__file__).resolve().parents[1]


def select(n: int) -> list:
    """``n`` (config row, trace row) pairs: one per (model, precision), fastest traces first."""
    with open(REPO / "data/hopper/hopper_runs.csv", newline="") as fh:
        runs = {r["config_id"]: r for r in csv.DictReader(fh) if r["status"] == "ok"}
    with open(REPO / "data/hopper/hopper_traces.csv", newline="") as fh:
        traces = [t for t in csv.DictReader(fh) if not t["error"] and t["config_id"] in runs]
    best: dict = {}
    for t in traces:
        r = runs[t["config_id"]]
        key = (r["model"], r["precision"])
        if key not in best or float(t["trace_s"]) < float(best[key][1]["trace_s"]):
            best[key] = (r, t)
    ranked = sorted(best.values(), key=lambda rt: float(rt[1]["trace_s"]))
    picked = ranked[:n]
    if not any(r["model"].endswith(":resnet50") for r, _ in picked):
        picked.append(best[("torchvision.models:resnet50", "fp32")])
    for fam in sorted({r["family"] for r, _ in ranked} - {r["family"] for r, _ in picked}):
        picked.append(next(rt for rt in ranked if rt[0]["family"] == fam))  # every family at least once
    return picked


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=30, help="configs to trace (default 30)")
    ap.add_argument("--save", help="write the estimates (JSON) here")
    ap.add_argument("--compare", help="compare the estimates with this earlier --save file")
    args = ap.parse_args()
    from slurm_coloc.estimate.combine import traced_estimate
    from slurm_coloc.estimate.trace import trace_spec

    bad, out = 0, {}
    # fp32 rows first: their traces keep torch._dynamo unimported (loader.py) only until an
    # AMP trace (FakeTensorMode) has imported it for real, so this order checks the fast path
    for r, t in sorted(select(args.n), key=lambda rt: rt[0]["precision"] != "fp32"):
        spec = spec_of(r)
        t0 = time.perf_counter()
        tr = trace_spec(spec)
        got = {"sim_peak_allocated_b": tr.peak_allocated_b, "sim_peak_reserved_b": tr.peak_reserved_b,
               "params": tr.params, "param_b": tr.param_b, "acts_per_sample": tr.activations_per_sample,
               "depth": tr.layer_counts["leaf"], "activation": tr.activation_fn,
               "depthwise_max_hw": tr.depthwise_max_hw, **{f"n_{k}": tr.layer_counts[k] for k in COUNT_KEYS}}
        dt = time.perf_counter() - t0
        diffs = [f"{k} {got[k]!r} != {t[k]!r}" for k in got
                 if (float(t[k]) != float(got[k]) if k not in ("activation",) else t[k] != got[k])]
        est = traced_estimate(spec, "H100")
        out[r["config_id"]] = {"mem_mib": est.mem_mib, "detail": est.detail}
        bad += bool(diffs)
        dyn = "dynamo" if "torch._dynamo" in sys.modules else "no-dynamo"
        print(f"{r['config_id']:>4} {r['model'].split(':')[1]:<22} {r['precision']:<8} bs {r['batch_size']:>4} "
              f"{dt:6.2f} s {dyn:<9}  {'SAME' if not diffs else 'DIFF ' + '; '.join(diffs)}")
    if args.save:
        Path(args.save).write_text(json.dumps(out, sort_keys=True, indent=1))
    if args.compare:
        before = json.loads(Path(args.compare).read_text())
        for cid, est in out.items():
            if cid in before and before[cid] != est:
                bad += 1
                print(f"{cid}: estimate changed: {before[cid]} -> {est}")
        missing = sorted(set(before) - set(out))
        print(f"compared {len(set(before) & set(out))} estimates with {args.compare}"
              + (f" ({len(missing)} not traced now)" if missing else ""))
    print(f"{len(out)} configs traced, {bad} with differences")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
