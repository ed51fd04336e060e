"""Stage 2 of ``placement_bench.py`` (runs in the cluster's venv, as root): one or more passes of the placement
benchmark, each over the jobs of ``placement_plan.json``, submitted through ``coloc-sbatch`` as ``colocuser``.

Passes (``<scenario>-<policy>``, scenario ``pile`` or ``stream``, or ``mix`` with ``--plan placement_plan_mix.json``;
and ``small7-aware``):
  exclusive  ``--exclusive-gpu``: one job on the whole GPU at a time, Slurm FIFO; its run times are the times alone;
             ``--part K/N`` runs the K-th of N consecutive slices of the jobs (the pile does not fit one call)
  blind      ``--coloc-mem=<peak + 1 GiB>M``: shards + MPS, Slurm packs by memory only (no placer)
  throughput the same request with ``coloc-placer run`` alive, ``placement_policy: throughput`` (issue 32): the
             placer packs each GPU while the predicted slowdown of its jobs stays within ``placement_max_slowdown``
             (history from ``--alone``: activity, run time and start-up alone per signature)
  aware      (the gate policy) the same request with ``coloc-placer run`` alive (``PLACER_CONFIG``,
             ``placement_policy: gate``): coloc-sbatch submits held for the
             placer, which collocates while the GPU's predicted activity stays under the CARMA gate and otherwise
             leaves the job pending; its predictions come from history: ``--alone`` exclusive pass files give
             every job's measured activity alone by job signature (``placement_history_path``), else the
             calibrated predictor
  split      blind's request submitted held (``--hold``), then every job given, at once after the last submission,
             the GPU that ``--split-gpus`` names for it (job index -> GPU index on ``--split-node``), by the placer's
             own ``slurm.placement.steer``: a fixed placement with every job started on arrival, to measure on the
             device what a split found by ``benchmarks/placement_best_split.py`` gives (no placer)
  small7     7 small CNNs through ``bench.py collocate --coloc-only``, without the placer (``small7-blind``) and
             with it alive (``small7-aware``): run 1's check; kept is judged against run 1's aggregate and, when
             both ran in one call, against the blind pass of the same session (``kept_vs_blind``)
Per pass, ``<out>/<pass>[-partK].json`` (rewritten as the pass goes, so a call cut at its limit keeps what it had):
jobs with Slurm's times, each job's COLOC_BENCH record (start-up and training times), for exclusive passes the
activity alone (``alone_activity``, busy-sample means from the node database) and signature; SM activity and
energy over the pass, the placer's decisions; metrics (``placement_metrics.py``; slowdowns need ``--alone``).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from benchmarks.device import placement_metrics as pm
from benchmarks.device.placement_measure import (  # noqa: F401
    alone_activity,
    alone_from_files,
    history_file,
    history_from_alone,
    job_line,
    measure,
    note_gpus,
    placer_summary,
    smact_per_gpu,
)
from benchmarks.device.placement_plan import PLAN_PATH
from benchmarks.device.placement_split import stand_in, steer_split
from slurm_coloc import config as config_mod
from slurm_coloc.placement import policies
from slurm_coloc.placement.heartbeat import heartbeat_paths, placer_alive
from slurm_coloc.replay.metrics import runs_from_records, sm_activity
from slurm_coloc.replay.runner import _energy, open_energy_reader
from slurm_coloc.slurm.jobs import squeue_all
from slurm_coloc.slurm.parse import FINAL_STATES

SUBMIT: Dict[str, bool] = {"parallel": False}  # --submit parallel
SPLIT: Dict[str, Any] = {"gpus": {}, "node": "n1"}  # --split-gpus (job index -> GPU index), --split-node

ROOT = Path(os.environ.get("COLOC_BENCH_ROOT", "/opt/coloc"))
JOBS = ROOT / "jobs"
# pass policy -> the placer's placement_policy: "aware" for gate (the results' file names), every other
# registered placement policy under its own name
PLACER_POLICY = {"aware": "gate", **{n: n for n in policies.names() if n != "gate"}}
POLICIES = ("exclusive", "blind", *PLACER_POLICY, "split")
# scenarios: the plan's; ``mix`` is the second pile (``placement_mix.py``, ``--plan placement_plan_mix.json``)
# ``<scenario>-throughput-again``: the same pile once more on the same cluster (issue 44's second submission: the
# placer's history is then what it learned from the passes before it in the call)
PASSES = (tuple(f"{s}-{p}" for s in ("pile", "stream", "mix") for p in POLICIES)
          + tuple(f"{s}-throughput-again" for s in ("pile", "mix")) + ("small7-blind", "small7-aware"))
# The placer's settings in the benchmark: a round every 0.5 s (the jobs live 30-50 s; Slurm's sched_interval is
# 1 s in the harness), live state = mean of the last 4 s of samples (0.5-s sampler, written every 2 s), a job
# placed in the last 12 s counts with its predicted activity on top of the live state (placement_recent_s): about
# its start-up (Slurm to Python + set-up, 12-22 s in the H100 exclusive passes), during which the live state does not
# show it yet. H100 pile (docs/benchmarks.md): 4 s (the toy model's choice, ``benchmarks/placement_sim.py``) let
# 10 jobs in during the first start-ups, one job ran 3.17x its time alone; 12 s: 2.45x, mean JCT 120.5 vs 121.5 s.
PLACER_CONFIG: Dict[str, float] = {"placement_window_s": 4, "placement_recent_s": 12, "placement_state_max_age_s": 15,
                 "placement_interval_s": 0.5, "placement_max_wait_s": 3600, "placement_max_slowdown": 2.0}
# No cuDNN autotuning: in the first placement run the pile's jobs ran 39-45 s alone for 4-6 s of training, against
# ~14 s of start-up for the small models of run 1; autotuning every 224x224 convolution in the warm-up steps is the
# suspected part (not isolated: the per-job log line splits the start-up to show it).
CUDNN_ARGS = ["--cudnn-benchmark", "0"]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def part_slice(jobs: Sequence[Dict[str, Any]], part: str) -> List[Dict[str, Any]]:
    """The K-th of N consecutive slices of ``jobs`` (``part`` = ``"K/N"``, 1 <= K <= N), sizes differing by <= 1.

    Raises:
        ValueError: ``part`` is not ``K/N`` with 1 <= K <= N.
    """
    m = re.fullmatch(r"(\d+)/(\d+)", part)
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ValueError(f"--part must be K/N with 1 <= K <= N, got {part!r}")
    k, n = int(m.group(1)), int(m.group(2))
    bounds = [round(i * len(jobs) / n) for i in range(n + 1)]
    return list(jobs[bounds[k - 1]:bounds[k]])


def job_script(workload: str, fake: bool) -> Path:
    """Write the job script of ``workload``: one fixed text per workload, so its SHA-256 (the job signature of a
    comment without a model spec) is the same in every pass and every call, and history carries over."""
    safe = re.sub(r"[^A-Za-z0-9_]", "_", workload)
    path = JOBS / f"pb-{safe}.sh"
    body = ("#!/bin/bash\n#SBATCH --time=00:15:00\n#SBATCH --cpus-per-task=1\n"
            f"# placement benchmark job: {workload}\n")
    if fake:
        body += 'sleep "$2"\necho "COLOC_BENCH {\\"fake\\": true}"\n'
    else:
        body += ('exec "${COLOC_BENCH_PY:-/opt/torch/.venv/bin/python3}" '
                 f'"${{COLOC_BENCH_DIR:-/opt/coloc/src/benchmarks/device}}/workloads.py" {workload} "$@"\n')
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


def sbatch_args(job: Mapping[str, Any], policy: str, scenario: str, fake: bool) -> List[str]:
    """coloc-sbatch arguments of ``job`` under ``policy`` (aware = blind's request; the held form comes from
    coloc-sbatch itself while the placer is alive). Fake jobs sleep their ``train_s`` + 2 s of start-up."""
    gpu = ["--exclusive-gpu"] if policy == "exclusive" else [f"--coloc-mem={job['mem_mib']}M"]
    name = f"pb-{scenario}-{policy}-{job['index']}"
    work = (["--steps", f"{float(job['train_s']) + 2:.1f}"] if fake else
            ["--steps", str(job["steps"]), "--warmup-s", "0", *CUDNN_ARGS, "--tag", name])
    return ["--parsable", "-J", name, "-o", f"{JOBS}/{name}-%j.out", *gpu, str(job_script(job["workload"], fake)),
            *work]


def submit(args: List[str]) -> int:
    cmd = ["runuser", "-u", "colocuser", "--", "env", "-i", *[f"{k}={v}" for k, v in user_env().items()],
           f"{ROOT}/venv/bin/coloc-sbatch", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=str(JOBS), timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"coloc-sbatch failed: {proc.stderr.strip()}")
    return int(proc.stdout.strip().split(";")[0])


def slurm_env() -> Dict[str, str]:
    return {**os.environ, "SLURM_CONF": f"{ROOT}/etc/slurm.conf", "COLOC_CONFIG": f"{ROOT}/etc/coloc.yaml"}


def write_history(history: Mapping[str, Any]) -> Path:
    """The placer's history file (``placement_history_path``): ``history`` is its object (``history_file``:
    ``signatures`` and ``gpu_models``; {}: empty)."""
    path = ROOT / "etc" / "placement_history.json"
    path.write_text(json.dumps({"source": "placement benchmark exclusive passes", "signatures": {}, **history}))
    path.chmod(0o644)
    return path


def configure(history: Optional[Dict[str, Any]]) -> None:
    """Append the placer's settings and the history file (empty without ``--alone``: an exclusive pass of the same
    call fills it for the passes after it) to the harness's coloc.yaml (rewritten at every cluster start)."""
    lines = dict(PLACER_CONFIG)
    lines["placement_history_path"] = str(write_history(history or {}))  # type: ignore[assignment]
    with open(f"{ROOT}/etc/coloc.yaml", "a") as fh:
        fh.write("".join(f"{k}: {v}\n" for k, v in lines.items()))


def start_placer(log_path: Path, policy: str = "gate") -> subprocess.Popen:
    """``coloc-placer run`` (root, ``placement_policy`` = ``policy``) in its own process group; returns once its
    heartbeat is fresh."""
    cfg = config_mod.load(f"{ROOT}/etc/coloc.yaml", environ={})
    for p in heartbeat_paths(cfg):
        p.unlink(missing_ok=True)
    with open(log_path, "a") as fh:
        fh.write(f"=== coloc-placer, placement_policy {policy} ===\n")
    proc = subprocess.Popen([f"{ROOT}/venv/bin/coloc-placer", "run"], env={**slurm_env(),
                            "COLOC_PLACEMENT_POLICY": policy}, stdout=subprocess.DEVNULL,
                            stderr=open(log_path, "a"), start_new_session=True)
    for _ in range(150):
        if placer_alive(cfg):
            return proc
        time.sleep(0.2)
    raise RuntimeError(f"coloc-placer gave no heartbeat (see {log_path})")


def stop_placer(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    cfg = config_mod.load(f"{ROOT}/etc/coloc.yaml", environ={})
    for p in heartbeat_paths(cfg):
        p.unlink(missing_ok=True)


def run_pass(name: str, jobs: List[Dict[str, Any]], deadline_s: float, fake: bool, out: Path,
             alone: Mapping[int, float], part: Optional[str]) -> Dict[str, Any]:
    """Submit ``jobs`` at their offsets, wait until all are final (cancel what is left at ``deadline_s``),
    measure; the pass file is rewritten after the submissions, every 20 s while waiting, and at the end."""
    scenario, policy = name.split("-")[:2]
    file = out / (f"{name}-part{part.split('/')[0]}.json" if part else f"{name}.json")
    result: Dict[str, Any] = {"pass": name, "scenario": scenario, "policy": policy, "part": part, "fake": fake,
                              "placer_config": PLACER_CONFIG if policy in PLACER_POLICY else None, "problems": [],
                              "placer_policy": PLACER_POLICY.get(policy),
                              "complete": False}
    placer_log = out / "placer.log"
    log_offset = placer_log.stat().st_size if placer_log.exists() else 0
    placer = start_placer(placer_log, PLACER_POLICY[policy]) if policy in PLACER_POLICY else None
    reader = None if fake else open_energy_reader()
    e0 = _energy(reader)
    t0 = time.time()
    st: Dict[str, Any] = {"job_of": {}, "gpu_of": {}, "recs": []}

    def save(final: bool = False) -> None:
        if not final:  # the final save keeps the last measurement and what was added to it
            result["jobs"] = measure(jobs, st["job_of"], st["recs"], scenario, policy, st["gpu_of"])
        result["wall_s"] = time.time() - t0
        if final:
            own = pm.alone_times(result["jobs"]) if policy == "exclusive" else alone  # the exclusive pass: its own
            result["metrics"] = pm.pass_metrics(result["jobs"], own, result.get("smact_pct"),
                                                result.get("energy_j"))
        file.write_text(json.dumps(result, indent=1, default=str))
    try:
        if policy == "split":
            stand_in(config_mod.load(f"{ROOT}/etc/coloc.yaml", environ={}), True)
        submit_all(name, jobs, policy, scenario, fake, t0, st)
        wait_all(deadline_s, t0, st, result, save)
    except Exception as exc:  # noqa: BLE001 - keep what was measured
        result["problems"].append(f"pass failed: {exc!r}")
    finally:
        if placer is not None:
            stop_placer(placer)
        if policy == "split":
            stand_in(config_mod.load(f"{ROOT}/etc/coloc.yaml", environ={}), False)
    if reader is not None:
        from slurm_coloc.replay.metrics import energy_growth_j
        result["energy_j"] = energy_growth_j(e0, _energy(reader))
    save()
    finish(result, st["recs"], t0, placer_log if placer is not None else None, log_offset)
    save(final=True)
    return result


def ours(task_of: Mapping[int, int], gpu_of: Dict[int, str]) -> List[Any]:
    """This pass's Slurm records (OOM reruns included); notes each running job's GPU in ``gpu_of``."""
    recs = [r for r in squeue_all(str(ROOT / "bin"), slurm_env()) if runs_from_records([r], task_of)]
    note_gpus(recs, gpu_of)
    return recs


def submit_all(name: str, jobs: Sequence[Dict[str, Any]], policy: str, scenario: str, fake: bool, t0: float,
               st: Dict[str, Any]) -> None:
    """Submit the jobs at their offsets, in plan order (Slurm's FIFO = the plan's); after each, note the GPUs of
    the jobs already running (a short job may end before the last submission). With ``SUBMIT["parallel"]``
    (``--submit parallel``) the jobs of one offset are submitted at once, one ``coloc-sbatch`` each in its own
    thread, as independent users would (not for exclusive passes: their FIFO is the plan's order)."""
    ordered = sorted(jobs, key=lambda j: (j["offset_s"], j["index"]))
    groups = [[j] for j in ordered]
    if SUBMIT["parallel"] and policy != "exclusive":
        groups = [[j for j in ordered if j["offset_s"] == off] for off in sorted({j["offset_s"] for j in ordered})]
    for group in groups:
        delay = t0 + group[0]["offset_s"] - time.time()
        if delay > 0:
            time.sleep(delay)
        with ThreadPoolExecutor(max_workers=len(group)) as pool:
            ids = list(pool.map(lambda job: submit(sbatch_args(job, policy, scenario, fake)), group))
        for job, job_id in zip(group, ids):
            st["job_of"][job["index"]] = job_id
        ours({j: i for i, j in st["job_of"].items()}, st["gpu_of"])
    log(f"{name}: {len(st['job_of'])} jobs submitted in {time.time() - t0:.0f} s")
    if policy == "split":
        stand_in(config_mod.load(f"{ROOT}/etc/coloc.yaml", environ={}), False)
        steer_split(st["job_of"], SPLIT["gpus"], SPLIT["node"], str(ROOT / "bin"), slurm_env())
        log(f"{name}: steered {len(st['job_of'])} jobs in {time.time() - t0:.0f} s: " + ", ".join(
            f"{i}->gpu{SPLIT['gpus'][i]}" for i in sorted(st["job_of"])))


def wait_all(deadline_s: float, t0: float, st: Dict[str, Any], result: Dict[str, Any],
             save: Callable[[], None]) -> None:
    """Poll until every job is final (``complete``), or cancel what is left at the deadline (a problem line);
    ``save`` every 20 s."""
    task_of = {j: i for i, j in st["job_of"].items()}
    last_save = 0.0
    while True:
        st["recs"] = ours(task_of, st["gpu_of"])
        recs = st["recs"]
        if len(recs) >= len(task_of) and all(r.state in FINAL_STATES for r in recs):
            result["complete"] = True
            return
        if time.time() - t0 > deadline_s:
            left = [r.job_id for r in recs if r.state not in FINAL_STATES]
            result["problems"].append(f"deadline {deadline_s:.0f} s: cancelled {left}")
            subprocess.run([f"{ROOT}/bin/scancel", *map(str, left)], env=slurm_env(), check=False)
            time.sleep(2)
            st["recs"] = ours(task_of, st["gpu_of"])
            return
        if time.time() - last_save > 20:
            save()
            last_save = time.time()
        time.sleep(0.5)


def finish(result: Dict[str, Any], recs: Sequence[Any], t0: float, placer_log: Optional[Path],
           log_offset: int) -> None:
    """SM activity over the pass (all GPUs and per GPU), activity alone of an exclusive pass's jobs, the placer's
    counts (``placer_log``: None without a placer)."""
    cfg = config_mod.load(f"{ROOT}/etc/coloc.yaml", environ={})
    ts = [j for j in result["jobs"] if j["submit_ts"]]
    first = min((j["submit_ts"] for j in ts), default=t0)
    last = max((j["end_ts"] or 0 for j in result["jobs"]), default=0) or time.time()
    result["smact_pct"] = sm_activity(cfg, recs, first, last)
    result["smact_pct_per_gpu"] = smact_per_gpu(cfg, first, last)
    if result["policy"] == "exclusive":
        try:
            alone_activity(result["jobs"])
        except Exception as exc:  # noqa: BLE001 - calibration data missing, the run goes on
            result["problems"].append(f"alone activity unreadable: {exc!r}")
    if placer_log is not None:
        result["placer"] = placer_summary(placer_log, log_offset)
        with open(placer_log, "a") as fh:
            fh.write(f"=== end of {result['pass']} ===\n")


def small7(out: Path, deadline_s: float, policy: str = "aware") -> Dict[str, Any]:
    """Run 1's 7 small CNNs, collocated through coloc-sbatch (``bench.py collocate``), with the placer alive
    (``policy`` "aware") or not ("blind"); writes ``<out>/small7-<policy>.json``."""
    name = f"small7-{policy}"
    sub = out / name
    sub.mkdir(parents=True, exist_ok=True)
    placer = start_placer(sub / "placer.log") if policy == "aware" else None
    t0 = time.time()
    try:
        cmd = [sys.executable, "-m", "benchmarks.device.bench", "--out", str(sub), "collocate",
               "--workload", "small_cnn", "--k", "7", "--warmup-s", "3", "--coloc-measure-s", "20",
               "--timeout-s", str(max(30.0, deadline_s - 10)), "--coloc-only"]
        proc = subprocess.run(cmd, env=slurm_env(), capture_output=True, text=True, timeout=deadline_s + 30,
                              cwd=ROOT / "src")  # bench.py of the source tree the cluster runs
        print(proc.stdout[-3000:], proc.stderr[-2000:], flush=True)
    finally:
        if placer is not None:
            stop_placer(placer)
    agg = None
    res = sub / "results.jsonl"
    if res.exists():
        for line in res.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("scenario") == "collocate" and rec.get("workload") == "small_cnn":
                agg = ((rec.get("runs") or {}).get("coloc") or {}).get("aggregate_samples_per_s")
    result = {"pass": name, "scenario": "small7", "policy": policy, "wall_s": time.time() - t0,
              "fake": bool(os.environ.get("COLOC_BENCH_FAKE_GPUS")),
              "placer": placer_summary(sub / "placer.log") if placer is not None else None, **pm.small7_check(agg)}
    blind = out / "small7-blind.json"
    if policy == "aware" and blind.exists() and agg:
        b = json.loads(blind.read_text()).get("aggregate_samples_per_s")
        result["kept_vs_blind"] = agg / b if b else None
    (out / f"{name}.json").write_text(json.dumps(result, indent=1))
    return result


def pass_weight(name: str) -> float:
    """A pass's share of the call's budget relative to the others: 2 for an exclusive pass (its jobs run one per
    GPU: on the 2x H200 run an equal share, 109 s, ended it after 8 of 14 jobs), 1 otherwise."""
    return 2.0 if name.endswith("-exclusive") else 1.0


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("passes", nargs="+", choices=PASSES)
    ap.add_argument("--out", required=True)
    ap.add_argument("--started-at", type=float, required=True)
    ap.add_argument("--budget-s", type=float, default=560.0, help="seconds from stage 1's start to the last write")
    ap.add_argument("--part", default=None, help="K/N: the K-th of N slices of the jobs (exclusive passes)")
    ap.add_argument("--alone", nargs="*", default=[], help="exclusive pass files: history and times alone")
    ap.add_argument("--alone-gpu-models", nargs="*", default=[], metavar="MODEL",
                    help="the GPU model (as NVML names it) of each --alone file, in order, for files whose jobs do "
                         "not record it; the history file then keeps their runs under gpu_models")
    ap.add_argument("--plan", default=str(PLAN_PATH))
    ap.add_argument("--submit", choices=("sequential", "parallel"), default="sequential",
                    help="jobs of one offset one after another (default) or all at once, one thread each")
    ap.add_argument("--split-gpus", default="", metavar="G0,G1,...",
                    help="split passes: the GPU index of each job, by job index (the plan's order)")
    ap.add_argument("--split-node", default="n1", help="split passes: the node whose GPUs --split-gpus names")
    ap.add_argument("--placer-set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="override the placer's settings (PLACER_CONFIG), e.g. placement_recent_s=6")
    a = ap.parse_args(argv)
    SUBMIT["parallel"] = a.submit == "parallel"
    try:
        SPLIT["gpus"] = {k: int(g) for k, g in enumerate(a.split_gpus.split(","))} if a.split_gpus else {}
    except ValueError:
        ap.error(f"--split-gpus {a.split_gpus!r}: comma-separated GPU indexes, one per job")
    if any(n.endswith("-split") for n in a.passes) and any(g < 0 for g in SPLIT["gpus"].values()):
        ap.error("--split-gpus: GPU indexes are >= 0")
    SPLIT["node"] = a.split_node
    out = Path(a.out)
    fake = bool(os.environ.get("COLOC_BENCH_FAKE_GPUS"))
    plan = json.loads(Path(a.plan).read_text())
    alone_files = [json.loads(Path(p).read_text()) for p in a.alone]
    if len(a.alone_gpu_models) > len(alone_files):
        ap.error("--alone-gpu-models: at most one GPU model per --alone file")
    for name in (n for n in a.passes if n.endswith("-split")):  # before anything is written
        jobs = plan["scenarios"][name.split("-")[0]]
        missing = [j["index"] for j in (part_slice(jobs, a.part) if a.part else jobs)
                   if j["index"] not in SPLIT["gpus"]]
        if missing:
            ap.error(f"--split-gpus gives no GPU for job(s) {missing} of {name}")
    history = history_file(alone_files, a.alone_gpu_models)
    for kv in a.placer_set:
        key, _, value = kv.partition("=")
        try:
            if key not in PLACER_CONFIG:
                raise ValueError(key)
            PLACER_CONFIG[key] = float(value)
        except ValueError:
            ap.error(f"--placer-set {kv!r}: KEY=VALUE, a number, KEY one of {', '.join(PLACER_CONFIG)}")
    configure(history)
    log(f"plan {a.plan}: train_s {plan['train_s']}; history of {len(history['signatures'])} signatures "
        f"(and {sorted(history.get('gpu_models', {}))} by GPU model) from {len(alone_files)} file(s)")
    for k, name in enumerate(a.passes):
        left = a.budget_s - (time.time() - a.started_at)
        weights = [pass_weight(n) for n in a.passes[k:]]
        share = left * weights[0] / sum(weights)  # an exclusive pass (one job at a time) weighs 2, others 1
        if name.startswith("small7-"):
            r = small7(out, share - 15, name.split("-")[1])
            log(f"{name}: aggregate {r['aggregate_samples_per_s']}, gain {r['gain']}, kept {r['kept']}, "
                f"kept vs blind {r.get('kept_vs_blind')}")
            continue
        scenario = name.split("-")[0]
        jobs = plan["scenarios"][scenario]
        if a.part:
            jobs = part_slice(jobs, a.part)
        alone = alone_from_files(alone_files, scenario)
        log(f"{name}{' part ' + a.part if a.part else ''}: {len(jobs)} jobs "
            f"({', '.join(j['workload'] + ' x' + str(j['steps']) for j in jobs)}), deadline {share - 25:.0f} s")
        r = run_pass(name, jobs, share - 25, fake, out, alone, a.part)
        alone = pm.alone_times(r["jobs"]) if r["policy"] == "exclusive" else alone
        if r["policy"] == "exclusive":  # its runs alone are the history and the times alone of the passes after it
            alone_files.append(r)
            write_history(history_file(alone_files, a.alone_gpu_models))
        m = r["metrics"]
        log(f"{name}: {'complete' if r['complete'] else 'INCOMPLETE'} in {r['wall_s']:.0f} s; " + ", ".join(
            f"{k} {pm.fmt(m.get(k))}" for k in ("completed", "lost", "ooms", "makespan_s", "mean_jct_s",
                                                  "p95_jct_s", "p95_slowdown", "max_run_slowdown",
                                                  "mean_smact_pct", "energy_j")) + f" {r['problems'] or ''}")
        for j in r["jobs"]:
            log("  " + job_line(j, alone.get(j["index"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
