"""Diagnosis benchmark: jobs with one known problem each, and healthy ones, through the real cluster; per job the
findings of ``coloc-report`` (``slurm_coloc/report/diagnose.py``) against the planted problem.

Usage (root, on the machine where ``cluster_gpu.sh start`` ran; fits one 9-minute device call):
  python3 -m benchmarks.device.diagnose_bench --out $OUT run [--measure-s 35]
  python3 -m benchmarks.device.diagnose_bench --out $OUT calibrate [--measure-s 20]  # no Slurm

``run`` submits, one after another (each alone on the GPU: GPM metrics are per GPU), as ``colocuser`` through
coloc-sbatch: input_bound, fp32_matmul, tiny_batch (``diag_jobs.py``), over_request (ResNet-18/32 with
``#COLOC mem=`` 4x its estimate), and the healthy ResNet-18/32 and ResNet-50/224 of ``workloads.py``; then runs
``coloc-report advise JOBID --json --out $OUT`` for each and writes ``$OUT/diagnose.json`` and ``$OUT/diagnose.txt``
(a table: job, planted problem, findings, pass/fail: the first finding must be the planted one, healthy jobs must
have none; then each job's GPU and CPU figures as the sampler recorded them: training process and loader worker
cores, node/cpu.py) and the advise PNGs (at most 6). The tiny batch (ResNet-50/224, batch 2) must read as
``low-occupancy``, not ``input-bound``: its training process keeps about one core busy and it has no loader worker,
while the input-bound job's one worker is saturated. ``COLOC_BENCH_FAKE_GPUS=1`` (cluster_gpu.sh) runs the Slurm
parts on a CPU-only host: the jobs then run on the CPU, have no GPU samples and get no finding ("evidence thin").

Device call (carry ``.carry`` from build_bundle.sh; about 7 minutes):
  benchmarks/device/cluster_gpu.sh start && cd /opt/coloc/src && /opt/coloc/venv/bin/python3 \
      -m benchmarks.device.diagnose_bench --out $OUT run
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

HERE_SRC = Path(__file__).resolve().parent
# (name, planted finding or None, script kind, job args, extra #COLOC line)
PLAN: List[Tuple[str, Optional[str], str, List[str], str]] = [
    ("input_bound", "input-bound", "diag", ["input_bound"], "#COLOC model=@HERE@/workloads.py:resnet18 "
     "kwarg.classes=10\n#COLOC input=3x224x224 batch=32 optimizer=sgd-momentum precision=fp32"),
    ("fp32_matmul", "no-tensor-cores", "diag", ["fp32_matmul"], "#COLOC model=@HERE@/diag_jobs.py:mlp\n"
     "#COLOC input=4096 batch=1024 optimizer=sgd-momentum precision=fp32"),
    ("tiny_batch", "low-occupancy", "diag", ["tiny_batch"], "#COLOC model=@HERE@/workloads.py:resnet50 "
     "kwarg.classes=1000\n#COLOC input=3x224x224 batch=2 optimizer=sgd-momentum precision=fp32"),
    ("over_request", "over-request", "workload", ["resnet18_32"], "#COLOC mem=@MEM@"),
    ("resnet18_32", None, "workload", ["resnet18_32"], "#COLOC model=@HERE@/workloads.py:resnet18 kwarg.classes=10\n"
     "#COLOC input=3x32x32 batch=32 optimizer=sgd-momentum precision=fp32"),
    ("resnet50_224", None, "workload", ["resnet50_224"], "#COLOC model=@HERE@/workloads.py:resnet50 "
     "kwarg.classes=1000\n#COLOC input=3x224x224 batch=32 optimizer=sgd-momentum precision=fp32"),
]
OVER_REQUEST_MEM = "10G"  # ResNet-18/32 needs about 2.5 GiB alone (docs/benchmarks.md): 4x


FIGURES = ("smact_mean", "smocc_mean", "tensor_mean", "smact_idle_pct", "active_samples", "train_cpu_cores",
           "workers_cpu_cores", "cpu_workers", "job_cpu_cores", "cpus", "cpu_samples")


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def job_script(name: str, kind: str, args: List[str], coloc: str, here: Path, py: str, measure_s: float) -> str:
    """The batch script of one benchmark job (absolute paths: Slurm runs a copy of it)."""
    target = "diag_jobs.py" if kind == "diag" else "workloads.py"
    extra = ["--measure-s", f"{measure_s:g}"] + (["--warmup-s", "3"] if kind == "workload" else [])
    return ("#!/bin/bash\n#SBATCH --job-name=" + name + "\n#SBATCH --time=00:05:00\n#SBATCH --cpus-per-task=4\n"
            + coloc.replace("@HERE@", str(here)).replace("@MEM@", OVER_REQUEST_MEM) + "\n"
            + f"exec {py} {here}/{target} {' '.join(args)} {' '.join(extra)} --tag {name}\n")


def _report(root: Path, argv: List[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "SLURM_CONF": f"{root}/etc/slurm.conf", "COLOC_CONFIG": f"{root}/etc/coloc.yaml"}
    return subprocess.run([f"{root}/venv/bin/coloc-report", *argv], capture_output=True, text=True, env=env,
                          timeout=120)


def table(results: List[Dict[str, Any]]) -> str:
    """``diagnose.txt``: one line per job (planted problem, findings, PASS/FAIL), the recorded figures, the
    findings' evidence and the notes."""
    lines = [f"{'job':<14} {'id':>6} {'state':<10} {'planted':<16} {'findings':<44} result"]
    for r in results:
        lines.append(f"{r['name']:<14} {str(r.get('job_id', '-')):>6} {str(r.get('state', '-')):<10} "
                     f"{str(r['planted'] or 'none'):<16} {','.join(r.get('findings') or []) or 'none':<44} "
                     f"{'skipped' if r.get('skipped') else ('PASS' if r.get('pass') else 'FAIL')}")
    lines.append("figures (SM act./occ./tensor %, idle % of active samples; CPU cores: training process, loader "
                 "workers (count), whole job cgroup; CPUs; CPU samples):")
    for r in results:
        j = (r.get("advice") or {}).get("job") or {}
        lines.append(f"  {r['name']:<14} " + " ".join(f"{k}={_fmt(j.get(k))}" for k in FIGURES))
    for r in results:
        for f in (r.get("advice") or {}).get("findings", []):
            lines.append(f"  {r['name']}: {f.get('name')}: {f.get('evidence')}")
        for n in (r.get("advice") or {}).get("notes", []):
            lines.append(f"  {r['name']}: note: {n}")
    return "\n".join(lines)


def run(a: argparse.Namespace) -> int:
    root = Path(os.environ.get("COLOC_BENCH_ROOT", "/opt/coloc"))
    from benchmarks.device import bench  # the harness's submit/wait helpers (needs COLOC_BENCH_ROOT)

    here = root / "src" / "benchmarks" / "device"
    py = os.environ.get("COLOC_BENCH_PYTHON", "/opt/torch/.venv/bin/python3")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    scripts = Path(bench.JOBS) / "diag-scripts"
    scripts.mkdir(parents=True, exist_ok=True)
    os.chmod(scripts, 0o755)
    results: List[Dict[str, Any]] = []
    t_start = time.time()
    for name, planted, kind, args, coloc in PLAN:
        if getattr(a, "only", None) and name not in a.only:
            continue
        if time.time() - t_start > a.budget_s:
            log(f"{name}: skipped (time budget of {a.budget_s:g} s spent)")
            results.append({"name": name, "planted": planted, "skipped": True})
            continue
        path = scripts / f"{name}.sh"
        path.write_text(job_script(name, kind, args, coloc, here, py, a.measure_s))
        os.chmod(path, 0o755)
        try:
            job = bench.submit("colocuser", str(path), tag=f"diag-{name}")
        except Exception as exc:  # noqa: BLE001 - one failed submission is a result, not the end of the run
            log(f"{name}: submission failed: {exc}")
            results.append({"name": name, "planted": planted, "error": str(exc)[:300]})
            continue
        final = bench.wait([job], timeout_s=a.measure_s + 120, follow_retries=False)
        state = final[job].state if job in final else "?"
        time.sleep(2.0)  # EpilogSlurmctld writes the summary; the node Epilog's is already there
        rep = _report(root, ["advise", str(job), "--json", "--out", str(out)])
        try:
            advice = json.loads(rep.stdout)
        except json.JSONDecodeError:
            advice = {"error": (rep.stderr or rep.stdout).strip()[-300:]}
        findings = [f.get("name") for f in advice.get("findings", [])]
        ok = (findings[:1] == [planted]) if planted else not findings
        results.append({"name": name, "job_id": job, "state": state, "planted": planted, "findings": findings,
                        "pass": ok, "advice": advice})
        cpu_n = (advice.get("job") or {}).get("cpu_samples")
        log(f"{name}: job {job} {state}: findings {findings or 'none'} -> {'PASS' if ok else 'FAIL'}; CPU use "
            f"{'recorded in ' + str(cpu_n) + ' samples' if cpu_n else 'NOT recorded'}")
    (out / "diagnose.json").write_text(json.dumps(results, indent=1, default=str))
    text = table(results)
    (out / "diagnose.txt").write_text(text + "\n")
    print(text)
    return 0 if all(r.get("pass") for r in results) else 1


def calibrate(a: argparse.Namespace) -> int:
    """Each job alone, without Slurm: GPM means, idle share, and the CPU cores of its training process and of its
    loader workers as the sampler reads them (node/cpu.py), JSON lines."""
    from slurm_coloc.node.cpu import CpuReader
    from slurm_coloc.nvml.reader import NvmlReader

    reader = NvmlReader()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, planted, kind, args, _ in PLAN:
        if name == "over_request":
            continue
        target = "diag_jobs.py" if kind == "diag" else "workloads.py"
        extra = ["--measure-s", f"{a.measure_s:g}"] + (["--warmup-s", "3"] if kind == "workload" else [])
        proc = subprocess.Popen([sys.executable, str(HERE_SRC / target), *args, *extra], stdout=subprocess.PIPE,
                                text=True)
        samples = []
        cpu_rows: List[Any] = []
        cpu_reader = CpuReader()
        t0 = time.time()
        while proc.poll() is None:
            time.sleep(0.5)
            fr = reader.read()
            g = fr.gpus[0]
            mine = [p for p in fr.procs if p.pid == proc.pid]
            if mine and time.time() - t0 > 12:  # past start-up and warm-up
                cpu_rows += cpu_reader.read({1: [proc.pid]})
                samples.append((g.smact_pct, g.smocc_pct, g.tensor_pct, g.dram_bw_pct, g.mem_used_mib))
        bench_line = next((ln for ln in (proc.stdout.read() if proc.stdout else "").splitlines()
                           if ln.startswith("COLOC_BENCH ")), "")

        def col(i: int, rows: List[Any] = samples) -> List[float]:
            return [float(s[i]) for s in rows if s[i] is not None]

        def mean(xs: List[float]) -> Optional[float]:
            return round(sum(xs) / len(xs), 2) if xs else None

        sm = col(0)
        row = {"name": name, "planted": planted, "n": len(samples), "smact_mean": mean(sm),
               "smact_p95": sorted(sm)[int(0.95 * (len(sm) - 1))] if sm else None,
               "smact_idle_pct": round(100 * sum(1 for x in sm if x < 1.0) / len(sm), 1) if sm else None,
               "smocc_mean": mean(col(1)), "tensor_mean": mean(col(2)), "dram_mean": mean(col(3)),
               "mem_max_mib": max(col(4), default=None),
               "train_cpu_cores": mean([c.train_cores for c in cpu_rows]),
               "workers_cpu_cores": mean([c.workers_cores for c in cpu_rows if c.workers_cores is not None]),
               "cpu_workers": mean([float(c.workers) for c in cpu_rows if c.workers is not None]),
               "bench": json.loads(bench_line[12:]) if bench_line else None}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "bench"}), flush=True)
    (out / "calibrate.json").write_text(json.dumps(rows, indent=1))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/coloc-out"))
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--measure-s", type=float, default=35.0)
    r.add_argument("--budget-s", type=float, default=400.0, help="submit no new job after this many seconds")
    r.add_argument("--only", nargs="+", default=None, metavar="NAME", help="run only these jobs of PLAN")
    c = sub.add_parser("calibrate")
    c.add_argument("--measure-s", type=float, default=20.0)
    a = ap.parse_args(argv)
    return run(a) if a.cmd == "run" else calibrate(a)


if __name__ == "__main__":
    sys.exit(main())
