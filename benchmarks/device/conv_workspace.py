#!/usr/bin/env python3
"""Measure the cuDNN workspace PyTorch takes for each convolution call, on the GPU (issue 3).

    /opt/torch/.venv/bin/python3 -m benchmarks.device.conv_workspace \
        benchmarks/device/conv_calls.jsonl --out $OUT/conv_ws.csv --budget-s 500 [--skip-keys done.csv]

Input: the JSON lines of ``benchmarks/estimator_conv_calls.py`` (one ``ConvCall`` each). For each
call the op runs twice as a training step runs it (``aten.convolution`` /
``aten.convolution_backward`` with the call's output mask; default cuDNN settings: heuristics, no
benchmark mode, TF32 allowed) and the workspace is what the caching allocator held beyond the
inputs and outputs at the call's peak::

    ws_b = max_memory_allocated() - memory_allocated() before - sum(outputs rounded to 512 B)

(the larger of the two calls). ``--workers`` processes share the GPU, each measuring every
``workers``-th call (the memory figures are per process; only times are shared). Output CSV columns:
``key, ws_b, ws_first_b, ws_second_b, ms, status``; rows are flushed every 500, the script stops cleanly at its
budget, and ``--skip-keys`` (earlier CSVs) makes it resumable. A ``<out>.meta.json`` beside it names the GPU,
driver, torch, CUDA and cuDNN versions.
"""
from __future__ import annotations

import argparse
import csv
import gzip
import json
import os
import sys
import time

import torch

DT = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _r512(n: int) -> int:
    return max(512, (n + 511) // 512 * 512)


def _nbytes(t: "torch.Tensor | None") -> int:
    return 0 if t is None else _r512(t.numel() * t.element_size())


def measure(c: dict) -> tuple:
    """(ws_first_b, ws_second_b, ms of the second call) for one call dict."""
    dev = torch.device("cuda")
    dt = DT[c["dtype"]]
    x = torch.empty(c["input"], dtype=dt, device=dev)
    w = torch.empty(c["weight"], dtype=dt, device=dev)
    geo = (c["stride"], c["padding"], c["dilation"], c["transposed"], c["output_padding"], c["groups"])
    if c["backward"]:
        with torch.device("meta"):
            oshape = torch.ops.aten.convolution(torch.empty(c["input"], dtype=dt), torch.empty(c["weight"], dtype=dt),
                                                None, *geo).shape
        go = torch.empty(oshape, dtype=dt, device=dev)
        cout = oshape[1]
        bias_sizes = [cout] if c["mask"][2] else None
    out = []
    for _ in range(2):
        torch.cuda.synchronize()
        a0 = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        if c["backward"]:
            res = torch.ops.aten.convolution_backward(go, x, w, bias_sizes, *geo, c["mask"])
            outs = sum(_nbytes(t) for t in res)
        else:
            res = torch.ops.aten.convolution(x, w, None, *geo)
            outs = _nbytes(res)
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1000
        out.append(max(0, torch.cuda.max_memory_allocated() - a0 - outs))
        del res
    return out[0], out[1], ms


def worker(args: argparse.Namespace, wid: int, out: str) -> None:
    """Measure every ``workers``-th call (offset ``wid``) into ``out`` until the budget ends."""
    t_start = time.time()
    skip = set()
    for p in args.skip_keys:
        if os.path.isfile(p):
            with open(p, newline="") as fh:
                skip |= {r["key"] for r in csv.DictReader(fh) if r["status"] == "ok"}
    torch.cuda.init()
    a = torch.randn(256, 256, device="cuda")
    (a @ a).sum().item()  # cuBLAS/cuBLASLt workspaces now exist, outside what is measured
    meta = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
            "cudnn_benchmark": torch.backends.cudnn.benchmark, "allow_tf32": torch.backends.cudnn.allow_tf32}
    if wid == 0:
        with open(args.out + ".meta.json", "w") as fh:
            json.dump(meta, fh)
        print(json.dumps(meta), flush=True)
    n = ok = 0
    opener = gzip.open if args.calls.endswith(".gz") else open
    with opener(args.calls, "rt") as fh, open(out, "w", newline="") as fo:
        w = csv.writer(fo)
        w.writerow(["key", "ws_b", "ws_first_b", "ws_second_b", "ms", "status"])
        for i, line in enumerate(fh):
            if i % args.workers != wid:
                continue
            if time.time() - t_start > args.budget_s:
                break
            c = json.loads(line)
            if c["key"] in skip:
                continue
            n += 1
            try:
                w1, w2, ms = measure(c)
                w.writerow([c["key"], max(w1, w2), w1, w2, round(ms, 3), "ok"])
                ok += 1
            except torch.OutOfMemoryError:
                w.writerow([c["key"], "", "", "", "", "oom"])
            except Exception as exc:  # noqa: BLE001 - record and go on
                error = f"error: {type(exc).__name__}: {str(exc)[:80]}".replace("\n", " ")
                w.writerow([c["key"], "", "", "", "", error])
            if torch.cuda.memory_reserved() > 8 << 30:  # the workers share the GPU's memory
                torch.cuda.empty_cache()
            if n % 500 == 0:
                fo.flush()
                print(f"worker {wid}: {n} calls, {ok} ok, {time.time() - t_start:.0f} s", flush=True)
    print(f"worker {wid} done: {n} calls, {ok} ok, {time.time() - t_start:.0f} s", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("calls")
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=500)
    ap.add_argument("--workers", type=int, default=4, help="processes sharing the GPU (cuDNN plan set-up is CPU-bound)")
    ap.add_argument("--skip-keys", nargs="*", default=[])
    args = ap.parse_args()
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    parts = [f"{args.out}.part{w}" for w in range(args.workers)]
    procs = [ctx.Process(target=worker, args=(args, w, parts[w])) for w in range(args.workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    with open(args.out, "w", newline="") as fo:
        for i, part in enumerate(parts):
            if not os.path.isfile(part):
                continue
            with open(part) as fh:
                lines = fh.readlines()
            fo.writelines(lines if i == 0 else lines[1:])
            os.unlink(part)
    return 0


if __name__ == "__main__":
    sys.exit(main())
