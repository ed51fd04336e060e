#!/usr/bin/env python3
"""What the MPS fence sees: the shipped estimate vs the fence coloc-sbatch actually requests (issue 3/4).

coloc-sbatch asks for ``max(min_shards, mib_to_shards(estimate + headroom_mib))`` GiB shards and the Prolog
fences the job at that many GiB (``submit/plan.py``, ``node/lifecycle.py``). This prints, per data set, how many
measured H100 peaks exceed the estimate and how many exceed the fence, and the median over-reservation of both:

    .venv/bin/python -m benchmarks.estimator_fence
    .venv/bin/python -m benchmarks.estimator_fence --pick 24 --out cfgs.json   # for device/fence_check.py

``--pick N`` writes the N Hopper rows whose measured peak is closest to (or above) their fence, as configs
for ``benchmarks/device/fence_check.py`` (which trains them under that fence on the H100).

Data: ``data/hopper`` (H100, this project) incl. the 18 real models of GPUMemNet's paper table re-measured
(``paper18_*.csv``; GPUMemNet, CC BY 4.0). Uses the shipped calibration and the default config.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import sys
import tempfile
from typing import Any, Dict, List, Sequence

from rich.console import Console
from rich.table import Table

from benchmarks.estimator import margins, train
from slurm_coloc.config import Config
from slurm_coloc.estimate.combine import load_calibration
from slurm_coloc.units import mib_to_shards


def fence_mib(estimate_mib: float, cfg: Config) -> int:
    """The fence (MiB) coloc-sbatch's shard request gives a job with this estimate."""
    return max(cfg.min_shards, mib_to_shards(int(round(estimate_mib)) + cfg.headroom_mib)) * 1024


def row(name: str, rows: Sequence[Dict[str, Any]], cal: Dict[str, Any], cfg: Config) -> List[str]:
    """Table cells: data set, rows, under estimate, under fence, median over of both."""
    est = [margins._bound(cal, r, train.H100_CONTEXT_MIB) for r in rows]
    fen = [fence_mib(e, cfg) for e in est]
    act = [r["actual_mib"] for r in rows]
    n = len(rows)

    def under(xs: Sequence[float]) -> str:
        k = sum(1 for x, a in zip(xs, act) if x < a)
        return f"{k} ({100 * k / n:.1f}%)"

    def med(xs: Sequence[float]) -> str:
        return f"{100 * statistics.median((x - a) / a for x, a in zip(xs, act)):+.1f}%"

    return [name, str(n), under(est), under(fen), med(est), med(fen)]


def pick(rows: Sequence[Dict[str, Any]], cal: Dict[str, Any], cfg: Config, n: int) -> List[Dict[str, Any]]:
    """The ``n`` rows with the highest measured peak / fence ratio, as fence_check.py configs, plus one negative
    control (the first row again, fenced at 1 GiB: it must OOM, showing the fence is in force)."""
    fenced = [(fence_mib(margins._bound(cal, r, train.H100_CONTEXT_MIB), cfg), r) for r in rows]
    scored = sorted(fenced, key=lambda t: -t[1]["actual_mib"] / t[0])[:n]
    with open(os.path.join(train.HOPPER_DIR, "hopper_runs.csv"), newline="") as fh:
        runs = {r["config_id"]: r for r in csv.DictReader(fh)}
    out = []
    for fence, r in scored:
        src = runs[r["config_id"]]
        group = {"family": src["family"], "model": src["model"], "kwargs": json.loads(src["kwargs_json"]),
                 "shape": [int(d) for d in src["input_shape"].split(",")], "input_dtype": src["input_dtype"],
                 "optimizer": src["optimizer"], "precision": src["precision"]}
        out.append({"config_id": r["config_id"], "family": src["family"], "model": src["model"],
                    "batch_size": int(src["batch_size"]), "precision": src["precision"],
                    "unfenced_nvml_mib": r["actual_mib"],
                    "fence_mib": fence, "group": group})
    if out:  # negative control: the tightest row fenced at 1 GiB, below its allocated peak + context: must OOM
        out.append(dict(out[0], fence_mib=1024, control=True))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pick", type=int, default=0, help="write the N tightest-fenced rows to --out and exit")
    ap.add_argument("--out", default="", help="JSON file for --pick")
    args = ap.parse_args()
    if args.pick and not args.out:
        ap.error("--pick needs --out FILE (the JSON for benchmarks/device/fence_check.py)")
    cal, cfg = load_calibration(), Config()
    hopper = train.load_hopper()
    if args.pick:
        with open(args.out, "w") as fh:
            json.dump(pick(hopper, cal, cfg, args.pick), fh, indent=1)
        return 0
    _, test = train.split(hopper, train.TEST_FAMILIES)
    tmp = tempfile.mkdtemp()
    try:
        for src, dst in (("paper18_runs.csv", "hopper_runs.csv"), ("paper18_traces.csv", "hopper_traces.csv")):
            shutil.copy(os.path.join(train.HOPPER_DIR, src), os.path.join(tmp, dst))
        paper = train.load_hopper(tmp)
    finally:
        shutil.rmtree(tmp)
    t = Table(title=f"estimate vs fence (headroom {cfg.headroom_mib} MiB, 1 shard = 1 GiB)")
    for c in ("data set", "rows", "peak > estimate", "peak > fence", "median over (estimate)", "median over (fence)"):
        t.add_column(c)
    t.add_row(*row("Hopper held-out families", test, cal, cfg))
    t.add_row(*row("18 real models, H100", paper, cal, cfg))
    t.add_row(*row("generated small CNNs (cnn family)", [r for r in hopper if r["family"] == "cnn"], cal, cfg))
    t.add_row(*row("all Hopper rows", hopper, cal, cfg))
    Console(width=160).print(t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
