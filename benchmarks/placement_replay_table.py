"""The issue-32 table of a trace replay under several placement policies (``coloc-replay run --json`` files, one
per mode, e.g. from ``benchmarks/device/placement_replay.py``): per policy makespan, mean and p95 JCT, p95 and
worst slowdown vs alone, energy of all GPUs, OOM reruns, SM activity per GPU, and where each task ran.

Slowdown vs alone: a task's time alone is its run (Slurm start -> end) in the exclusive pass of the same call
(``coloc-replay``'s own ``p95_slowdown`` divides by the trace's scaled work instead, without start-up); slowdown =
JCT / alone, run slowdown = (end - start) / alone (the bound of ``placement_max_slowdown`` concerns the latter).

Usage: ``python3 -m benchmarks.placement_replay_table replay-exclusive.json replay-blind.json ... [--out F.md]``
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

ORDER = ("exclusive", "coloc", "blind", "aware", "gate", "throughput")


def load(path: Path) -> Dict[str, Any]:
    """One ``coloc-replay run --json`` file (an empty or broken one: ``{}``, reported as missing)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


def p95(values: Sequence[float]) -> Optional[float]:
    ordered = sorted(values)
    return ordered[max(0, -(-95 * len(ordered) // 100) - 1)] if ordered else None


def per_task(mode: Mapping[str, Any]) -> Dict[int, Dict[str, Any]]:
    """Task -> ``{submit, start, end, completed, reruns, gpus}`` from a mode's ``runs`` (OOM reruns joined)."""
    out: Dict[int, Dict[str, Any]] = {}
    for r in mode.get("runs") or []:
        t = out.setdefault(int(r["task"]), {"submit": None, "start": None, "end": 0.0, "completed": False,
                                            "reruns": 0, "gpus": []})
        if r.get("retry_of") is None:
            t["submit"], t["start"] = r.get("submit_ts") or None, r.get("start_ts") or None
        else:
            t["reruns"] += 1
        t["end"] = max(t["end"], r.get("end_ts") or 0.0)
        t["completed"] = t["completed"] or r.get("state") == "COMPLETED"
        if r.get("gpu"):
            t["gpus"].append(r["gpu"])
    return out


def mode_row(name: str, mode: Mapping[str, Any], alone: Mapping[int, float]) -> Dict[str, Any]:
    """The table's figures for one mode (slowdowns over the completed tasks that have a time alone)."""
    tasks = per_task(mode)
    done = {i: t for i, t in tasks.items() if t["completed"] and t["submit"] and t["end"]}
    slow = [(t["end"] - t["submit"]) / alone[i] for i, t in done.items() if alone.get(i)]
    run_slow = [(t["end"] - t["start"]) / alone[i] for i, t in done.items() if alone.get(i) and t["start"]]
    return {"policy": name, "tasks": mode.get("tasks"), "completed": mode.get("completed"),
            "makespan_s": mode.get("makespan_s"), "mean_jct_s": mode.get("mean_jct_s"),
            "p95_jct_s": mode.get("p95_jct_s"), "p95_slowdown": p95(slow), "max_slowdown": max(slow, default=None),
            "p95_run_slowdown": p95(run_slow), "max_run_slowdown": max(run_slow, default=None),
            "energy_j": mode.get("energy_j"), "oom_reruns": mode.get("oom_retries"),
            "smact_pct_per_gpu": mode.get("smact_pct_per_gpu") or {}, "problems": mode.get("problems") or [],
            "where": {i: sorted(set(t["gpus"])) for i, t in sorted(tasks.items())}}


def fmt(v: Any, d: int = 1) -> str:
    return "-" if v is None else f"{v:.{d}f}" if isinstance(v, float) else str(v)


def markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """The table, then where each task ran per policy, then problems."""
    lines = ["| policy | completed | makespan s | mean JCT s | p95 JCT s | p95 slowdown | p95 / worst run slowdown "
             "| SM activity % per GPU | energy, all GPUs kJ (per task) | OOM reruns |",
             "|---|---:|---:|---:|---:|---:|---|---|---:|---:|"]
    for r in rows:
        per = " / ".join(f"{g} {fmt(v)}" for g, v in r["smact_pct_per_gpu"].items()) or "-"
        e = r["energy_j"]
        energy = "-" if e is None else f"{e / 1000:.1f} ({e / 1000 / max(1, r['completed'] or 1):.2f})"
        lines.append(f"| {r['policy']} | {fmt(r['completed'])} of {fmt(r['tasks'])} | {fmt(r['makespan_s'], 0)} | "
                     f"{fmt(r['mean_jct_s'])} | {fmt(r['p95_jct_s'], 0)} | {fmt(r['p95_slowdown'], 2)} | "
                     f"{fmt(r['p95_run_slowdown'], 2)} / {fmt(r['max_run_slowdown'], 2)} | {per} | {energy} | "
                     f"{fmt(r['oom_reruns'])} |")
    lines.append("")
    for r in rows:
        by: Dict[str, List[int]] = {}
        for i, gs in r["where"].items():
            by.setdefault(",".join(gs) or "GPU not seen", []).append(i)
        lines.append(f"{r['policy']}: where each task ran: "
                     + "; ".join(f"{g}: tasks {v}" for g, v in sorted(by.items())))
    for r in rows:
        for p in r["problems"]:
            lines.append(f"{r['policy']}: problem: {p}")
    return "\n".join(lines) + "\n"


def combine(files: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """Rows of every mode found in ``files`` (in ``ORDER``), times alone from the exclusive pass, the markdown."""
    modes: Dict[str, Mapping[str, Any]] = {}
    for f in files:
        for m in ORDER:
            if isinstance(f.get(m), dict):
                modes[m] = f[m]
    excl = per_task(modes.get("exclusive", {}))
    alone = {i: t["end"] - t["start"] for i, t in excl.items() if t["completed"] and t["start"] and t["end"]}
    rows = [mode_row(m, modes[m], alone) for m in ORDER if m in modes]
    return {"alone_s": alone, "rows": rows, "markdown": markdown(rows),
            "mean_alone_s": statistics.fmean(alone.values()) if alone else None}


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--out", default=None, help="also write the markdown here")
    a = ap.parse_args(argv)
    res = combine([load(Path(p)) for p in a.files])
    print(res["markdown"], end="")
    if a.out:
        Path(a.out).write_text(res["markdown"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
