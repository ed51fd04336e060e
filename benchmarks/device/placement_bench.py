"""Placement benchmark on one GPU under real Slurm, one pass per device call: exclusive FIFO vs blind (memory-only)
collocation vs utilization-aware collocation (coloc-placer), for the 14-job pile and a mixed stream.

Usage (root, on the device machine, from the repository; ``.carry`` carried; each call < 9.5 min):
  python3 -m benchmarks.device.placement_bench PASS [PASS...] [--out DIR] [--budget-s 560] [--part K/N]
                                               [--alone FILE...] [--plan placement_plan.json]
                                               [--submit sequential|parallel]
  PASS: <scenario>-<policy>, scenario pile | stream (placement_plan.json) | mix (--plan placement_plan_mix.json
        or placement_plan_heldout.json, placement_mix.py), policy exclusive | blind | aware (gate) | throughput |
        split (with --split-gpus G0,G1,...: each job on the GPU named for it, all at once);
        or small7-blind | small7-aware
Stage 1 (any python3, stdlib only) starts the cluster with typed shards (``cluster_gpu.sh``, ``COLOC_GRES_TYPED=1``)
and re-runs itself in the cluster's venv (stage 2, ``placement_passes.py``), which runs the passes over the jobs
of ``placement_plan.json`` (``placement_plan.py``) and writes ``<out>/<pass>.json`` as it goes, ``placer.log``
and ``logs.tgz`` (job outputs, hook and Slurm logs). ``--alone``: the exclusive pass files of earlier calls
(times alone for the slowdowns, and activity alone as the placer's history). ``benchmarks/placement_combine.py``
joins the pass files into the issue's table. ``COLOC_BENCH_FAKE_GPUS=1``: a CPU check of the Slurm parts (jobs
sleep; no NVML).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = Path(os.environ.get("COLOC_BENCH_ROOT", "/opt/coloc"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], add_help=True)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/coloc-out"))
    ap.add_argument("--budget-s", type=float, default=560.0, help="the whole call's wall-clock budget (s)")
    a, rest = ap.parse_known_args()
    if os.geteuid() != 0:
        print("placement_bench: run as root (it starts the cluster and the placer)", file=sys.stderr)
        return 2
    t0 = time.time()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    # jobs get the machine's own LD_LIBRARY_PATH (torch's CUDA libraries), as run_device.sh gives bench.py
    os.environ.setdefault("COLOC_BENCH_LD_LIBRARY_PATH", os.environ.get("LD_LIBRARY_PATH", ""))
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    env = {**os.environ, "COLOC_GRES_TYPED": "1"}
    subprocess.run([str(HERE / "cluster_gpu.sh"), "stop"], env=env, check=False)
    if subprocess.run([str(HERE / "cluster_gpu.sh"), "start"], env=env).returncode != 0:
        print("placement_bench: cluster start failed", file=sys.stderr)
        return 1
    print(f"placement_bench: cluster up in {time.time() - t0:.0f} s", flush=True)
    py = str(ROOT / "venv" / "bin" / "python3")
    code = subprocess.run([py, "-m", "benchmarks.device.placement_passes", *rest, "--started-at", str(t0),
                           "--out", str(out), "--budget-s", str(a.budget_s)],
                          cwd=HERE.parent.parent).returncode  # the repository root: benchmarks as a package
    subprocess.run(["tar", "-C", str(ROOT), "-czf", str(out / "logs.tgz"), "jobs", "log", "etc"], check=False)
    # the controller and node databases (samples, runs): what the placer learned from, for benchmarks/ offline
    subprocess.run(["tar", "-C", str(ROOT / "coloc"), "-czf", str(out / "state.tgz"), "state"], check=False)
    return code


if __name__ == "__main__":
    sys.exit(main())
