"""What a perfect split of blind packing over two GPUs would give (issue 32): for each blind pass, the
makespan if each of two GPUs computed half of blind's work at blind's one-GPU throughput after blind's
start-up.

Estimate (not a bound): ``ready + (makespan - ready) / 2``, where ``makespan`` is blind's (first
submission to last end, s) and ``ready`` the mean time from the first submission to a job's first training
step (``bench.t0``, the job's own clock), i.e. blind's start-up with every job starting at once. The start-up
part does not shrink with a second GPU, so on piles whose start-up is a large part of each run the estimate
sits near or above 0.6x blind. A placement that packs less than blind can beat it by a little (less
contention in start-up and on the GPU); the project's pile did (0.53x measured, 0.54x estimated,
docs/benchmarks.md).

Usage: ``python3 -m benchmarks.placement_split_estimate [blind pass files]`` (default: every ``*blind*.json``
of the 2x H100 placement folders under ``benchmarks/device/results``). CPU, a second.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

RESULTS = Path(__file__).resolve().parent / "device" / "results"


def split_estimate(blind: Dict[str, Any]) -> Tuple[float, float, float]:
    """``(blind makespan s, mean ready-to-train s, two-GPU split estimate s)`` of one blind pass.

    Args:
        blind: a ``placement_bench`` pass file (``jobs`` with ``submit_ts``, ``end_ts`` and ``bench.t0``,
            Unix s).

    Returns:
        The three times in s, from the first submission.

    Raises:
        ValueError: not a JSON object, or no job with a training start (``bench.t0``) and an end.
    """
    if not isinstance(blind, dict):
        raise ValueError("not a pass file (a JSON object with jobs)")
    jobs = blind.get("jobs") or []
    timed = [j for j in jobs if (j.get("bench") or {}).get("t0") and j.get("end_ts")]
    if not timed:
        raise ValueError("no job with bench.t0 and end_ts")
    t0 = min(float(j["submit_ts"]) for j in jobs)
    makespan = max(float(j["end_ts"]) for j in jobs if j.get("end_ts")) - t0
    ready = statistics.fmean(float(j["bench"]["t0"]) - t0 for j in timed)
    return makespan, ready, ready + (makespan - ready) / 2


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path,
                    help="blind pass files (default: the 2x H100 ones on record)")
    args = ap.parse_args(argv)
    files: List[Path] = args.files or sorted(p for p in RESULTS.glob("h100x2-placement*/**/*blind*.json"))
    print("| blind pass | blind makespan s | mean ready-to-train s | two-GPU split s | split / blind |")
    print("|---|---:|---:|---:|---:|")
    bad = 0
    for f in files:
        try:
            makespan, ready, split = split_estimate(json.loads(f.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"placement_split_estimate: {f}: {exc}", file=sys.stderr)
            bad += 1
            continue
        name = str(f.relative_to(RESULTS)) if f.is_relative_to(RESULTS) else str(f)
        print(f"| {name} | {makespan:.0f} | {ready:.1f} | {split:.1f} | {split / makespan:.2f} |")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
