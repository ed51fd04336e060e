#!/usr/bin/env python3
"""List the convolution calls whose cuDNN workspace the H100 should measure (issue 3).

    .venv/bin/python -W ignore -m benchmarks.estimator_conv_calls --out benchmarks/device/conv_calls.jsonl

Three sources, each call tagged with where it came from (``srcs``) so that an evaluation can leave
the calls of held-out families out of the table (``benchmarks/estimator_eval.py``):

1. ``hopper:<family>`` / ``paper18``: every convolution call (forward and backward, as traced
   by ``trace.py``) of every Hopper data-set row and of the GPUMemNet paper's 18 real models. Each
   (model, kwargs, input shape, precision) is traced once at batch 2 and the calls are scaled to
   the row's batch sizes (the conv batch dimension is proportional to the job's).
2. ``grid``: the same layer geometries at batch sizes 1..256 (powers of 4), so that a batch size
   never measured is interpolated on its own layer.
3. ``random``: random 2-D layer geometries (channels 8..2048, kernels 1-7, strides 1-2, depthwise
   and grouped, 4..320 px, batch 1..256, fp32/fp16/bf16; fixed seed), which the nearest-neighbour
   fallback of ``workspace.py`` uses for layers that are in no table.

Output: one JSON object per line (``convcall.ConvCall.to_json`` plus ``srcs``), ordered so that the
device script, which stops at its time budget, measures the most useful calls first.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import random
import sys
import time
from typing import Dict, List, Tuple

from benchmarks.estimator.zoo import model_ref
from slurm_coloc.errors import EstimateError
from slurm_coloc.estimate.convcall import ConvCall
from slurm_coloc.estimate.spec import ModelSpec
from slurm_coloc.estimate.trace import trace_spec

TRACE_BS = 2
GRID_BS = (1, 4, 16, 64, 256)
MAX_ELEMS = 6 * 10**8  # largest input/output tensor measured (2.4 GB at fp32)


def _groups(paths: List[str]) -> Dict[Tuple[str, ...], Dict]:
    """Rows grouped by (model, kwargs, input shape, input dtype, precision); rows whose trace
    (``*_traces.csv`` beside the runs file) found no convolution module are left out."""
    groups: Dict[Tuple[str, ...], Dict] = {}
    for path in paths:
        no_conv = set()
        traces = path.replace("_runs.csv", "_traces.csv")
        if traces != path and os.path.isfile(traces):
            with open(traces, newline="") as fh:
                no_conv = {t["config_id"] for t in csv.DictReader(fh) if t.get("n_conv", "1") in ("0",)}
        with open(path, newline="") as fh:
            for r in csv.DictReader(fh):
                if r["status"] != "ok" or r["config_id"] in no_conv:
                    continue
                k = (r["model"], r["kwargs_json"], r["input_shape"], r["input_dtype"], r["precision"])
                g = groups.setdefault(k, {"family": r["family"], "bs": set()})
                g["bs"].add(int(r["batch_size"]))
    return groups


def _elems(shape: Tuple[int, ...]) -> int:
    return int(math.prod(shape))


def fits(c: ConvCall) -> bool:
    """Small enough to measure (input and output <= MAX_ELEMS elements)."""
    return _elems(c.input) <= MAX_ELEMS and _elems(c.output_shape) <= MAX_ELEMS


def random_calls(n: int, seed: int = 7) -> List[ConvCall]:
    """``n`` random 2-D convolution calls (forward and backward of n/2 layers)."""
    rng = random.Random(seed)
    out: List[ConvCall] = []
    while len(out) < n:
        cin = rng.choice([1, 3]) if rng.random() < 0.08 else int(round(2 ** rng.uniform(3, 11)))
        k = rng.choices([1, 3, 5, 7], [35, 45, 10, 10])[0]
        kind = rng.choices(["dense", "depthwise", "grouped"], [80, 15, 5])[0]
        if kind == "depthwise" and cin > 3:
            groups, cout = cin, cin
        elif kind == "grouped" and cin >= 64 and cin % 32 == 0:
            groups = 32
            cout = 32 * max(1, int(round(2 ** rng.uniform(3, 11)) / 32))
        else:
            groups, cout = 1, int(round(2 ** rng.uniform(3, 11)))
        stride = rng.choices([1, 2], [75, 25])[0]
        hw = max(k, int(round(2 ** rng.uniform(2, 8.3))))
        n_b = int(round(2 ** rng.uniform(0, 8)))
        dtype = rng.choices(["float32", "float16", "bfloat16"], [3, 2, 1])[0]
        pad = k // 2
        common = dict(dtype=dtype, input=(n_b, cin, hw, hw), weight=(cout, cin // groups, k, k),
                      stride=(stride, stride), padding=(pad, pad), dilation=(1, 1), transposed=False,
                      output_padding=(0, 0), groups=groups)
        fwd = ConvCall(backward=False, mask=(), **common)
        if not fits(fwd):
            continue
        first = cin <= 3
        bwd = ConvCall(backward=True, mask=(not first, True, rng.random() < 0.3), **common)
        out += [fwd, bwd]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", nargs="*", default=["data/hopper/paper18_runs.csv", "data/hopper/hopper_runs.csv"])
    ap.add_argument("--random", type=int, default=4000, help="random calls (half forward, half backward)")
    args = ap.parse_args()
    exact: Dict[str, Dict] = {}
    grid: Dict[str, Dict] = {}

    def add(table: Dict[str, Dict], c: ConvCall, src: str) -> None:
        if not fits(c):
            return
        rec = table.setdefault(c.key, {"call": c, "srcs": set()})
        rec["srcs"].add(src)

    t0 = time.time()
    groups = _groups(args.runs)
    ordered = sorted(groups.items(), key=lambda kv: kv[1]["family"] != "paper18")
    for i, ((model, kw, shape, idt, prec), g) in enumerate(ordered):
        src = "paper18" if g["family"] == "paper18" else f"hopper:{g['family']}"
        spec = ModelSpec(model=model_ref(model), kwargs=json.loads(kw),
                         input_shape=tuple(int(d) for d in shape.split(",")),
                         input_dtype=idt, batch_size=TRACE_BS, optimizer="sgd", precision=prec)
        try:
            calls = trace_spec(spec).conv_calls
        except EstimateError as exc:
            print(f"skip {model} {kw[:60]}: {exc.one_line()}", file=sys.stderr)
            continue
        for c in calls:
            per = c.batch / TRACE_BS
            for bs in sorted(g["bs"]):
                add(exact, c.with_batch(max(1, int(round(per * bs)))), src)
            for bs in GRID_BS:
                add(grid, c.with_batch(max(1, int(round(per * bs)))), src)
        if i % 50 == 0:
            print(f"{i}/{len(groups)} groups, {len(exact)} exact calls, {time.time() - t0:.0f} s", file=sys.stderr)
    rand = {c.key: {"call": c, "srcs": {"random"}} for c in random_calls(args.random)}
    # Order: paper18's calls, then the Hopper rows' calls, then random layers (the fallback for
    # unseen layers), then the batch grid; shuffled within each tier (fixed seed) so that a run
    # cut short by its budget still covers every family.
    order: List[Dict] = []
    seen = set()
    rng = random.Random(11)
    tiers = [("exact", {k: v for k, v in exact.items() if "paper18" in v["srcs"]}), ("exact", exact),
             ("random", rand), ("grid", grid)]
    for tier, table in tiers:
        keys = sorted(k for k in table if k not in seen)
        rng.shuffle(keys)
        for key in keys:
            seen.add(key)
            srcs = set()
            for t in (exact, rand, grid):
                if key in t:
                    srcs |= t[key]["srcs"]
            order.append(dict(table[key]["call"].to_json(), srcs=sorted(srcs), tier=tier))
    with open(args.out, "w") as fh:
        for o in order:
            fh.write(json.dumps(o, separators=(",", ":")) + "\n")
    print(f"{len(order)} calls ({len(exact)} exact, {len(rand)} random, {len(grid)} grid) "
          f"in {time.time() - t0:.0f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
