#!/usr/bin/env python3
"""Estimator accuracy per data set and estimator; prints a table (docs/estimator.md holds a copy).

    .venv/bin/python -W ignore -m benchmarks.estimator_eval

Data sets: Hopper rows of the TEST families (never trained on, margins chosen on other
families), a 20% held-out split of GPUMemNet's MLP rows (A100), the 18 real models of
GPUMemNet's paper table (published GPUMemNet/FakeTensor/Horus figures and ours, A100), the same
18 re-measured on our H100 (data/hopper/paper18_runs.csv; estimator_eval_paper18.py) and the
FakeTensor and Horus related-work CSVs. "under" = estimate < actual; over-reservation = (est - actual)/actual
over ALL rows (negative when under). Bin accuracy: same
1 GiB shard bin (ceil(MiB/1024)) as the actual.
"""
from __future__ import annotations

import csv
import math
import os
import statistics
import sys
from typing import Dict, List, Sequence

from rich.console import Console
from rich.table import Table

from benchmarks.estimator import learned, margins, train
from benchmarks.estimator_eval_paper18 import PAPER_A100, add_paper18

GDIR = train.GPUMEMNET_DIR


def stats(actual: Sequence[float], est: Sequence[float]) -> Dict[str, str]:
    pairs = [(a, e) for a, e in zip(actual, est) if e is not None and a > 0]
    if not pairs:
        return {"rows": "0"}
    over = sorted((e - a) / a for a, e in pairs)
    under = sum(1 for a, e in pairs if e < a)
    bins = sum(1 for a, e in pairs if math.ceil(a / 1024) == math.ceil(e / 1024))
    q = lambda p: over[min(len(over) - 1, int(p * (len(over) - 1) + 0.5))]  # noqa: E731
    return {"rows": str(len(pairs)), "under": f"{100 * under / len(pairs):.1f}%",
            "median_over": f"{100 * statistics.median(over):+.1f}%", "p90_over": f"{100 * q(0.9):+.1f}%",
            "bin_acc": f"{100 * bins / len(pairs):.1f}%"}


def main() -> int:
    hopper = train.load_hopper()
    gmn = train.load_gpumemnet()
    gmn_train, gmn_test = train.gpumemnet_split(gmn)
    arrs, cal = train.calibrate(hopper, gmn_train, train.TEST_FAMILIES)
    tmp = os.path.join(train.WEIGHTS_DIR, ".eval-tmp.npz")
    train.save_ensemble(arrs, tmp)
    _, test = train.split(hopper, train.TEST_FAMILIES)
    libs = cal["libs_mib"]
    res: List[List[str]] = []

    def add(ds: str, name: str, actual: Sequence[float], est: Sequence[float]) -> None:
        s = stats(actual, est)
        res.append([ds, name, s["rows"], s.get("under", "-"), s.get("median_over", "-"),
                    s.get("p90_over", "-"), s.get("bin_acc", "-")])

    act = [r["actual_mib"] for r in test]
    ana = [train.analytic_of(r, libs) for r in test]
    ana_b = [margins._bound(cal, r, train.H100_CONTEXT_MIB) for r in test]  # combine.calibrated_bound
    lp = [learned.predict_features(r["x"], tmp) for r in test]
    lrn_b = [p["max_mib"] * cal["learned_mult"] for p in lp]
    comb = [max(a, b) for a, b in zip(ana_b, lrn_b)]
    ds = f"Hopper H100, held-out families ({','.join(train.TEST_FAMILIES)})"
    add(ds, "analytic (uncalibrated)", act, ana)
    add(ds, f"analytic bound ({cal['form']}) = shipped estimate", act, ana_b)
    for c in cal["candidates"]:  # every candidate form with the margins it got on VALIDATION
        add(ds, f"candidate {c['form']} (val: {100 * c['under']:.1f}% under)", act,
            [margins._bound(c, r, train.H100_CONTEXT_MIB) for r in test])
    add(ds, "learned mean", act, [p["mean_mib"] for p in lp])
    add(ds, "learned bound", act, lrn_b)
    add(ds, "max(analytic, learned) bounds (rejected)", act, comb)
    add(ds, "FakeTensor-style (traced allocated only)", act, [r["sim_allocated_mib"] for r in test])
    add(ds, "torch max reserved + 612 MiB (oracle-ish)", act, [r["torch_reserved_mib"] + 612 for r in test])
    gact = [r["actual_mib"] for r in gmn_test]
    gp = [learned.predict_features(r["x"], tmp) for r in gmn_test]
    add("GPUMemNet MLP (A100), 20% held out", "learned mean", gact, [p["mean_mib"] for p in gp])
    add("GPUMemNet MLP (A100), 20% held out", "learned bound", gact, [p["max_mib"] * cal["learned_mult"] for p in gp])
    os.remove(tmp)
    with open(os.path.join(GDIR, "paper_results_actual_vs_estimators.csv"), newline="") as fh:
        prow = list(csv.reader(fh))[1:]
    pa = [float(r[2]) for r in prow]
    num = lambda v: float(v) if v.strip() not in ("-", "") else None  # noqa: E731
    for i, name in ((3, "GPUMemNet (published)"), (4, "FakeTensor (published)"), (5, "Horus (published)")):
        add(PAPER_A100, name, pa, [num(r[i]) for r in prow])
    add_paper18(add, GDIR, train.HOPPER_DIR)  # ours on the 18 models (A100 actuals; H100 re-measured)
    with open(os.path.join(GDIR, "related_works_fake_tensor.csv"), newline="") as fh:
        fr = [r for r in csv.DictReader(fh) if r["Max GPU Memory (MiB)"] and r["Last Numeric Value"]]
    add("timm runs (FakeTensor CSV)", "FakeTensor (published)", [float(r["Max GPU Memory (MiB)"]) for r in fr],
        [float(r["Last Numeric Value"]) for r in fr])
    with open(os.path.join(GDIR, "related_works_horus_formula_not_working.csv"), newline="") as fh:
        hr = []
        for r in csv.reader(fh):
            if r and r[0] == "" and hr:
                break
            hr.append(r)
    hr = [r for r in hr[1:] if r[0] and r[5]]
    add("FC on MNIST (Horus CSV)", "Horus (published)", [float(r[0]) for r in hr], [float(r[5]) for r in hr])
    t = Table(title="slurm-coloc estimator accuracy")
    for c in ("data set", "estimator", "rows", "under", "median over", "p90 over", "bin acc (1 GiB)"):
        t.add_column(c)
    for r in res:
        t.add_row(*r)
    Console(width=200).print(t)
    print("calibration:", {k: v for k, v in cal.items() if k not in ("candidates", "combine_candidates")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
