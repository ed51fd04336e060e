"""Join the placement benchmark's pass files (one device call each) into the issue's target table.

Usage:
  python3 -m benchmarks.placement_combine PASS.json... [--json combined.json]
Input: the ``<pass>[-partK].json`` files of ``benchmarks/device/placement_bench.py`` (pile/stream x exclusive/
blind/aware, exclusive parts, ``small7-blind.json``, ``small7-aware.json``). Per scenario the exclusive parts are
stitched into one FIFO pass (``placement_metrics.stitch``), whose run times are every job's time alone; every
pass's metrics are then
recomputed from its jobs' Slurm times with those alone times (``placement_metrics.pass_metrics``), and the targets
checked (``placement_metrics.targets``): aware mean JCT <= 0.8x exclusive and <= blind; aware makespan <= 0.75x
exclusive; no aware job ran > 3x its time alone; 0 OOM; and the 7-small-jobs check (kept >= 95% of run 1).
Prints one markdown table per scenario; ``--json`` writes the figures. Exit 1 with one line on unreadable input.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from benchmarks.device import placement_metrics as pm


def combine(files: Sequence[Mapping[str, Any]], gpus: int = 1) -> Dict[str, Any]:
    """``{"scenarios": {scen: {"metrics": {policy: ...}, "targets": {...}, "notes": [...]}}, "small7": ...}``.

    Raises:
        ValueError: a file that is not a pass file (no ``scenario``/``policy``), or the same pass (and part) twice.
    """
    by: Dict[str, Dict[str, List[Mapping[str, Any]]]] = {}
    small7: Dict[str, List[Mapping[str, Any]]] = {"aware": [], "blind": []}
    seen = set()
    for f in files:
        scen, pol = f.get("scenario"), f.get("policy")
        if not isinstance(scen, str) or pol not in ("exclusive", "blind", "aware", "throughput"):
            raise ValueError(f"not a placement pass file (scenario {scen!r}, policy {pol!r})")
        if scen == "small7":  # repeated small7 passes (several calls, or both orders in one) are averaged
            if pol in small7:
                small7[pol].append(f)
            continue
        key = (scen, pol, f.get("part"))
        if key in seen:
            raise ValueError(f"pass {scen}-{pol} (part {f.get('part')}) given twice")
        seen.add(key)
        by.setdefault(scen, {}).setdefault(pol, []).append(f)
    out: Dict[str, Any] = {"scenarios": {}, "small7": None}
    for scen, pols in sorted(by.items()):
        notes: List[str] = []
        passes: Dict[str, Mapping[str, Any]] = {}
        for pol, fs in pols.items():
            fs = sorted(fs, key=lambda f: str(f.get("part") or ""))
            if pol == "exclusive" and (len(fs) > 1 or fs[0].get("part")):
                parts = [f.get("part") for f in fs]
                n = {str(p).split("/")[-1] for p in parts}
                if len(n) != 1 or len(fs) != int(next(iter(n))):
                    notes.append(f"exclusive parts {parts}: not a full set, stitched as given")
                passes[pol] = pm.stitch(fs)
            else:
                if len(fs) > 1:
                    raise ValueError(f"pass {scen}-{pol} given twice")
                passes[pol] = fs[0]
        alone = pm.alone_times(passes["exclusive"]["jobs"]) if "exclusive" in passes else {}
        one_gpu = "exclusive" in passes and len({j.get("gpu") for j in passes["exclusive"]["jobs"]
                                                 if j.get("gpu")}) <= 1
        if gpus > 1 and one_gpu:  # the exclusive FIFO of N GPUs, from the runs alone of a one-GPU pass
            ex = passes["exclusive"]
            gap = pm.fifo_gap_s(ex["jobs"])
            passes["exclusive"] = {**ex, "jobs": pm.fifo_from_alone(ex["jobs"], gpus, gap), "smact_pct": None}
            notes.append(f"exclusive: FIFO on {gpus} GPUs built from the runs alone ({gap:.1f} s between jobs, "
                         "the measured median); energy is the one-GPU pass's (the same runs alone)")
        if not alone:
            notes.append("no exclusive pass: no times alone, no slowdowns")
        metrics = {pol: pm.pass_metrics(p.get("jobs") or [], alone, p.get("smact_pct"), p.get("energy_j"))
                   for pol, p in passes.items()}
        for pol, p in passes.items():
            if p.get("problems"):
                notes.append(f"{pol}: {'; '.join(map(str, p['problems']))}")
            if p.get("fake"):
                notes.append(f"{pol}: fake-GPU run (CPU check), not a measurement")
            if pol in ("aware", "throughput") and p.get("placer"):
                notes.append(f"{pol} placer: {json.dumps(p['placer'], sort_keys=True)}")
            if p.get("smact_pct_per_gpu"):
                notes.append(f"{pol}: SM activity per GPU % " + ", ".join(
                    f"GPU {g} {pm.fmt(v)}" for g, v in sorted(p["smact_pct_per_gpu"].items())))
            where: Dict[str, List[int]] = {}
            for j in p.get("jobs") or []:
                if j.get("gpu") and pol != "exclusive":
                    where.setdefault(str(j["gpu"]), []).append(int(j["index"]))
            if where:
                notes.append(f"{pol}: where each job ran: " + "; ".join(f"{g}: jobs {sorted(v)}"
                                                                        for g, v in sorted(where.items())))
        out["scenarios"][scen] = {"metrics": metrics, "targets": pm.targets(metrics), "notes": notes}
    aware_aggs = [f["aggregate_samples_per_s"] for f in small7["aware"] if f.get("aggregate_samples_per_s")]
    blind_aggs = [f["aggregate_samples_per_s"] for f in small7["blind"] if f.get("aggregate_samples_per_s")]
    if small7["aware"]:
        agg = sum(aware_aggs) / len(aware_aggs) if aware_aggs else None
        out["small7"] = {**pm.small7_check(agg), "fake": any(bool(f.get("fake")) for f in small7["aware"]),
                         "aware_runs": aware_aggs, "blind_runs": blind_aggs}
        if agg and blind_aggs:
            blind_agg = sum(blind_aggs) / len(blind_aggs)
            out["small7"].update(blind_aggregate_samples_per_s=blind_agg, kept_vs_blind=agg / blind_agg,
                                 kept_vs_blind_ge_95pct=agg / blind_agg >= 0.95)
    return out


def render(result: Mapping[str, Any]) -> str:
    """Markdown: per scenario the policy table, the target checks and notes; then the 7-small-jobs check."""
    parts = []
    for scen, r in result["scenarios"].items():
        parts.append(pm.markdown(scen, r["metrics"]))
        parts += [f"- note: {n}" for n in r["notes"]]
        parts.append("")
    s7 = result.get("small7")
    if s7:
        n = len(s7.get("aware_runs") or []) or 1
        parts.append(f"7 small CNNs with the placer ({'mean of ' + str(n) + ' passes' if n > 1 else 'one pass'}): "
                     f"aggregate {pm.fmt(s7['aggregate_samples_per_s'])} samples/s, "
                     f"gain {pm.fmt(s7['gain'])}x over run 1's job alone, {pm.fmt(s7['kept'])} of run 1's "
                     f"aggregate: {'met' if s7['kept_ge_95pct'] else 'NOT met'} (>= 0.95)"
                     + (" (fake-GPU run: CPU check, not a measurement)" if s7.get("fake") else ""))
        if s7.get("kept_vs_blind") is not None:
            blind = pm.fmt(s7["blind_aggregate_samples_per_s"])
            nb = len(s7.get("blind_runs") or [])
            parts.append(f"Same session without the placer (blind, {nb} pass(es)): aggregate {blind} samples/s; "
                         f"with the placer "
                         f"{pm.fmt(s7['kept_vs_blind'])} of it: "
                         f"{'met' if s7['kept_vs_blind_ge_95pct'] else 'NOT met'} (>= 0.95)")
    return "\n".join(parts)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--json", default=None, help="write the combined figures here")
    ap.add_argument("--gpus", type=int, default=1, help="GPUs of the passes: the exclusive FIFO is rebuilt for them")
    a = ap.parse_args(argv)
    try:
        result = combine([json.loads(Path(p).read_text()) for p in a.files], a.gpus)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        print(f"placement_combine: error: {exc}", file=sys.stderr)
        return 1
    print(render(result))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
