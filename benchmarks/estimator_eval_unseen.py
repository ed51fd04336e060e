#!/usr/bin/env python3
"""Score the shipped estimator on 30 real models of architectures it was never built, trained,
calibrated or workspace-measured on, measured on the H100 (issue 3: "judged on real models it has
never seen").

    .venv/bin/python -W ignore -m benchmarks.estimator_eval_unseen [--json]

Data: ``data/hopper/unseen_runs.csv`` (``estimator_hopper_gen.py --set unseen`` on the H100: NVML
per-process peak of 3 training steps in a fresh process). Each row is estimated exactly as
``coloc-estimate --gpu H100 --no-cache`` does (the whole workspace table: none of these models'
convolution calls were listed for measurement, so their layers are found only where another
model shares them, or by the nearest-neighbour fallback). Prints one row per model and the
summary: under (estimate < measured), median and p90 over-reservation ((estimate - actual) /
actual), plus the uncalibrated analytic figure and torch's own peak reserved + 612 MiB.
"""
from __future__ import annotations

import csv
import json
import os
import statistics
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def main() -> int:
    from slurm_coloc.estimate.combine import traced_estimate
    from slurm_coloc.estimate.spec import ModelSpec

    rows = [r for r in csv.DictReader(open(os.path.join(ROOT, "data", "hopper", "unseen_runs.csv"), newline=""))
            if r["status"] == "ok"]
    out = []
    for r in rows:
        spec = ModelSpec(model=r["model"], kwargs=json.loads(r["kwargs_json"]),
                         input_shape=tuple(int(d) for d in r["input_shape"].split(",")), input_dtype=r["input_dtype"],
                         batch_size=int(r["batch_size"]), optimizer=r["optimizer"], precision=r["precision"],
                         base_dir=ROOT)
        t0 = time.time()
        est = traced_estimate(spec, "H100")
        actual = float(r["nvml_mib"])
        out.append({"model": r["model"].split(":")[1], "batch_size": int(r["batch_size"]), "precision": r["precision"],
                    "measured_mib": actual, "estimate_mib": est.mem_mib,
                    "analytic_mib": est.detail.get("analytic_mib"),
                    "over": (est.mem_mib - actual) / actual, "s": round(time.time() - t0, 1)})
    if "--json" in sys.argv:
        print(json.dumps(out, indent=1))
        return 0
    print("| model | batch | precision | H100 measured MiB | analytic MiB | estimate MiB | over |")
    print("|---|---|---|---|---|---|---|")
    for o in out:
        print(f"| {o['model']} | {o['batch_size']} | {o['precision']} | {o['measured_mib']:.0f} | "
              f"{o['analytic_mib']:.0f} | {o['estimate_mib']} | {o['over'] * 100:+.1f}% |")
    over = sorted(o["over"] for o in out)
    ana = sorted((o["analytic_mib"] - o["measured_mib"]) / o["measured_mib"] for o in out)
    p90 = lambda v: v[min(len(v) - 1, int(0.9 * (len(v) - 1) + 0.5))]  # noqa: E731
    print(f"\nshipped estimate, {len(over)} unseen real models: "
          f"under {sum(o < 0 for o in over) / len(over) * 100:.1f}% "
          f"({sum(o < 0 for o in over)} of {len(over)}), median over {statistics.median(over) * 100:+.1f}%, "
          f"p90 over {p90(over) * 100:+.1f}%")
    print(f"analytic (uncalibrated): under {sum(o < 0 for o in ana)} of {len(ana)}, "
          f"median {statistics.median(ana) * 100:+.1f}%, "
          f"p90 {p90(ana) * 100:+.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
