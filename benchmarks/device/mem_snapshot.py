#!/usr/bin/env python3
"""Record PyTorch's caching-allocator events of a few training steps on the GPU (issue 3 diagnosis).

    /opt/torch/.venv/bin/python3 -m benchmarks.device.mem_snapshot --out $OUT \
        torchvision.models:vgg16:224:128:adam:fp32 ...

Each argument is ``module:callable:px:batch:optimizer:precision`` (an image model, 3 x px x px
input; ``t<seq>`` instead of px: token ids of that length); the step is the data generator's
(``estimator_hopper_gen.py``). For each a CSV
``<callable>_<batch>_<precision>.csv`` with one row per allocator event (``action, size_b, addr``:
alloc, free_completed, segment_alloc, ...) from ``torch.cuda.memory._record_memory_history``,
and a summary line (peak reserved/allocated MiB) on stdout. One fresh process per model.
"""
from __future__ import annotations

import csv
import importlib
import multiprocessing as mp
import os
import sys


def run(spec: str, out_dir: str) -> None:
    import torch

    mod, fn, px, bs, opt_name, prec = spec.split(":")
    tokens = px.startswith("t")  # t<seq>: token ids of length <seq> (a language model)
    model = getattr(importlib.import_module(mod), fn)().cuda().train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = {"sgd": lambda: torch.optim.SGD(params, lr=0.01),
           "sgd-momentum": lambda: torch.optim.SGD(params, lr=0.01, momentum=0.9),
           "adam": lambda: torch.optim.Adam(params, lr=1e-3),
           "adamw": lambda: torch.optim.AdamW(params, lr=1e-3)}[opt_name]()
    x = (torch.randint(0, 1000, (int(bs), int(px[1:])), device="cuda") if tokens
         else torch.randn(int(bs), 3, int(px), int(px), device="cuda"))
    amp = prec != "fp32"
    dt = torch.float16 if prec == "amp-fp16" else torch.bfloat16
    scaler = torch.amp.GradScaler("cuda", enabled=prec == "amp-fp16")
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, context="alloc", stacks="python")
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dt, enabled=amp):
            out = model(x)
            out = out.logits if hasattr(out, "logits") else out
            out = out.reshape(-1, out.shape[-1]) if out.dim() > 2 else out
            y = torch.randint(0, out.shape[-1], (out.shape[0],), device="cuda")
            loss = torch.nn.functional.cross_entropy(out, y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        del out, loss, y
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    name = f"{fn}_{bs}_{prec}.csv"
    with open(os.path.join(out_dir, name), "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["action", "size_b", "addr", "where"])
        for ev in snap["device_traces"][0]:
            frames = ev.get("frames") or []
            where = ""
            if ev["action"] == "alloc" and ev["size"] >= 16 << 20:  # the Python lines that asked, innermost first
                where = " < ".join(f"{os.path.basename(f['filename'])}:{f['line']}:{f['name']}" for f in frames
                                   if "torch/" not in f["filename"])[:300]
            w.writerow([ev["action"], ev["size"], ev["addr"], where])
    print(f"{spec}: peak reserved {torch.cuda.max_memory_reserved() / 2**20:.0f} MiB, peak allocated "
          f"{torch.cuda.max_memory_allocated() / 2**20:.0f} MiB, {len(snap['device_traces'][0])} events", flush=True)


def main() -> int:
    args = sys.argv[1:]
    out_dir = args[args.index("--out") + 1]
    specs = [a for i, a in enumerate(args) if a != "--out" and (i == 0 or args[i - 1] != "--out")]
    ctx = mp.get_context("spawn")
    for s in specs:
        p = ctx.Process(target=run, args=(s, out_dir))
        p.start()
        p.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
