"""Peak reserved GPU memory of training steps with and without ``torch.compile``, on the GPU.

The script probe traces a ``torch.compile``d program eagerly (``probe/inject/main.py``); what the
compiled program holds beyond that is measured here, per model: the same model, batch and optimizer
run 6 Adam steps eagerly and compiled (inductor, default mode), each in its own process, and
``torch.cuda.max_memory_reserved()`` / ``max_memory_allocated()`` are compared. The largest
compiled/eager ratio of reserved memory is what ``probe.COMPILED_RESERVED_FACTOR`` must cover.

Prints a table and writes the rows as JSON to ``--out``. Runs ``--jobs`` processes at a time.

Usage (GPU machine, repository root)::

    /opt/torch/.venv/bin/python3 -m benchmarks.device.compile_ratio --out $OUT/compile_ratio.json
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, List

# name -> (model kind, options); the first is the probe corpus's compile_mlp
CONFIGS: Dict[str, Dict[str, Any]] = {
    "resmlp_w4096_d8_b2048": {"kind": "resmlp", "width": 4096, "depth": 8, "batch": 2048},
    "resmlp_w4096_d8_b512": {"kind": "resmlp", "width": 4096, "depth": 8, "batch": 512},
    "resmlp_w2048_d8_b2048": {"kind": "resmlp", "width": 2048, "depth": 8, "batch": 2048},
    "resmlp_w1024_d16_b4096": {"kind": "resmlp", "width": 1024, "depth": 16, "batch": 4096},
    "resmlp_w8192_d4_b1024": {"kind": "resmlp", "width": 8192, "depth": 4, "batch": 1024},
    "encoder_d512_l6_b64_t256": {"kind": "encoder", "d": 512, "layers": 6, "batch": 64, "seq": 256},
    "encoder_d768_l4_b32_t512": {"kind": "encoder", "d": 768, "layers": 4, "batch": 32, "seq": 512},
    "gpt_d768_l6_b16_t1024_bf16": {"kind": "gpt", "d": 768, "layers": 6, "batch": 16, "seq": 1024, "bf16": True},
    "resnet18_b256": {"kind": "resnet18", "batch": 256},
    "resnet50_b64_amp": {"kind": "resnet50", "batch": 64, "amp": True},
}
STEPS = 6


def _model(torch: Any, cfg: Dict[str, Any]) -> Any:
    nn = torch.nn
    kind = cfg["kind"]
    if kind == "resmlp":
        class ResMLP(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                w = cfg["width"]
                self.inp = nn.Linear(256, w)
                self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(w), nn.Linear(w, w), nn.GELU())
                                            for _ in range(cfg["depth"]))
                self.out = nn.Linear(w, 10)

            def forward(self, x: Any) -> Any:
                x = self.inp(x)
                for b in self.blocks:
                    x = x + b(x)
                return self.out(x)
        return ResMLP()
    if kind == "encoder":
        layer = nn.TransformerEncoderLayer(cfg["d"], 8, 4 * cfg["d"], batch_first=True)
        return nn.Sequential(nn.TransformerEncoder(layer, cfg["layers"]), nn.Linear(cfg["d"], 100))
    if kind == "gpt":
        class Block(nn.Module):
            def __init__(self, d: int) -> None:
                super().__init__()
                self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
                self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
                self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
                self.h = 12

            def forward(self, x: Any) -> Any:
                B, T, C = x.shape
                q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
                q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
                y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
                return x + self.mlp(self.ln2(x))

        class GPT(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                d = cfg["d"]
                self.emb = nn.Embedding(50304, d)
                self.pos = nn.Embedding(cfg["seq"], d)
                self.blocks = nn.ModuleList(Block(d) for _ in range(cfg["layers"]))
                self.ln = nn.LayerNorm(d)
                self.head = nn.Linear(d, 50304, bias=False)

            def forward(self, idx: Any) -> Any:
                x = self.emb(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
                for b in self.blocks:
                    x = b(x)
                return self.head(self.ln(x))
        return GPT()
    import torchvision
    return getattr(torchvision.models, kind)(num_classes=1000)


def _batch(torch: Any, cfg: Dict[str, Any]) -> Any:
    b, kind = cfg["batch"], cfg["kind"]
    if kind == "resmlp":
        return torch.randn(b, 256, device="cuda"), torch.randint(0, 10, (b,), device="cuda")
    if kind == "encoder":
        return (torch.randn(b, cfg["seq"], cfg["d"], device="cuda"),
                torch.randint(0, 100, (b * cfg["seq"],), device="cuda"))
    if kind == "gpt":
        idx = torch.randint(0, 50304, (b, cfg["seq"]), device="cuda")
        return idx, idx.reshape(-1)
    return torch.randn(b, 3, 224, 224, device="cuda"), torch.randint(0, 1000, (b,), device="cuda")


def run_one(name: str, compiled: bool) -> Dict[str, Any]:
    """Train ``STEPS`` steps of CONFIGS[name] on the GPU; the peaks in MiB (in this process)."""
    import torch

    cfg = CONFIGS[name]
    model = _model(torch, cfg).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    step_model = torch.compile(model) if compiled else model
    dtype = torch.bfloat16 if cfg.get("bf16") else torch.float16
    use_ac = bool(cfg.get("bf16") or cfg.get("amp"))
    scaler = torch.amp.GradScaler("cuda", enabled=bool(cfg.get("amp")))
    t0 = time.monotonic()
    for _ in range(STEPS):
        x, y = _batch(torch, cfg)
        with torch.autocast("cuda", dtype=dtype, enabled=use_ac):
            out = step_model(x)
            loss = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    torch.cuda.synchronize()
    return {"config": name, "compiled": compiled, "wall_s": round(time.monotonic() - t0, 1),
            "reserved_mib": round(torch.cuda.max_memory_reserved() / 2**20, 1),
            "allocated_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1)}


def _child(name: str, compiled: bool, timeout_s: float) -> Dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--one", name] + (["--compiled"] if compiled else [])
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"config": name, "compiled": compiled, "error": f"timeout {timeout_s:.0f} s"}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("{"):
            return dict(json.loads(line))
    return {"config": name, "compiled": compiled, "error": (p.stderr.strip().splitlines() or ["?"])[-1][:200]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="compile_ratio.json")
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=240.0)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--compiled", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(run_one(a.one, a.compiled)), flush=True)
        return
    runs: List[Dict[str, Any]] = []
    with cf.ThreadPoolExecutor(a.jobs) as ex:
        futs = [ex.submit(_child, n, c, a.timeout) for n in CONFIGS for c in (False, True)]
        for f in cf.as_completed(futs):
            runs.append(f.result())
            print(json.dumps(runs[-1]), flush=True)
            with open(a.out, "w", encoding="utf-8") as fh:
                json.dump(runs, fh, indent=1)
    by = {(r["config"], r["compiled"]): r for r in runs}
    print("\n| config | eager rsv MiB | compiled rsv MiB | ratio | eager alloc | compiled alloc |")
    print("|---|---:|---:|---:|---:|---:|")
    for n in CONFIGS:
        e, c = by.get((n, False), {}), by.get((n, True), {})
        if "reserved_mib" in e and "reserved_mib" in c:
            ratio = c["reserved_mib"] / e["reserved_mib"]
            print(f"| {n} | {e['reserved_mib']:,.0f} | {c['reserved_mib']:,.0f} | {ratio:.3f} | "
                  f"{e['allocated_mib']:,.0f} | {c['allocated_mib']:,.0f} |")
        else:
            print(f"| {n} | {e.get('reserved_mib', e.get('error'))} | "
                  f"{c.get('reserved_mib', c.get('error'))} | - | | |")


if __name__ == "__main__":
    main()
