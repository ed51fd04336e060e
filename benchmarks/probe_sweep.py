#!/usr/bin/env python3
"""A learning-rate sweep through ``coloc-sbatch --dry-run`` (issue 45): one probe per configuration.

    .venv/bin/python -m benchmarks.probe_sweep            # 10 submissions (docs/estimator.md "Sweep reuse")
    .venv/bin/python -m benchmarks.probe_sweep -n 5

Writes a small transformer training script (stand-in data, ``--lr``, ``--seed``, ``--epochs``,
``--output-dir`` arguments) into a temporary directory, times one probe alone (``COLOC_ESTIMATE_CACHE=off``),
then submits it N times from a bash ``for`` loop with a fresh per-user cache, each with another learning rate,
seed and output directory, and prints a table: each submission's seconds, the total, and the target (all N
within 2x one probe + 1 s per submission). A last ``--explain`` submission shows the reuse line. Runs as the
caller; needs no cluster (``--dry-run``).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Tuple

TRAIN = '''\
import argparse
import torch
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--lr", type=float, default=3e-4)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--output-dir", default="out")
p.add_argument("--batch-size", type=int, default=32)
a = p.parse_args()
torch.manual_seed(a.seed)
layer = nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True)
model = nn.Sequential(nn.Embedding(8000, 256), nn.TransformerEncoder(layer, 4), nn.Linear(256, 8000)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
data = [torch.randint(0, 8000, (a.batch_size, 129)) for _ in range(8)]
for epoch in range(a.epochs):
    for batch in data:
        batch = batch.cuda(non_blocking=True)
        logits = model(batch[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 8000), batch[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
'''
JOB = "#!/bin/bash\n#SBATCH --gres=gpu:1\npython3 train.py \"$@\"\n"
LOOP = r'''
i=0
for lr in $LRS; do
  i=$((i + 1))
  s=$(date +%s.%N)
  "$SBATCH" --dry-run job.sh --lr "$lr" --seed "$i" --output-dir "runs/lr$lr" > /dev/null 2> "err$i.txt" || exit 1
  e=$(date +%s.%N)
  echo "$i $lr $s $e"
done
'''


def _env(cache: Path, off: bool = False) -> dict:
    env = dict(os.environ, XDG_CACHE_HOME=str(cache))
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    if off:
        env["COLOC_ESTIMATE_CACHE"] = "off"
    return env


def run(n: int) -> int:
    sbatch = os.path.join(os.path.dirname(sys.executable), "coloc-sbatch")
    with tempfile.TemporaryDirectory(prefix="coloc-sweep-") as tmp:
        d = Path(tmp)
        (d / "train.py").write_text(TRAIN)
        (d / "job.sh").write_text(JOB)
        t0 = time.monotonic()
        one = subprocess.run([sbatch, "--dry-run", "job.sh", "--lr", "0.5"], cwd=d, capture_output=True,
                             text=True, env=_env(d / "cache-off", off=True))
        t_one = time.monotonic() - t0
        if one.returncode != 0 or "method\":\"probe" not in one.stdout:
            print(f"one probe gave no figure: {one.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            return 1
        lrs = " ".join(f"{10 ** -(1 + k / 3):.2g}" for k in range(n))
        env = dict(_env(d / "cache"), LRS=lrs, SBATCH=sbatch)
        t0 = time.monotonic()
        loop = subprocess.run(["bash", "-c", LOOP], cwd=d, capture_output=True, text=True, env=env)
        total = time.monotonic() - t0
        if loop.returncode != 0:
            print(f"the loop failed: {loop.stderr.strip()[-300:]}", file=sys.stderr)
            return 1
        rows: List[Tuple[str, str, float]] = []
        for line in loop.stdout.split("\n"):
            if line.strip():
                i, lr, s, e = line.split()
                rows.append((i, lr, float(e) - float(s)))
        explain = subprocess.run([sbatch, "--dry-run", "--explain", "job.sh", "--lr", "0.77", "--seed", "99"],
                                 cwd=d, capture_output=True, text=True, env=_env(d / "cache"))
        reuse = [ln for ln in explain.stderr.splitlines() if "reused for this submission" in ln]
    print(f"one probe alone (cache off): {t_one:.2f} s")
    print(f"{'#':>3} {'--lr':>8} {'seconds':>8}")
    for i, lr, sec in rows:
        print(f"{i:>3} {lr:>8} {sec:8.2f}")
    target = 2 * t_one + 1.0 * n
    print(f"all {n}: {total:.2f} s (target <= 2 x {t_one:.2f} + {n} x 1 s = {target:.2f} s): "
          f"{'met' if total <= target else 'NOT met'}")
    print("explain: " + (reuse[0].split("probe: ", 1)[-1][:300] if reuse else "no reuse line"))
    return 0 if total <= target and reuse else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("-n", type=int, default=10, help="submissions in the sweep")
    return run(ap.parse_args().n)


if __name__ == "__main__":
    sys.exit(main())
