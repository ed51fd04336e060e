#!/usr/bin/env python3
"""Do the tightest-fenced Hopper configs train under their MPS memory fence? (issue 3/4, run ON THE GPU MACHINE)

``benchmarks/estimator_fence.py --pick N --out cfgs.json`` (CPU machine) writes the N data-set rows whose
unfenced H100 peak comes closest to (or above) the fence coloc-sbatch would request for them. This script starts
one multi-user MPS control daemon on GPU 0 (own pipe/log directory), then runs each config in a fresh forked
child with ``CUDA_MPS_PIPE_DIRECTORY`` and ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<fence>M`` -- what the Prolog
gives a shard job (``slurm_coloc/node/lifecycle.py``) -- training the generator's step (forward, cross-entropy,
backward, optimizer step; 3 steps) and records ok / OOM and torch's peak reserved. Stops the daemon at the end::

    /opt/torch/.venv/bin/python3 -m benchmarks.device.fence_check cfgs.json --out $OUT/fence.csv

Hypothesis under test (docs/estimator.md): a config whose unfenced peak exceeds the fence only by cuDNN
convolution workspace still trains under the fence, because PyTorch falls back to algorithms with smaller
workspaces when a workspace allocation fails.
"""
from __future__ import annotations

import argparse
import csv
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict

from benchmarks import estimator_hopper_gen as gen

FIELDS = ["config_id", "control", "family", "model", "batch_size", "precision", "unfenced_nvml_mib", "fence_mib",
          "status", "torch_max_reserved_mib", "torch_max_allocated_mib", "error"]


def _fenced_child(g: Dict[str, Any], fence_mib: int, pipe_dir: str, conn: Any) -> None:
    """Set the MPS client environment before CUDA initialises, then train like the generator."""
    os.environ["CUDA_MPS_PIPE_DIRECTORY"] = pipe_dir
    os.environ["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={fence_mib}M"
    gen._child(g, conn)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", help="JSON list from estimator_fence.py --pick")
    ap.add_argument("--out", required=True)
    ap.add_argument("--child-timeout-s", type=float, default=120.0)
    args = ap.parse_args()
    try:
        with open(args.configs) as fh:
            cfgs = json.load(fh)
        if not isinstance(cfgs, list) or not all(isinstance(c, dict) and {"group", "batch_size", "fence_mib"}
                                                 <= set(c) for c in cfgs):
            raise ValueError("expected a list of configs with group, batch_size, fence_mib")
    except (OSError, ValueError) as exc:
        ap.error(f"{args.configs}: not a config list from estimator_fence.py --pick ({exc})")
    import torch  # noqa: F401  imported before fork so children start fast
    import torchvision.models  # noqa: F401

    import benchmarks.estimator.zoo  # noqa: F401

    run = tempfile.mkdtemp(prefix="coloc-fence-")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="0", CUDA_MPS_PIPE_DIRECTORY=os.path.join(run, "pipe"),
               CUDA_MPS_LOG_DIRECTORY=os.path.join(run, "log"))
    os.makedirs(env["CUDA_MPS_PIPE_DIRECTORY"])
    os.makedirs(env["CUDA_MPS_LOG_DIRECTORY"])
    subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, check=True)
    os.environ["CUDA_VISIBLE_DEVICES"] = "0"
    ctx = mp.get_context("fork")
    with open(args.out, "w", newline="") as fh:
        w = csv.DictWriter(fh, FIELDS)
        w.writeheader()
        try:
            for c in cfgs:
                g = dict(c["group"], batch_sizes=[c["batch_size"]])
                parent, child = ctx.Pipe()
                p = ctx.Process(target=_fenced_child, args=(g, c["fence_mib"], env["CUDA_MPS_PIPE_DIRECTORY"], child))
                t0 = time.time()
                p.start()
                rec: Dict[str, Any] = {"status": "timeout"}
                if parent.poll(args.child_timeout_s):
                    rec = parent.recv()
                    parent.send(True)
                    if parent.poll(10):
                        parent.recv()
                p.join(10)
                if p.is_alive():
                    p.kill()
                row = {k: c.get(k) for k in ("config_id", "family", "model", "batch_size", "precision",
                                             "unfenced_nvml_mib", "fence_mib", "control")}
                row.update({k: v for k, v in rec.items() if k in FIELDS and k != "batch_size"})
                w.writerow(row)
                fh.flush()
                print(f"{c['config_id']} {c['model']} bs {c['batch_size']} fence {c['fence_mib']} "
                      f"unfenced {c['unfenced_nvml_mib']:.0f} -> {rec.get('status')} "
                      f"reserved {rec.get('torch_max_reserved_mib', float('nan')):.0f} ({time.time() - t0:.1f}s)",
                      file=sys.stderr)
        finally:
            subprocess.run(["nvidia-cuda-mps-control"], input=b"quit\n", env=env, timeout=30)
            shutil.rmtree(run, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
