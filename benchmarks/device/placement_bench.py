"""Placement benchmark on one GPU under real Slurm: exclusive FIFO vs blind (memory-only) collocation vs
utilization-aware collocation (coloc-placer), for the 14-job pile and a mixed stream arriving over time.

Usage (root, on the device machine, from the repository; one call, within ``--budget-s``):
  python3 benchmarks/device/placement_bench.py [--out DIR] [--budget-s 520] [--scenarios pile,stream]
                                               [--policies exclusive,blind,aware] [--target-s S]
Stage 1 (any python3, stdlib only): profiles every model alone in one process (``pile_workloads.py profile``:
step time, peak reserved memory, FLOPs per step) while ``cluster_gpu.sh`` starts the cluster with typed shards
(``COLOC_GRES_TYPED=1``); then re-runs itself in the cluster's venv (stage 2). Stage 2 (``placement_passes.py``) sizes
the jobs to the budget, and runs each scenario under each policy, as ``colocuser`` through ``coloc-sbatch``:
  exclusive  ``--exclusive-gpu``: one job on the whole GPU at a time, Slurm FIFO; its run times are the times alone
  blind      ``--coloc-mem=<peak + 1024>M``: shards + MPS, Slurm packs by memory only (no placer)
  aware      the same request with ``coloc-placer run`` alive: coloc-sbatch submits held for the placer, which
             collocates while the GPU stays under the CARMA gate and otherwise leaves the job waiting
Writes ``<out>/placement_bench.json`` (profile, sizing, per scenario/policy: jobs and metrics, target checks) and
prints a table. ``COLOC_BENCH_FAKE_GPUS=1``: CPU check of the Slurm parts (no profile; jobs only sleep).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
ROOT = Path(os.environ.get("COLOC_BENCH_ROOT", "/opt/coloc"))
PILE = ["pile:resnet50", "pile:resnet101", "pile:vit_b_16", "pile:swin_t", "pile:convnext_tiny",
        "pile:efficientnet_b0", "pile:densenet121", "pile:regnet_y_1_6gf", "pile:bert_base", "pile:gpt2",
        "pile:distilbert", "pile:mlp", "pile:transformer_encoder"]
PILE14 = PILE + ["pile:resnet50"]  # 14 jobs: the 13 models, ResNet-50 twice
# The mixed stream: (workload, arrival offset in units of the job's target time alone)
STREAM = [("small_cnn", 0.0), ("resnet18_32", 0.3), ("resnet50_224", 0.6), ("pile:bert_base", 0.9),
          ("small_cnn", 1.2), ("resnet18_32", 1.5), ("resnet50_224", 1.8), ("small_cnn", 2.1)]
# Fake profile (COLOC_BENCH_FAKE_GPUS): made-up step times and peaks so the bookkeeping runs on CPU; labelled fake.
FAKE_PEAK_MIB = {"small_cnn": 700, "resnet18_32": 1100}


def fake_profile(names: List[str]) -> Dict[str, dict]:
    """Made-up profile rows for the CPU check (``"fake": true``): 0.05 s steps, 1.5-6.5 GiB peaks."""
    out = {}
    for k, n in enumerate(sorted(set(names))):
        out[n] = {"workload": n, "step_s": 0.05, "batch": 32, "gflop_per_step": 10.0 * (k + 1),
                  "peak_reserved_mib": FAKE_PEAK_MIB.get(n, 1500 + 400 * k), "params_m": None, "fake": True}
    return out


def profile_cmd(names: List[str]) -> List[str]:
    py = os.environ.get("COLOC_BENCH_PYTHON", "/opt/torch/.venv/bin/python3")
    return [py, str(HERE / "pile_workloads.py"), "profile", *names]


def stage1(a: argparse.Namespace, rest: List[str]) -> int:
    """Profile (real GPU) while the cluster starts, then exec stage 2 in the cluster's venv."""
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    names = sorted({*PILE14, *(w for w, _ in STREAM)})
    fake = bool(os.environ.get("COLOC_BENCH_FAKE_GPUS"))
    t0 = time.time()
    prof = None
    if not fake:
        prof = subprocess.Popen(profile_cmd(names), stdout=subprocess.PIPE, stderr=open(out / "profile.err", "w"),
                                text=True, cwd=str(HERE))
    env = {**os.environ, "COLOC_GRES_TYPED": "1"}
    subprocess.run([str(HERE / "cluster_gpu.sh"), "stop"], env=env, check=False)
    start = subprocess.run([str(HERE / "cluster_gpu.sh"), "start"], env=env)
    if start.returncode != 0:
        print("placement_bench: cluster start failed", file=sys.stderr)
        return 1
    rows: Dict[str, dict] = {}
    if prof is not None:
        try:
            text, _ = prof.communicate(timeout=max(30.0, a.budget_s * 0.3))
        except subprocess.TimeoutExpired:  # keep what was measured; the rest is sized by defaults
            prof.kill()
            text, _ = prof.communicate()
            print("placement_bench: profile cut at its time limit", file=sys.stderr)
        for line in text.splitlines():
            if line.startswith("PROFILE "):
                r = json.loads(line[len("PROFILE "):])
                rows[r["workload"]] = r
    else:
        rows = fake_profile(names)
    (out / "profile.json").write_text(json.dumps({"elapsed_s": time.time() - t0, "rows": rows}, indent=1))
    print(f"placement_bench: profile of {len(rows)} models and cluster start in {time.time() - t0:.0f} s",
          flush=True)
    py = str(ROOT / "venv" / "bin" / "python3")
    os.execv(py, [py, str(HERE / "placement_passes.py"), "--started-at", str(t0), "--out", str(out),
                  "--budget-s", str(a.budget_s), *rest])
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], add_help=True)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/coloc-out"))
    ap.add_argument("--budget-s", type=float, default=520.0, help="the whole run's wall-clock budget (s)")
    a, rest = ap.parse_known_args()
    if os.geteuid() != 0:
        print("placement_bench: run as root (it starts the cluster and the placer)", file=sys.stderr)
        return 2
    return stage1(a, rest)


if __name__ == "__main__":
    sys.exit(main())
