"""Issue 44's tables: placement passes of one pile (cold, second submission, blind, gate, exclusive FIFO) and the
error of the profiles the placer learned from shared runs against the same jobs' runs truly alone.

Inputs are what the device harness writes (``benchmarks/device/placement_bench.py``): pass files
(``<scenario>-<policy>[-again].json``) and ``state.tgz`` (the call's controller and node databases). The learned
profiles are recomputed here with the product's own code (``store.placement.co_runs`` + ``coruns.learn``)
from the databases of the call whose passes are named by ``--learned-from``, using only those passes' jobs, and
compared per workload with the exclusive pass's ``alone_activity`` (SM activity alone over busy samples, run
time alone from Slurm start to end).

Usage (CPU, seconds): ``.venv/bin/python -m benchmarks.placement_learn PASS.json... --exclusive EXCL.json
[--blind BLIND.json] [--state STATE.tgz --learned-from PASS.json...] [--gpu H200]``
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from benchmarks.device import placement_metrics as pm
from slurm_coloc import coruns as learn
from slurm_coloc.placement import intensity
from slurm_coloc.store import placement as store_placement
from slurm_coloc.store.db import open_readonly


def pass_row(label: str, p: Mapping[str, Any], alone: Mapping[int, float], excl: Optional[Mapping[str, Any]],
             blind: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """One table row: the pass's figures with slowdowns against ``alone`` (job index -> s) and ratios to the
    exclusive FIFO's mean JCT and blind's makespan."""
    m = pm.pass_metrics(p["jobs"], alone, p.get("smact_pct"), p.get("energy_j"))
    per_gpu: Dict[str, int] = {}
    for j in p["jobs"]:
        if j.get("gpu"):
            per_gpu[str(j["gpu"])] = per_gpu.get(str(j["gpu"]), 0) + 1
    row = {"pass": label, **m, "energy_per_job_j": (m["energy_j"] / m["completed"]) if m.get("energy_j") and
           m["completed"] else None, "jobs_per_gpu": "+".join(str(per_gpu[g]) for g in sorted(per_gpu))}
    xm = pm.pass_metrics(excl["jobs"], alone) if excl else None
    bm = pm.pass_metrics(blind["jobs"], alone) if blind else None
    row["jct_vs_exclusive"] = (m["mean_jct_s"] / xm["mean_jct_s"]) if xm and m["mean_jct_s"] else None
    row["makespan_vs_blind"] = (m["makespan_s"] / bm["makespan_s"]) if bm and m["makespan_s"] else None
    return row


def learned_errors(state_tgz: Path, passes: Sequence[Mapping[str, Any]], excl: Mapping[str, Any],
                   gpu: str) -> List[Dict[str, Any]]:
    """Per workload of ``passes``' jobs: the SM activity alone and run time alone learned from those passes'
    shared runs, against the exclusive pass's measured ones."""
    cal = intensity.load_calibration()
    truth = {j["workload"]: j.get("alone_activity") for j in excl["jobs"] if j.get("alone_activity")}
    workload_of = {int(j["job_id"]): j["workload"] for p in passes for j in p["jobs"] if j.get("job_id")}
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(state_tgz) as tf:
            tf.extractall(tmp)  # noqa: S202 - our own harness output
        by_w: Dict[str, List[learn.LearnedRun]] = {}
        for db_path in sorted(Path(tmp, "state", "nodes").glob("*.db")):
            db = open_readonly(db_path)
            m = learn.mixes(db_path.stem, store_placement.co_runs(db, workload_of),
                            lambda j: ((None, workload_of.get(j, f"other:{j}")), cal.smact_floor))
            db.conn.close()
            for r in m.learn(lambda _model: cal.capacity_for(gpu)):
                if r.job_id in workload_of:
                    by_w.setdefault(workload_of[r.job_id], []).append(r)
    out = []
    for w, rs in sorted(by_w.items()):
        t = truth.get(w)
        if not t:
            continue
        run_s = statistics.fmean(r.run_s for r in rs)
        out.append({"workload": w, "shared": sum(r.shared for r in rs), "smact_alone": t["smact"],
                    "identified": abs(rs[0].smact - cal.smact_floor) > 1e-9,
                    "smact_learned": rs[0].smact, "smact_err": rs[0].smact - t["smact"], "run_s_alone": t["run_s"],
                    "run_s_learned": run_s, "run_s_rel_err": (run_s - t["run_s"]) / t["run_s"],
                    "startup_s_alone": t.get("startup_s"), "startup_s_learned": statistics.fmean(
                        r.startup_s for r in rs)})
    return out


def fmt(v: Any, nd: int = 2) -> str:
    return "-" if v is None else (f"{v:.{nd}f}" if isinstance(v, float) else str(v))


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("passes", nargs="+", help="pass files to tabulate (label = the file's pass name)")
    ap.add_argument("--exclusive", required=True, help="the exclusive pass file: times and activity alone")
    ap.add_argument("--blind", default=None, help="the blind pass file: makespan ratio")
    ap.add_argument("--state", default=None, help="state.tgz of the call that ran --learned-from")
    ap.add_argument("--learned-from", nargs="*", default=[], help="pass files whose shared runs are learned from")
    ap.add_argument("--gpu", default="H200", help="the GPU model (capacity of the sharing model)")
    ap.add_argument("--json", default=None, help="also write the figures here")
    a = ap.parse_args(argv)
    excl = json.loads(Path(a.exclusive).read_text())
    blind = json.loads(Path(a.blind).read_text()) if a.blind else None
    alone = pm.alone_times(excl["jobs"])
    rows = [pass_row(json.loads(Path(f).read_text())["pass"], json.loads(Path(f).read_text()), alone, excl, blind)
            for f in [a.exclusive, *([a.blind] if a.blind else []), *a.passes]]
    cols = ("pass", "completed", "ooms", "makespan_s", "makespan_vs_blind", "mean_jct_s", "jct_vs_exclusive",
            "p95_jct_s", "max_run_slowdown", "energy_per_job_j", "jobs_per_gpu")
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(fmt(r.get(c), 0 if c.endswith("_j") else 2) for c in cols) + " |")
    errs: List[Dict[str, Any]] = []
    if a.state and a.learned_from:
        errs = learned_errors(Path(a.state), [json.loads(Path(f).read_text()) for f in a.learned_from], excl,
                              a.gpu)
        print("\n| workload | shared runs | SMACT alone | learned | run s alone | learned | start-up alone | learned |"
              "\n|---|---|---|---|---|---|---|---|")
        for e in errs:
            print(f"| {e['workload']} | {e['shared']} | {e['smact_alone']:.2f} | {e['smact_learned']:.2f} | "
                  f"{e['run_s_alone']:.0f} | {e['run_s_learned']:.1f} | {fmt(e['startup_s_alone'], 1)} | "
                  f"{e['startup_s_learned']:.1f} |")
        if errs:
            print(f"\nSMACT alone: mean absolute error {statistics.fmean(abs(e['smact_err']) for e in errs):.3f} "
                  f"(prior {statistics.fmean(abs(intensity.load_calibration().smact_floor - e['smact_alone']) for e in errs):.3f}); "
                  f"run time alone: mean |relative error| "
                  f"{statistics.fmean(abs(e['run_s_rel_err']) for e in errs):.1%}, "
                  f"worst {max(abs(e['run_s_rel_err']) for e in errs):.1%} over {len(errs)} workloads")
    if a.json:
        Path(a.json).write_text(json.dumps({"passes": rows, "learned": errs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
