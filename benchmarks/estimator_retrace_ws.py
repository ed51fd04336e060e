#!/usr/bin/env python3
"""Re-trace every data-set row that has convolutions with the cuDNN workspace replayed (issue 3).

    .venv/bin/python -W ignore -m benchmarks.estimator_retrace_ws data/hopper/hopper_runs.csv \
        data/hopper/hopper_traces.csv --jobs 2 [--table path.csv.gz]

Adds (or refreshes) three columns of the traces file: ``sim_peak_allocated_ws_b``,
``sim_peak_reserved_ws_b`` (the replay with each convolution's workspace) and ``ws_max_b`` (the
largest single workspace). Rows without convolutions get their workspace-free figures (with
``--amp``: every AMP row is traced again, convolutions or not, the others are kept).

**Leave-own-family-out**: a row is traced with the measured table *minus* the calls measured only
for its own family (``workspace.load(exclude_srcs={"hopper:<family>"})``, ``paper18`` for the 18
real models), so that its figures show what the estimator does for a model whose layers the table
has never seen. The calibration and the evaluation (``estimator/train.py``, ``estimator_eval.py``)
use these columns; a user's job is traced with the whole table. ``--table`` points at a table
other than the shipped one (e.g. freshly measured).
"""
from __future__ import annotations

import argparse
import csv
import multiprocessing as mp
import os
import sys
import time
from typing import Dict, List, Tuple

WS_FIELDS = ["sim_peak_allocated_ws_b", "sim_peak_reserved_ws_b", "ws_max_b"]


def _init(table: str) -> None:
    if table:
        from slurm_coloc.estimate import workspace

        workspace.TABLE_FILE = table


def _one(job: Tuple[dict, str]) -> Tuple[str, Dict[str, object], float]:
    row, family = job
    from benchmarks.estimator_featurize import spec_of
    from slurm_coloc.errors import EstimateError
    from slurm_coloc.estimate import workspace
    from slurm_coloc.estimate.trace import trace_spec

    src = "paper18" if family == "paper18" else f"hopper:{family}"
    model = workspace.load({src})
    t0 = time.time()
    try:
        tr = trace_spec(spec_of(row), workspace=model.bytes_for if model else None)
        out: Dict[str, object] = {"sim_peak_allocated_ws_b": tr.peak_allocated_b,
                                  "sim_peak_reserved_ws_b": tr.peak_reserved_b, "ws_max_b": tr.conv_workspace_max_b}
    except EstimateError:
        out = {}
    return row["config_id"], out, time.time() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs")
    ap.add_argument("traces")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--table", default="")
    ap.add_argument("--limit", type=int, default=0, help="only the first N rows with convolutions (a check)")
    ap.add_argument("--amp", action="store_true",
                    help="re-trace only the AMP (amp-fp16, bf16) rows, with or without convolutions "
                         "(after a change to the AMP trace alone)")
    args = ap.parse_args()
    with open(args.runs, newline="") as fh:
        runs = {r["config_id"]: r for r in csv.DictReader(fh)}
    with open(args.traces, newline="") as fh:
        reader = csv.DictReader(fh)
        fields = list(reader.fieldnames or [])
        traces = list(reader)
    for f in WS_FIELDS:
        if f not in fields:
            fields.append(f)
    jobs: List[Tuple[dict, str]] = []
    for t in traces:
        r = runs.get(t["config_id"])
        if r is None or t.get("error"):
            continue
        if args.amp:
            if r["precision"] in ("amp-fp16", "bf16"):
                jobs.append((r, r["family"]))
        elif t.get("n_conv", "1") in ("0", ""):
            t.update(sim_peak_allocated_ws_b=t["sim_peak_allocated_b"], sim_peak_reserved_ws_b=t["sim_peak_reserved_b"],
                     ws_max_b=0)
        else:
            jobs.append((r, r["family"]))
    if args.limit:
        jobs = jobs[: args.limit]
    t0 = time.time()
    by_id = {t["config_id"]: t for t in traces}
    with mp.get_context("fork").Pool(args.jobs, initializer=_init, initargs=(args.table,)) as pool:
        for i, (cid, out, _s) in enumerate(pool.imap_unordered(_one, jobs, chunksize=4)):
            by_id[cid].update(out)
            if i % 100 == 0:
                print(f"{i}/{len(jobs)} rows, {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    tmp = args.traces + ".tmp"
    with open(tmp, "w", newline="") as fh:
        w = csv.DictWriter(fh, fields)
        w.writeheader()
        w.writerows(traces)
    os.replace(tmp, args.traces)
    print(f"{len(jobs)} rows re-traced with workspaces in {time.time() - t0:.0f} s -> {args.traces}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
