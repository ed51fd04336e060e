"""Probe every corpus script under the GPU machine's Python, then run it for real on the GPU; compare.

For each ``<name>/job.sh`` of the corpus:

(a) the script probe (``probe_script``) with ``--python`` as the job's interpreter (default
    ``/opt/torch/.venv/bin/python3``), so the probe runs under that torch; cache off;
(b) unless ``--no-gpu``: the program itself, with the command the probe found plus ``FEW_STEPS``
    (a few optimizer steps), in a scratch copy of its folder, on the GPU; its last
    ``max_memory_reserved_mib=`` line is the measured peak reserved memory, and ``nvidia-smi``
    sampled every 0.2 s gives the process's peak NVML memory (what the figure bounds).

Prints a table (script, probe figure MiB, probe replayed reserved MiB, measured reserved MiB,
reserved over %, NVML peak MiB, figure over NVML %, probe wall s, reason) and writes the rows as
JSON to ``--out``. Probes run ``--jobs`` at a time, real runs ``--gpu-jobs`` at a time (each
reads its own process's peak; the scripts together fit one 80 GB GPU at 3 at a time), each with
its own time limit, so the 13 scripts finish in about 5 minutes on a 16-core H100 machine.

Usage (repository root)::

    python -m benchmarks.probe_corpus.measure_gpu --out results.json
    .venv/bin/python -m benchmarks.probe_corpus.measure_gpu --no-gpu --python .venv/bin/python
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional

from slurm_coloc.probe.probe import probe_script
from slurm_coloc.probe.runner import OFFLINE_ENV

HERE = os.path.dirname(os.path.abspath(__file__))

# Arguments appended to the job's own command for the real run: a few optimizer steps (argparse: last wins).
FEW_STEPS: Dict[str, List[str]] = {
    "accelerate_cls": ["--max_steps", "8"], "compile_mlp": ["--steps", "8"],
    "convnext_amp": ["--max-steps", "8"], "dcgan": ["--max-steps", "8"], "hf_glue": ["--max_steps", "8"],
    "hf_trainer": ["--max_steps", "3"], "imagenet_resnet": ["--max-steps", "8"],
    "lightning_mnist": ["--max_steps", "8"], "lstm_lm": ["--max-steps", "8"],
    "mnist_cnn": ["--max-steps", "8"], "nanogpt": ["--max_iters=8"],
    "writes_files": ["--steps", "8", "--save-every", "4"],
}
# Scripts whose real run is not measured: the data loader hangs by design (the probe must fall back).
NO_REAL_RUN = {"hang_loader": "data loading hangs by design"}
_PEAK_RE = re.compile(r"max_memory_reserved_mib=([0-9.]+)")


def nvml_peak(pid_root: int, stop: threading.Event, out: Dict[str, float]) -> None:
    """Sample ``nvidia-smi`` every 0.2 s; ``out['mib']`` = peak used memory of ``pid_root``'s processes."""
    while not stop.is_set():
        try:
            text = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                   "--format=csv,noheader,nounits"], capture_output=True, text=True,
                                  timeout=5).stdout
        except (OSError, subprocess.SubprocessError):
            return
        pids = _descendants(pid_root)
        used = sum(float(m) for p, m in (line.split(",") for line in text.strip().splitlines() if "," in line)
                   if int(p) in pids)
        out["mib"] = max(out.get("mib", 0.0), used)
        stop.wait(0.2)


def _descendants(root: int) -> set:
    found = {root}
    try:
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
                if ppid in found:
                    found.add(int(entry))
    except (OSError, ValueError, IndexError):
        pass
    return found


def real_run(name: str, cmd: Any, python: str, timeout_s: float) -> Dict[str, Any]:
    """Run the program for a few steps on the GPU in a scratch copy of its folder."""
    if name in NO_REAL_RUN:
        return {"measured_reason": NO_REAL_RUN[name]}
    if cmd is None:
        return {"measured_reason": "no command found"}
    src = os.path.join(HERE, name)
    work = tempfile.mkdtemp(prefix=f"gpu-{name}-")
    shutil.copytree(src, work, dirs_exist_ok=True)
    target = cmd.target.replace(src, work) if cmd.mode == "file" else cmd.target
    argv = [python] + (["-m", target] if cmd.mode == "module" else [target]) + list(cmd.args)
    argv += FEW_STEPS.get(name, [])
    env = dict(os.environ, **{k: v for k, v in OFFLINE_ENV.items() if k != "CUDA_VISIBLE_DEVICES"})
    env.update(dict(cmd.env))
    env.update(SLURM_SUBMIT_DIR=work, HF_HOME=os.path.join(work, "hf_home"))
    t0 = time.monotonic()
    stop, peak = threading.Event(), {}  # type: ignore[var-annotated]
    try:
        proc = subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, text=True, start_new_session=True)
        sampler = threading.Thread(target=nvml_peak, args=(proc.pid, stop, peak), daemon=True)
        sampler.start()
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            out, _ = proc.communicate()
            return {"measured_reason": f"real run over {timeout_s:g} s", "run_wall_s": timeout_s,
                    "run_tail": out[-1500:]}
        finally:
            stop.set()
            sampler.join(timeout=5)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    found = _PEAK_RE.findall(out or "")
    res: Dict[str, Any] = {"run_wall_s": round(time.monotonic() - t0, 1), "exit": proc.returncode}
    if peak.get("mib"):
        res["nvml_peak_mib"] = round(peak["mib"], 1)
    if found and proc.returncode == 0:
        res["measured_reserved_mib"] = float(found[-1])
    else:
        res["measured_reason"] = f"exit {proc.returncode}, no max_memory_reserved_mib line"
        res["run_tail"] = (out or "")[-1500:]
    return res


def probe_one(name: str, python: str, timeout_s: float) -> Dict[str, Any]:
    d = os.path.join(HERE, name)
    r = probe_script(os.path.join(d, "job.sh"), submit_dir=d, timeout_s=timeout_s, use_cache=False,
                     python=python, keep_log=True)
    row: Dict[str, Any] = {"script": name, "probe_mib": r.estimate.mem_mib if r.estimate else None,
                           "probe_reserved_mib": round(r.detail.get("peak_reserved_b", 0) / 2**20, 1),
                           "probe_wall_s": round(r.wall_s, 1), "reason": r.reason, "ran": r.ran,
                           "torch": r.detail.get("torch"), "notes": r.detail.get("notes", []),
                           "outside_writes": r.detail.get("outside_writes", [])}
    if r.reason:
        row["probe_log_tail"] = r.log_text[-1500:]
    row["_cmd"] = r.command
    return row


def _pct(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return round(100.0 * (a - b) / b, 1) if a is not None and b else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*")
    ap.add_argument("--python", default="/opt/torch/.venv/bin/python3", help="the job's interpreter")
    ap.add_argument("--out", default="", help="write the rows as JSON here")
    ap.add_argument("--no-gpu", action="store_true", help="probe only (no real runs)")
    ap.add_argument("--probe-timeout", type=float, default=90.0)
    ap.add_argument("--run-timeout", type=float, default=150.0)
    ap.add_argument("--jobs", type=int, default=6, help="probes at a time")
    ap.add_argument("--gpu-jobs", type=int, default=3, help="real runs at a time")
    args = ap.parse_args()
    python = os.path.abspath(shutil.which(args.python) or args.python)
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="probe-cache-")
    os.environ["PATH"] = os.path.dirname(python) + os.pathsep + os.environ.get("PATH", "")
    names = args.names or sorted(n for n in os.listdir(HERE) if os.path.isfile(os.path.join(HERE, n, "job.sh")))
    t0 = time.monotonic()
    rows: Dict[str, Dict[str, Any]] = {}
    with cf.ThreadPoolExecutor(args.jobs) as probes, cf.ThreadPoolExecutor(max(1, args.gpu_jobs)) as gpu:
        runs = {}
        futs = {probes.submit(probe_one, n, python, args.probe_timeout): n for n in names}
        for fut in cf.as_completed(futs):
            row = fut.result()
            rows[row["script"]] = row
            if not args.no_gpu:
                runs[row["script"]] = gpu.submit(real_run, row["script"], row["_cmd"], python, args.run_timeout)
        for name, fut in runs.items():
            rows[name].update(fut.result())
    out = []
    for name in names:
        row = rows[name]
        row.pop("_cmd", None)
        row["reserved_over_pct"] = _pct(row.get("probe_reserved_mib") if row.get("probe_mib") else None,
                                        row.get("measured_reserved_mib"))
        row["figure_over_nvml_pct"] = _pct(row.get("probe_mib"), row.get("nvml_peak_mib"))
        out.append(row)
    head = ("script", "probe MiB", "probe rsv", "measured rsv", "rsv over %", "NVML peak", "fig over %",
            "probe s", "reason")

    def cell(v: Any) -> str:
        return "-" if v is None or v == "" else str(v)

    table = [head] + [(r["script"], cell(r.get("probe_mib")), cell(r.get("probe_reserved_mib") if r.get("probe_mib")
                                                                   else None),
                       cell(r.get("measured_reserved_mib")), cell(r.get("reserved_over_pct")),
                       cell(r.get("nvml_peak_mib")), cell(r.get("figure_over_nvml_pct")), cell(r.get("probe_wall_s")),
                       (r.get("reason") or r.get("measured_reason") or "")[:90]) for r in out]
    widths = [max(len(str(t[i])) for t in table) for i in range(len(head))]
    for t in table:
        print("  ".join(str(c).ljust(w) for c, w in zip(t, widths)))
    print(f"\n{sum(1 for r in out if r.get('probe_mib'))}/{len(out)} with a figure; "
          f"{sum(1 for r in out if (r.get('figure_over_nvml_pct') or 0) < 0)} figure(s) under the NVML peak; "
          f"total {time.monotonic() - t0:.0f} s; torch {sorted({str(r.get('torch')) for r in out})}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump({"python": python, "rows": out}, fh, indent=1)


if __name__ == "__main__":
    main()
