"""Stage 2 of ``placement_bench.py`` (runs in the cluster's venv, as root): size the jobs, run every scenario
under every policy through ``coloc-sbatch`` as ``colocuser``, measure, write ``placement_bench.json``.

Definitions (those of ``slurm_coloc.replay.metrics``): JCT = end of the job's last run (OOM rerun included) -
its submit time; makespan = last end - first submit; alone = the job's run time (end - start) in the exclusive
pass, where it had the GPU to itself; slowdown = JCT / alone; mean SM activity = mean GPM SMACT of the GPU's
samples over the pass (%); energy = growth of NVML's energy counter over the pass (J); OOMs = OOM reruns.
Per job alone activity (SMACT/SMOCC/DRAMA means over its exclusive run, from the sampler database) goes into the
JSON for ``benchmarks/placement_fit.py``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from placement_bench import PILE14, ROOT, STREAM  # noqa: E402

from slurm_coloc import config as config_mod  # noqa: E402
from slurm_coloc.placement.daemon import heartbeat_paths, placer_alive  # noqa: E402
from slurm_coloc.replay.metrics import runs_from_records, summarize  # noqa: E402
from slurm_coloc.replay.runner import _energy, open_energy_reader, sm_activity  # noqa: E402
from slurm_coloc.slurm.jobs import squeue_all  # noqa: E402
from slurm_coloc.slurm.parse import FINAL_STATES  # noqa: E402

JOBS = ROOT / "jobs"
POLICIES = ("exclusive", "blind", "aware")
CONTEXT_MIB = 1024  # CUDA context + workspaces on top of the measured peak (slurm_coloc.replay.runner)
SPEEDUP_GUESS = {"exclusive": 1.0, "blind": 0.65, "aware": 0.75}  # pass time / exclusive pass time, for sizing
PLACER_CONFIG = {"placement_window_s": 6, "placement_state_max_age_s": 15, "placement_interval_s": 1,
                 "placement_max_wait_s": 3600}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass
class Job:
    """One job of a scenario: ``index``, ``workload``, arrival ``offset_s``, ``steps`` (or fake seconds)."""

    index: int
    workload: str
    offset_s: float
    steps: int
    alone_guess_s: float
    mem_mib: int


def fit_target_s(scenarios: Sequence[str], budget_left_s: float, overhead_s: float,
                 policies: Sequence[str]) -> float:
    """Seconds alone per job that fill ``budget_left_s`` with every pass (unclamped; may be negative). Pure."""
    n = sum(len(PILE14) if s == "pile" else len(STREAM) for s in scenarios)
    return budget_left_s / max(1.0, sum(SPEEDUP_GUESS[p] for p in policies) * n) - overhead_s


def size_jobs(scenarios: Sequence[str], profile: Dict[str, dict], budget_left_s: float, overhead_s: float,
              target_s: Optional[float], policies: Sequence[str]) -> Dict[str, List[Job]]:
    """Steps per job so that every pass fits ``budget_left_s``: each job trains ``target_s`` alone (computed when
    None: budget / (sum of pass factors x jobs) - per-job overhead, clamped to 3..40 s). Pure."""
    plans = {"pile": [(w, 0.0) for w in PILE14], "stream": list(STREAM)}
    if target_s is None:
        target_s = max(3.0, min(40.0, fit_target_s(scenarios, budget_left_s, overhead_s, policies)))
    out: Dict[str, List[Job]] = {}
    for s in scenarios:
        jobs = []
        for i, (w, off) in enumerate(plans[s]):
            row = profile.get(w) or {}
            step_s = row.get("step_s") or 0.1
            steps = max(5, int(round(target_s / step_s)))
            mem = int(row.get("peak_reserved_mib") or 6144) + CONTEXT_MIB
            jobs.append(Job(i, w, off * target_s, steps, steps * step_s, mem))
        out[s] = jobs
    return out


def pass_estimate_s(jobs: Sequence[Job], policy: str, overhead_s: float) -> float:
    """Expected wall time of one pass (s): the jobs one after another (time alone + overhead each), times the
    policy's guessed factor (``SPEEDUP_GUESS``), and never before the last arrival. Pure."""
    serial = sum(j.alone_guess_s + overhead_s for j in jobs)
    return max(serial * SPEEDUP_GUESS[policy], max((j.offset_s for j in jobs), default=0.0) + overhead_s)


def job_script(workload: str, fake: bool) -> Path:
    """Write (once) the job script of ``workload``: one script per workload, so each has its own SHA-256 and
    coloc-placer's history (keyed by script) tells the models apart."""
    safe = re.sub(r"[^A-Za-z0-9_]", "_", workload)
    path = JOBS / f"pb-{safe}.sh"
    body = ("#!/bin/bash\n#SBATCH --time=00:15:00\n#SBATCH --cpus-per-task=1\n"
            f"# placement benchmark job: {workload}\n")
    if fake:
        body += 'sleep "$1"\necho "COLOC_BENCH {\\"fake\\": true}"\n'
    else:
        body += (f'exec "${{COLOC_BENCH_PY:-/opt/torch/.venv/bin/python3}}" '
                 f'"${{COLOC_BENCH_DIR:-{HERE}}}/workloads.py" {workload} "$@"\n')
    path.write_text(body)
    path.chmod(0o755)
    return path


def user_env() -> Dict[str, str]:
    env = {"PATH": f"{ROOT}/venv/bin:{ROOT}/bin:/usr/local/nvidia/bin:/usr/bin:/bin", "HOME": "/home/colocuser",
           "USER": "colocuser", "LOGNAME": "colocuser", "SLURM_CONF": f"{ROOT}/etc/slurm.conf",
           "COLOC_CONFIG": f"{ROOT}/etc/coloc.yaml", "COLOC_BENCH_DIR": str(ROOT / "src/benchmarks/device"),
           "COLOC_BENCH_PY": os.environ.get("COLOC_BENCH_PYTHON", "/opt/torch/.venv/bin/python3"),
           "PYTHONUNBUFFERED": "1"}
    if os.environ.get("COLOC_BENCH_LD_LIBRARY_PATH"):
        env["LD_LIBRARY_PATH"] = os.environ["COLOC_BENCH_LD_LIBRARY_PATH"]
    return env


def sbatch_args(job: Job, policy: str, scenario: str, fake: bool) -> List[str]:
    """coloc-sbatch arguments of ``job`` under ``policy`` (aware = blind's request; the placer's form comes from
    coloc-sbatch itself when the placer is alive)."""
    gpu = ["--exclusive-gpu"] if policy == "exclusive" else [f"--coloc-mem={job.mem_mib}M"]
    work = [f"{job.alone_guess_s:.1f}"] if fake else ["--steps", str(job.steps), "--warmup-s", "0",
                                                      "--tag", f"{scenario}-{policy}-{job.index}"]
    return ["--parsable", "-J", f"pb-{scenario}-{policy}-{job.index}",
            "-o", f"{JOBS}/pb-{scenario}-{policy}-{job.index}-%j.out", *gpu,
            str(job_script(job.workload, fake)), *work]


def submit(args: List[str]) -> int:
    cmd = ["runuser", "-u", "colocuser", "--", "env", "-i", *[f"{k}={v}" for k, v in user_env().items()],
           f"{ROOT}/venv/bin/coloc-sbatch", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=str(JOBS), timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"coloc-sbatch failed: {proc.stderr.strip()}")
    return int(proc.stdout.strip().split(";")[0])


def slurm_env() -> Dict[str, str]:
    return {**os.environ, "SLURM_CONF": f"{ROOT}/etc/slurm.conf", "COLOC_CONFIG": f"{ROOT}/etc/coloc.yaml"}


def start_placer(out: Path, tag: str) -> subprocess.Popen:
    """``coloc-placer run`` (root) in its own process group; returns once its heartbeat is fresh."""
    cfg = config_mod.load(f"{ROOT}/etc/coloc.yaml", environ={})
    for p in heartbeat_paths(cfg):
        p.unlink(missing_ok=True)
    proc = subprocess.Popen([f"{ROOT}/venv/bin/coloc-placer", "run"], env=slurm_env(),
                            stdout=subprocess.DEVNULL, stderr=open(out / f"placer-{tag}.log", "w"),
                            start_new_session=True)
    for _ in range(150):
        if placer_alive(cfg):
            return proc
        time.sleep(0.2)
    raise RuntimeError(f"coloc-placer gave no heartbeat (see {out}/placer-{tag}.log)")


def stop_placer(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    cfg = config_mod.load(f"{ROOT}/etc/coloc.yaml", environ={})
    for p in heartbeat_paths(cfg):
        p.unlink(missing_ok=True)


def run_pass(scenario: str, policy: str, jobs: List[Job], deadline_s: float, fake: bool,
             out: Path) -> Dict[str, Any]:
    """Submit ``jobs`` at their offsets under ``policy``, wait (cancel at ``deadline_s``), measure."""
    cfg = config_mod.load(f"{ROOT}/etc/coloc.yaml", environ={})
    placer = start_placer(out, scenario) if policy == "aware" else None
    reader = None if fake else open_energy_reader()
    e0 = _energy(reader)
    t0 = time.time()
    job_of: Dict[int, int] = {}
    problems: List[str] = []
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            futs = {}
            for job in sorted(jobs, key=lambda j: j.offset_s):
                delay = t0 + job.offset_s - time.time()
                if delay > 0:
                    time.sleep(delay)
                futs[job.index] = pool.submit(submit, sbatch_args(job, policy, scenario, fake))
            for i, f in futs.items():
                job_of[i] = f.result()
        task_of = {j: i for i, j in job_of.items()}
        while True:
            recs = [r for r in squeue_all(str(ROOT / "bin"), slurm_env()) if runs_from_records([r], task_of)]
            if len(recs) >= len(task_of) and all(r.state in FINAL_STATES for r in recs):
                break
            if time.time() - t0 > deadline_s:
                left = [r.job_id for r in recs if r.state not in FINAL_STATES]
                problems.append(f"deadline {deadline_s:.0f} s: cancelled {left}")
                subprocess.run([f"{ROOT}/bin/scancel", *map(str, left)], env=slurm_env(), check=False)
                time.sleep(2)
                recs = [r for r in squeue_all(str(ROOT / "bin"), slurm_env()) if runs_from_records([r], task_of)]
                break
            time.sleep(0.5)
    finally:
        if placer is not None:
            stop_placer(placer)
    runs = runs_from_records(recs, task_of)
    energy = None
    if reader is not None:
        from slurm_coloc.replay.metrics import energy_growth_j
        energy = energy_growth_j(e0, _energy(reader))
    first = min((r.submit_ts for r in runs if r.submit_ts), default=t0)
    last = max((r.end_ts for r in runs if r.end_ts), default=time.time())
    smact = sm_activity(cfg, recs, first, last)
    per_job = []
    for job in jobs:
        mine = [r for r in runs if r.task == job.index]
        orig = next((r for r in mine if r.retry_of is None), None)
        per_job.append({"index": job.index, "workload": job.workload, "job_id": job_of.get(job.index),
                        "steps": job.steps, "mem_mib": job.mem_mib, "offset_s": job.offset_s,
                        "submit_ts": orig.submit_ts if orig else None, "start_ts": orig.start_ts if orig else None,
                        "end_ts": max((r.end_ts for r in mine), default=None),
                        "state": mine[-1].state if mine else None, "oom_reruns": sum(r.retry_of is not None
                                                                                      for r in mine)})
    waits = 0
    if placer is not None:
        waits = sum(" waits: " in ln for ln in (out / f"placer-{scenario}.log").read_text().splitlines())
    return {"policy": policy, "jobs": per_job, "smact_pct": smact, "energy_j": energy, "problems": problems,
            "placer_wait_notes": waits, "runs": [r.__dict__ for r in runs], "wall_s": time.time() - t0}


def finish_metrics(passes: Dict[str, Dict[str, Any]]) -> None:
    """Add alone times (exclusive run times), slowdowns and the summary metrics to each pass, in place."""
    from slurm_coloc.replay.metrics import RunRecord

    excl = passes.get("exclusive")
    alone = {j["index"]: j["end_ts"] - j["start_ts"] for j in (excl or {}).get("jobs", [])
             if j["state"] == "COMPLETED" and j["start_ts"] and j["end_ts"]}
    for policy, p in passes.items():
        runs = [RunRecord(**r) for r in p["runs"]]
        m = summarize(policy, len(p["jobs"]), runs, p["smact_pct"], p["energy_j"], alone).as_dict()
        slow = []
        for j in p["jobs"]:
            j["alone_s"] = alone.get(j["index"])
            ok = j["state"] == "COMPLETED" and j["submit_ts"] and j["end_ts"]
            j["jct_s"] = (j["end_ts"] - j["submit_ts"]) if ok else None
            j["slowdown"] = (j["jct_s"] / j["alone_s"]) if ok and j["alone_s"] else None
            if j["slowdown"] is not None:
                slow.append(j["slowdown"])
        m["max_slowdown"] = max(slow) if slow else None
        m["mean_slowdown"] = statistics.fmean(slow) if slow else None
        m["ooms"] = m.pop("oom_retries")
        p["metrics"] = m


def targets(passes: Dict[str, Dict[str, Any]]) -> Dict[str, Optional[bool]]:
    """The issue's targets for one scenario (None where a pass is missing)."""
    m = {k: v["metrics"] for k, v in passes.items()}
    ex, bl, aw = m.get("exclusive"), m.get("blind"), m.get("aware")

    def le(a: Any, b: Any, f: float = 1.0) -> Optional[bool]:
        return None if a is None or b is None else a <= f * b
    return {"aware_mean_jct_le_0.8x_exclusive": le(aw and aw["mean_jct_s"], ex and ex["mean_jct_s"], 0.8),
            "aware_mean_jct_le_blind": le(aw and aw["mean_jct_s"], bl and bl["mean_jct_s"]),
            "aware_makespan_le_0.75x_exclusive": le(aw and aw["makespan_s"], ex and ex["makespan_s"], 0.75),
            "aware_no_job_over_3x_alone": le(aw and aw["max_slowdown"], 3.0),
            "aware_0_oom": None if not aw else aw["ooms"] == 0 and aw["lost"] == 0}


def alone_activity(excl: Dict[str, Any]) -> None:
    """Per job of the exclusive pass: mean SMACT/SMOCC/DRAMA (fractions) over its run, from the node database."""
    from slurm_coloc.store.db import open_readonly
    from slurm_coloc.store.placement import alone_activity as query

    cfg = config_mod.load(f"{ROOT}/etc/coloc.yaml", environ={})
    ids = [j["job_id"] for j in excl["jobs"] if j["job_id"]]
    db = open_readonly(cfg.node_db_path("n1"))
    try:
        got = query(db, ids)
    finally:
        db.conn.close()
    for j in excl["jobs"]:
        j["alone_activity"] = got.get(j["job_id"])


def table(result: Dict[str, Any]) -> str:
    cols = ("makespan_s", "mean_jct_s", "p95_jct_s", "p95_slowdown", "max_slowdown", "mean_smact_pct",
            "energy_j", "ooms", "lost")
    lines = []
    for scen, passes in result["scenarios"].items():
        lines.append(f"== {scen} ({len(next(iter(passes.values()))['jobs'])} jobs)")
        lines.append(f"{'policy':<10}" + "".join(f"{c:>15}" for c in cols))
        for pol, p in passes.items():
            m = p["metrics"]
            lines.append(f"{pol:<10}" + "".join(f"{m[c]:>15.2f}" if isinstance(m.get(c), float)
                                                  else f"{str(m.get(c)):>15}" for c in cols))
        lines.append("targets: " + ", ".join(f"{k}={v}" for k, v in result["targets"][scen].items()))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--started-at", type=float, required=True)
    ap.add_argument("--budget-s", type=float, default=520.0)
    ap.add_argument("--scenarios", default="pile,stream")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--target-s", type=float, default=None, help="training seconds of each job alone")
    ap.add_argument("--overhead-s", type=float, default=None, help="per-job start/stop cost assumed in sizing")
    a = ap.parse_args()
    out = Path(a.out)
    fake = bool(os.environ.get("COLOC_BENCH_FAKE_GPUS"))
    scenarios = [s for s in a.scenarios.split(",") if s]
    policies = [p for p in POLICIES if p in a.policies.split(",")]
    profile = json.loads((out / "profile.json").read_text())["rows"]
    with open(f"{ROOT}/etc/coloc.yaml", "a") as fh:
        fh.write("".join(f"{k}: {v}\n" for k, v in PLACER_CONFIG.items()))
    left = a.budget_s - (time.time() - a.started_at) - 25
    overhead = a.overhead_s if a.overhead_s is not None else (2.5 if fake else 6.0)
    skipped_early = []
    while a.target_s is None and len(scenarios) > 1 and fit_target_s(scenarios, left, overhead, policies) < 3.0:
        skipped_early.insert(0, scenarios.pop())  # rather fewer scenarios of real length than all of 3 s jobs
    if skipped_early:
        log(f"budget: {', '.join(skipped_early)} left out (run it in its own call: --scenarios "
            f"{','.join(skipped_early)})")
    plans = size_jobs(scenarios, profile, left, overhead, a.target_s, policies)
    log(f"sizing: {left:.0f} s left; " + "; ".join(f"{s}: " + ", ".join(f"{j.workload}x{j.steps}"
                                                                        for j in js) for s, js in plans.items()))
    result: Dict[str, Any] = {"fake": fake, "profile": profile, "placer_config": PLACER_CONFIG,
                              "budget_s": a.budget_s, "scenarios": {}, "targets": {}}
    est = {(sc, pol): pass_estimate_s(plans[sc], pol, overhead) for sc in scenarios for pol in policies}
    need = sum(est.values())
    if need > left:
        log(f"warning: the passes need about {need:.0f} s, {left:.0f} s are left: scenarios run in order and one "
            "that no longer fits is skipped (run --scenarios pile and --scenarios stream in separate calls)")
    result["skipped"] = list(skipped_early)
    for scen in scenarios:
        remaining = a.budget_s - (time.time() - a.started_at) - 20
        if remaining < 0.8 * sum(est[(scen, p)] for p in policies):
            result["skipped"].append(scen)
            log(f"{scen}: skipped, {remaining:.0f} s left")
            continue
        passes: Dict[str, Dict[str, Any]] = {}
        for pol in policies:
            remaining = a.budget_s - (time.time() - a.started_at) - 20
            later = sum(est[(scen, p)] for p in policies[policies.index(pol) + 1:])
            deadline = max(20.0, min(2.0 * est[(scen, pol)], remaining - 0.8 * later))
            log(f"{scen}/{pol}: {len(plans[scen])} jobs, estimate {est[(scen, pol)]:.0f} s, deadline {deadline:.0f} s")
            passes[pol] = run_pass(scen, pol, plans[scen], deadline, fake, out)
            if pol == "exclusive":
                try:
                    alone_activity(passes[pol])
                except Exception as exc:  # noqa: BLE001 - calibration data missing, the run goes on
                    passes[pol]["problems"].append(f"alone activity unreadable: {exc}")
            log(f"{scen}/{pol}: done in {passes[pol]['wall_s']:.0f} s {passes[pol]['problems'] or ''}")
        finish_metrics(passes)
        result["scenarios"][scen] = passes
        result["targets"][scen] = targets(passes)
        (out / "placement_bench.json").write_text(json.dumps(result, indent=1, default=str))
    text = table(result)
    print(text, flush=True)
    (out / "placement_bench.txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
