"""How well the sharing model predicts each job's co-run slowdown with one capacity for all jobs, and with a
factor per job signature learnt from earlier co-runs (issue 32, ninth session): the issue asks for "each job
signature's rate alone and shared"; the product predicts from the rate alone and one fitted capacity.

Not a measurement on its own: a replay of the 2x H100 passes on record. For each pile (its exclusive pass gives
every workload's profile alone, ``placement_share_fit.profiles``), every co-run pass under
``benchmarks/device/results/h100x2-*`` whose workloads all belong to that pile is read once (passes that are
byte-identical copies count once). ``placement_share_fit.corun_rows`` gives each job's predicted training
slowdown (the model with the packaged capacity over the measured computing intervals) and its measured one;
only jobs predicted at least 1.05x slower count (below it the model predicts no sharing loss and a ratio says
little).

Three predictors, each scored leave one pass out (fitted on the other passes, tested on the left-out one), by
mean relative error |predicted - measured| / measured:
- ``model``: the prediction as is;
- ``one factor``: the prediction times the mean measured/predicted ratio of all jobs (a refitted capacity in
  effect);
- ``per signature``: the prediction times the mean ratio of the same workload's jobs (``one factor`` where the
  workload has none).

Usage: ``PYTHONPATH=. python3 -m benchmarks.placement_signature_fit`` (CPU, about 10 s).
"""
from __future__ import annotations

import hashlib
import json
import statistics
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence, Tuple

from benchmarks import placement_share_fit as fitmod
from slurm_coloc.placement import intensity

R = fitmod.HERE / "device" / "results"
PILES = (("issue-sized held-out pile", R / "h100x2-placement-heldout-sized" / "mix-exclusive.json"),
         ("light held-out pile", R / "h100x2-placement-heldout-pile" / "mix-exclusive.json"),
         ("own pile", R / "h100x2-placement-mix-pile" / "mix-exclusive.json"))
MIN_PREDICTED = 1.05
Row = Tuple[int, str, float, float]  # (pass index, workload, predicted, measured training slowdown)


def corun_passes(prof: Mapping[str, Any], root: Path = R) -> List[Dict[str, Any]]:
    """The co-run passes under ``root``'s ``h100x2-*`` folders whose workloads all have a profile in ``prof``
    (exclusive passes and unreadable files left out; identical files once), in path order."""
    seen, out = set(), []
    for p in sorted(root.glob("h100x2-*/**/*.json")):
        raw = p.read_bytes()
        digest = hashlib.sha256(raw).hexdigest()
        try:
            f = json.loads(raw)
        except ValueError:
            continue
        if (digest in seen or not isinstance(f, dict) or f.get("policy") == "exclusive" or not f.get("jobs")
                or not {j.get("workload") for j in f["jobs"]} <= set(prof)):
            continue
        seen.add(digest)
        out.append(f)
    return out


def rows_of(passes: Sequence[Mapping[str, Any]], prof: Mapping[str, Mapping[str, float]],
            capacity: float) -> List[Row]:
    """Every judged job of ``passes`` as ``(pass index, workload, predicted, measured)`` (module docstring)."""
    return [(i, w, pred, meas) for i, f in enumerate(passes)
            for w, pred, meas in fitmod.corun_rows(f, prof, capacity) if pred >= MIN_PREDICTED]


def leave_one_pass_out(rows: Sequence[Row]) -> Dict[str, float]:
    """Mean relative error of the three predictors (module docstring), each left-out pass predicted from the
    others.

    Args:
        rows: ``rows_of``'s output (at least two passes).

    Returns:
        ``{"model", "one_factor", "per_signature"}``: mean relative errors (fractions) over the rows of every
        left-out pass, and ``"rows"``, ``"passes"``: how many.

    Raises:
        ValueError: fewer than two passes in ``rows``.
    """
    passes = sorted({r[0] for r in rows})
    if len(passes) < 2:
        raise ValueError("leave one pass out needs at least two passes")
    err: Dict[str, List[float]] = {"model": [], "one_factor": [], "per_signature": []}
    for k in passes:
        train = [r for r in rows if r[0] != k]
        overall = statistics.fmean(m / p for _, _, p, m in train)
        by_sig = signature_ratios(train)
        for _, w, p, m in (r for r in rows if r[0] == k):
            factor = by_sig[w][0] if w in by_sig else overall
            err["model"].append(abs(p - m) / m)
            err["one_factor"].append(abs(p * overall - m) / m)
            err["per_signature"].append(abs(p * factor - m) / m)
    out = {k: statistics.fmean(v) for k, v in err.items()}
    out.update(rows=float(len(rows)), passes=float(len(passes)))
    return out


def signature_ratios(rows: Sequence[Row]) -> Dict[str, Tuple[float, float, int]]:
    """Per workload: mean and population standard deviation of measured / predicted, and how many jobs."""
    by_sig: Dict[str, List[float]] = {}
    for _, w, p, m in rows:
        by_sig.setdefault(w, []).append(m / p)
    return {w: (statistics.fmean(v), statistics.pstdev(v), len(v)) for w, v in by_sig.items()}


def main() -> int:
    cap = intensity.load_calibration().share_capacity
    print(f"capacity {cap} (calibration.json); jobs predicted >= {MIN_PREDICTED}x; leave one pass out\n")
    print("| pile | passes | jobs | model | x one factor | x per-signature factor |\n|---|---:|---:|---:|---:|---:|")
    first: List[Row] = []
    for name, exclusive in PILES:
        prof = fitmod.profiles([json.loads(exclusive.read_text())])
        rows = rows_of(corun_passes(prof), prof, cap)
        first = first or rows
        e = leave_one_pass_out(rows)
        print(f"| {name} | {e['passes']:.0f} | {e['rows']:.0f} | {e['model']:.3f} | {e['one_factor']:.3f} | "
              f"{e['per_signature']:.3f} |")
    print(f"\n| {PILES[0][0]}: workload | jobs | measured / predicted, mean | sd |\n|---|---:|---:|---:|")
    for w, (mean, sd, n) in sorted(signature_ratios(first).items(), key=lambda kv: -kv[1][0]):
        print(f"| {w} | {n} | {mean:.2f} | {sd:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
