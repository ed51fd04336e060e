"""Fit the capacity of the ``throughput`` policy's sharing model (``slurm_coloc/placement/share.py``) to measured
co-runs, and report its error.

Usage:
  python3 -m benchmarks.placement_share_fit [PASS.json...] [--out slurm_coloc/placement/calibration.json]
Input (default: the H100 passes of 2026-11-24, ``benchmarks/device/results/h100-placement-passes/``): placement
benchmark pass files (``benchmarks/device/placement_bench.py``). The exclusive passes give every workload's
profile alone: SM activity while computing (``alone_activity``, the sampler), start-up (Slurm start to
``t_ready``, the job's own log line) and training time (``t1 - t0``). The co-run passes (blind, gate/aware,
throughput) give, per job, its computing interval (``t_ready`` .. ``t1``) and GPU (``gpu``, else one GPU).
Model: a job computing at time t progresses at ``min(1, capacity / L(t))`` of its speed alone, L(t) = summed SM
activity alone of the jobs computing on its GPU at t. Predicted training slowdown of a job = its training time
alone / the integral of that rate over its measured training interval; measured = its training time / its training
time alone. The capacity with the least mean relative error on a grid 0.50..3.00 (step 0.01) wins. Prints
per-job prediction vs measurement, MAE and mean relative error per pass; ``--out`` writes ``share_capacity``,
``share_source`` and ``share_mre`` into that calibration file (its other keys kept); with ``--gpu NAME``,
``share_capacity_by_gpu[NAME]`` and its source instead (the placer picks it for GPUs whose model name contains
NAME). ``--fallback``: exclusive pass files whose activity alone stands in for workloads the inputs lack.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "device" / "results" / "h100-placement-passes"
DEFAULT_FILES = [RESULTS / f"{n}.json" for n in ("pile-exclusive-part1", "pile-exclusive-part2", "stream-exclusive",
                                                  "pile-blind", "pile-aware", "pile-aware-recent4", "stream-blind",
                                                  "stream-aware")]


def profiles(files: Sequence[Mapping[str, Any]]) -> Dict[str, Dict[str, float]]:
    """Workload -> ``{"smact", "startup_s", "train_s", "run_s", "mem_mib"}`` from the exclusive passes' jobs
    (mean over repeats; jobs without a bench record or activity skipped)."""
    acc: Dict[str, List[Dict[str, float]]] = {}
    for f in files:
        if f.get("policy") != "exclusive":
            continue
        for j in f.get("jobs", []):
            b, act = j.get("bench") or {}, j.get("alone_activity") or {}
            if not (b.get("t1") and b.get("t_ready") and j.get("start_ts") and act.get("smact") is not None):
                continue
            acc.setdefault(j["workload"], []).append(
                {"smact": float(act["smact"]), "startup_s": float(b["t_ready"]) - float(j["start_ts"]),
                 "train_s": float(b["t1"]) - float(b["t0"]), "run_s": float(j["end_ts"]) - float(j["start_ts"]),
                 "mem_mib": float(j.get("mem_mib") or 0)})
    return {w: {k: statistics.fmean(r[k] for r in rs) for k in rs[0]} for w, rs in acc.items()}


def corun_rows(f: Mapping[str, Any], prof: Mapping[str, Mapping[str, float]], capacity: float,
               steps: int = 200) -> List[Tuple[str, float, float]]:
    """``(workload, predicted, measured)`` training slowdown of every job of co-run pass ``f`` whose workload has
    a profile (module docstring)."""
    jobs = [j for j in f.get("jobs", []) if (j.get("bench") or {}).get("t1") and j["workload"] in prof]
    out = []
    for j in jobs:
        if "train_s" not in prof[j["workload"]]:
            continue  # activity only (a fallback profile): counts in the load, not judged
        b = j["bench"]
        t0, t1 = float(b["t0"]), float(b["t1"])
        mates = [o for o in jobs if o.get("gpu") == j.get("gpu")]
        acc = 0.0
        for k in range(steps):
            t = t0 + (t1 - t0) * (k + 0.5) / steps
            load = sum(prof[o["workload"]]["smact"] for o in mates
                       if float(o["bench"]["t_ready"]) <= t <= float(o["bench"]["t1"]))
            acc += min(1.0, capacity / load) if load > 0 else 1.0
        out.append((j["workload"], steps / acc, (t1 - t0) / prof[j["workload"]]["train_s"]))
    return out


def with_fallback(prof: Dict[str, Dict[str, float]], fallback: Mapping[str, Mapping[str, float]]
                  ) -> Dict[str, Dict[str, float]]:
    """``prof`` plus, for workloads it lacks, the SM activity alone of ``fallback`` (no times: counted in the load
    of their GPU, not judged)."""
    out = dict(prof)
    for w, p in fallback.items():
        out.setdefault(w, {"smact": p["smact"]})
    return out


def fit(files: Sequence[Mapping[str, Any]], fallback: Optional[Mapping[str, Mapping[str, float]]] = None
        ) -> Tuple[float, Dict[str, Tuple[float, float, int]]]:
    """(capacity, {pass: (MAE, mean relative error, jobs)}) of the best capacity on the grid."""
    prof = with_fallback(profiles(files), fallback or {})
    coruns = [f for f in files if f.get("policy") not in (None, "exclusive") and f.get("jobs")]
    best: Optional[Tuple[float, float]] = None
    for c in (0.5 + 0.01 * k for k in range(251)):
        rows = [r for f in coruns for r in corun_rows(f, prof, c, 100)]
        mre = statistics.fmean(abs(p - m) / m for _, p, m in rows)
        if best is None or mre < best[1]:
            best = (round(c, 2), mre)
    assert best is not None
    per: Dict[str, Tuple[float, float, int]] = {}
    for f in coruns:
        rows = corun_rows(f, prof, best[0])
        per[str(f.get("pass"))] = (statistics.fmean(abs(p - m) for _, p, m in rows),
                                   statistics.fmean(abs(p - m) / m for _, p, m in rows), len(rows))
    return best[0], per


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", default=[str(p) for p in DEFAULT_FILES])
    ap.add_argument("--out", default=None, help="calibration JSON to update (share_capacity, share_source, share_mre)")
    ap.add_argument("--gpu", default=None, help="with --out: write the fit as share_capacity_by_gpu[GPU] (a part of "
                    "the GPU model name NVML reports, e.g. H200) instead of share_capacity")
    ap.add_argument("--fallback", nargs="*", default=[], help="exclusive pass files whose activity alone stands in "
                    "for workloads the inputs' exclusive passes lack (e.g. a pass cut at its deadline)")
    a = ap.parse_args(argv)
    try:
        files = [json.loads(Path(p).read_text()) for p in a.files]
        fallback = profiles([json.loads(Path(p).read_text()) for p in a.fallback])
    except (OSError, ValueError) as exc:
        print(f"placement_share_fit: cannot read input: {exc}", file=sys.stderr)
        return 1
    for f, p in zip(files, a.files):
        # two files of one pass (a repeat, another host or pile) stay apart: named by their path under results/
        rel = Path(p).resolve()
        f["pass"] = str(rel.relative_to(RESULTS.parent).with_suffix("")) if rel.is_relative_to(RESULTS.parent) \
            else rel.stem
    capacity, per = fit(files, fallback)
    prof = with_fallback(profiles(files), fallback)
    if fallback:
        print("activity alone from the fallback files for: " + ", ".join(sorted(set(prof) - set(profiles(files)))))
    print(f"capacity {capacity:.2f} (summed SM activity alone) over {sum(n for *_, n in per.values())} co-run jobs")
    print("| pass | jobs | MAE (slowdown) | mean relative error |\n|---|---:|---:|---:|")
    for name, (mae, mre, n) in per.items():
        print(f"| {name} | {n} | {mae:.2f} | {100 * mre:.1f}% |")
    rows = [r for f in files if f.get("policy") not in (None, "exclusive") for r in corun_rows(f, prof, capacity)]
    allmre = statistics.fmean(abs(p - m) / m for _, p, m in rows)
    print(f"all: MAE {statistics.fmean(abs(p - m) for _, p, m in rows):.2f}, mean relative error {100 * allmre:.1f}%")
    for f in files:
        if f.get("policy") in (None, "exclusive"):
            continue
        print(f"{f['pass']}: " + ", ".join(f"{w.split(':')[-1]} {p:.2f}/{m:.2f}" for w, p, m in
                                          corun_rows(f, prof, capacity)))
    if a.out:
        path = Path(a.out)
        cal = json.loads(path.read_text())
        source = "benchmarks/placement_share_fit.py over " + ", ".join(
            str(Path(p).resolve().relative_to(HERE.parent)) if Path(p).resolve().is_relative_to(HERE.parent)
            else str(p)
            for p in a.files) + (" (activity alone of missing workloads from " + ", ".join(a.fallback) + ")"
                                 if a.fallback else "")
        if a.gpu:
            cal.setdefault("share_capacity_by_gpu", {})[a.gpu] = capacity
            cal.setdefault("share_by_gpu_source", {})[a.gpu] = {"source": source, "mre": round(allmre, 4)}
        else:
            cal.update({"share_capacity": capacity, "share_mre": round(allmre, 4), "share_source": source})
        path.write_text(json.dumps(cal, indent=1) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
