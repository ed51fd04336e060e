"""Run 5's trace replay under the four placement policies on every GPU of the device (issue 32): exclusive, blind
(Slurm's first fit by memory), gate and throughput (coloc-placer with that ``placement_policy``), one after the
other in one device call, as ``colocuser`` through ``coloc-replay run``. Stage 2 of ``placement_replay.sh`` (runs
in the cluster's venv, as root, the cluster already started with typed shards).

Each task runs its own copy of ``job_generic.sh`` (``replay.runner.task_script``: one job signature per task), so
the placer's history of the gate and throughput passes is each task's own exclusive run of this call (activity,
run time and start-up alone, read from the node databases). The placer has the placement benchmark's settings
(``placement_passes.PLACER_CONFIG``). Deadlines: what is left of ``--budget-s`` (less 25 s to collect), split over
the passes still to run, the exclusive pass weighing 2 (one job per GPU at a time).

Writes ``<out>/replay-<mode>.json`` (``coloc-replay run --json``: metrics, per-GPU SM activity, every run with its
GPU), ``placer.log``, and the table (``benchmarks/placement_replay_table.py``): ``replay.md``, ``replay.json``.
``COLOC_BENCH_FAKE_GPUS``: a CPU check of the Slurm parts (jobs sleep 3 s; no NVML, no samples).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

from benchmarks import placement_replay_table as table
from benchmarks.device import placement_passes as pp

HERE = Path(__file__).resolve().parent

ROOT = pp.ROOT
MODES = ("exclusive", "blind", "gate", "throughput")
FAKE_JOB = "#!/bin/bash\n#SBATCH --time=00:05:00\n#SBATCH --cpus-per-task=1\n# fake replay job\nsleep 3\n"


def deadlines(left_s: float, modes: Sequence[str]) -> float:
    """The first mode's deadline (s): ``left_s`` split over ``modes``, an exclusive pass weighing 2."""
    weights = [2.0 if m == "exclusive" else 1.0 for m in modes]
    return max(20.0, left_s * weights[0] / sum(weights))


def replay(mode: str, trace: List[str], job_script: str, deadline_s: float, out: Path) -> int:
    """``coloc-replay run --mode MODE --json`` as colocuser; stdout into ``<out>/replay-<mode>.json``."""
    cmd = ["runuser", "-u", "colocuser", "--", "env", "-i", *[f"{k}={v}" for k, v in pp.user_env().items()],
           f"{ROOT}/venv/bin/coloc-replay", "run", *trace, "--mode", mode, "--deadline-s", f"{deadline_s:.0f}",
           "--job-script", job_script, "--out-dir", str(pp.JOBS), "--json"]
    pp.log(f"{mode}: coloc-replay run ... --mode {mode} --deadline-s {deadline_s:.0f}")
    with open(out / f"replay-{mode}.json", "w") as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.PIPE, text=True, cwd=str(pp.JOBS),
                              timeout=deadline_s + 120)
    sys.stdout.write(proc.stderr[-4000:])
    return proc.returncode


def fill_smact(path: Path, mode: str) -> None:
    """Where coloc-replay (as colocuser) could not read the node database, the SM activity per GPU over the pass
    (first submit -> last end) read here as root (``placement_passes.smact_per_gpu``, node n1)."""
    data = table.load(path)
    m = data.get(mode)
    if not isinstance(m, dict) or any(v is not None for v in (m.get("smact_pct_per_gpu") or {}).values()):
        return
    runs = m.get("runs") or []
    t0 = min((r["submit_ts"] for r in runs if r.get("submit_ts")), default=0.0)
    t1 = max((r["end_ts"] for r in runs if r.get("end_ts")), default=0.0)
    cfg = pp.config_mod.load(f"{ROOT}/etc/coloc.yaml", environ={})
    per = pp.smact_per_gpu(cfg, t0, t1) if t0 and t1 else {}
    m["smact_pct_per_gpu"] = {f"n1:{g}": v for g, v in per.items()}
    vals = [v for v in per.values() if v is not None]
    m["mean_smact_pct"] = m.get("mean_smact_pct") or (sum(vals) / len(vals) if vals else None)
    path.write_text(json.dumps(data, indent=1))


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--started-at", type=float, required=True)
    ap.add_argument("--budget-s", type=float, default=540.0)
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--scale", type=float, default=0.004, help="time and work scale of the trace")
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    a = ap.parse_args(argv)
    out = Path(a.out)
    fake = bool(os.environ.get("COLOC_BENCH_FAKE_GPUS"))
    pp.JOBS.mkdir(parents=True, exist_ok=True)
    job_script = str(ROOT / "src/benchmarks/device/job_generic.sh")
    if fake:
        job_script = str(pp.JOBS / "replay-fake-job.sh")
        Path(job_script).write_text(FAKE_JOB)
        os.chmod(job_script, 0o755)
    pp.configure(None)  # the bench's placer settings; history comes from this call's exclusive pass
    d = ROOT / "carma"
    trace = ["--trace", str(d / "traces/philly_mix-90-tasks.csv"),
             "--catalog", str(d / "workload_catalog_from_rad.csv"),
             "--runtimes", str(d / "exclusive_run_summary.csv"), "--max-tasks", str(a.tasks),
             "--time-scale", str(a.scale), "--work-scale", str(a.scale)]
    for k, mode in enumerate(a.modes):
        left = a.budget_s - (time.time() - a.started_at) - 25
        dl = deadlines(left, a.modes[k:])
        placer = pp.start_placer(out / "placer.log", mode) if mode in ("gate", "throughput") else None
        try:
            rc = replay(mode, trace, job_script, dl, out)
        finally:
            if placer is not None:
                pp.stop_placer(placer)
        pp.log(f"{mode}: coloc-replay exit {rc}, {time.time() - a.started_at:.0f} s since the start")
        fill_smact(out / f"replay-{mode}.json", mode)
    files = [out / f"replay-{m}.json" for m in a.modes if (out / f"replay-{m}.json").exists()]
    res = table.combine([table.load(p) for p in files])
    (out / "replay.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "replay.md").write_text(res["markdown"])
    print(res["markdown"], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
