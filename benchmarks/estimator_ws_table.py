#!/usr/bin/env python3
"""Build the shipped cuDNN workspace table from what the H100 measured (issue 3).

    .venv/bin/python -m benchmarks.estimator_ws_table slurm_coloc/estimate/weights/conv_workspace_h100.npz \
        benchmarks/device/conv_calls.jsonl.gz benchmarks/device/results/h100-conv-ws/conv_ws.csv.gz \
        benchmarks/device/conv_calls_split.jsonl.gz benchmarks/device/results/h100-conv-ws/conv_ws_split.csv.gz

Arguments: the output, then pairs of (calls JSON lines, measured CSV).

Joins each measured call (``benchmarks/device/conv_workspace.py``'s CSV, status ``ok``) with the
sources it was listed for (``benchmarks/estimator_conv_calls.py``) and writes the shipped table
(``workspace.write_npz``: key, ws_b, srcs and each call's precomputed lookup features; rows sorted
by key). An output path not ending in ``.npz`` gets ``key, ws_b, srcs`` as gzip CSV instead.
"""
from __future__ import annotations

import csv
import gzip
import io
import json
import sys


def main() -> int:
    out_path, pairs = sys.argv[1], sys.argv[2:]
    if not pairs or len(pairs) % 2:
        print("usage: estimator_ws_table.py OUT CALLS MEASURED [CALLS MEASURED ...]", file=sys.stderr)
        return 2
    rows = []
    for calls_path, measured_path in zip(pairs[::2], pairs[1::2]):
        srcs = {}
        with gzip.open(calls_path, "rt") as fh:
            for line in fh:
                o = json.loads(line)
                srcs[o["key"]] = ";".join(o["srcs"])
        opener = gzip.open if measured_path.endswith(".gz") else open
        with opener(measured_path, "rt", newline="") as fh:
            for r in csv.DictReader(fh):
                if r["status"] == "ok" and r["key"] in srcs:
                    rows.append((r["key"], int(r["ws_b"]), srcs[r["key"]]))
    rows.sort()
    if out_path.endswith(".npz"):
        from slurm_coloc.estimate.workspace import write_npz

        write_npz(out_path, rows)
        print(f"{len(rows)} measured calls -> {out_path}")
        return 0
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["key", "ws_b", "srcs"])
    w.writerows(rows)
    with open(out_path, "wb") as fo:
        fo.write(gzip.compress(buf.getvalue().encode(), compresslevel=9, mtime=0))
    print(f"{len(rows)} measured calls -> {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
