"""Probe public training scripts that are not in the repository, then run each on the GPU; compare.

The scripts live outside the repository (e.g. ``.pub/``, an ignored folder holding pytorch/examples fetched
to run beside slurm-coloc, carried to the GPU machine); each ``<root>/<name>/job.sh`` is a batch script as a
user would write it. For each:

(a) the script probe (``probe_script``) with ``--python`` as the job's interpreter, cache off;
(b) unless ``--no-gpu``: the command the probe found, run as it is (no added arguments: the public scripts
    print no memory figure) in a scratch copy of its folder for at most ``--run-s`` seconds (then killed:
    the steady state of a training loop is reached within its first steps), with ``nvidia-smi`` sampled
    every 0.2 s for the process tree's peak NVML memory, the figure the probe's estimate must bound.

Prints a table (script, probe figure MiB, NVML peak MiB, figure over NVML %, probe wall s, how the real run
ended, probe reason) and writes the rows as JSON to ``--out``.

Usage (repository root, GPU machine)::

    PYTHONPATH=$PWD:/tmp/site /opt/torch/.venv/bin/python3 benchmarks/probe_corpus/measure_public.py \
        --root .pub --out $OUT/public.json
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)

from measure_gpu import _pct, nvml_peak  # noqa: E402

from slurm_coloc.probe.probe import probe_script  # noqa: E402
from slurm_coloc.probe.runner import OFFLINE_ENV  # noqa: E402


def probe_one(root: str, name: str, python: str, timeout_s: float) -> Dict[str, Any]:
    d = os.path.join(root, name)
    r = probe_script(os.path.join(d, "job.sh"), submit_dir=d, timeout_s=timeout_s, use_cache=False,
                     python=python, keep_log=True)
    return {"script": name, "probe_mib": r.estimate.mem_mib if r.estimate else None,
            "probe_reserved_mib": round(r.detail.get("peak_reserved_b", 0) / 2**20, 1),
            "probe_wall_s": round(r.wall_s, 1), "reason": r.reason, "ran": r.ran,
            "notes": r.detail.get("notes", []), "_cmd": r.command}


def real_run(root: str, name: str, cmd: Any, python: str, run_s: float) -> Dict[str, Any]:
    """Run the found command as written for at most ``run_s`` s in a scratch copy; NVML peak of its tree."""
    if cmd is None:
        return {"run_end": "no command found"}
    src = os.path.abspath(os.path.join(root, name))
    work = tempfile.mkdtemp(prefix=f"pub-{name}-")
    shutil.copytree(src, work, dirs_exist_ok=True)
    target = cmd.target.replace(src, work) if cmd.mode == "file" else cmd.target
    argv = [python] + (["-m", target] if cmd.mode == "module" else [target]) + list(cmd.args)
    env = dict(os.environ, **{k: v for k, v in OFFLINE_ENV.items() if k != "CUDA_VISIBLE_DEVICES"})
    env.update(dict(cmd.env))
    env.update(SLURM_SUBMIT_DIR=work)
    t0 = time.monotonic()
    stop, peak = threading.Event(), {}  # type: ignore[var-annotated]
    try:
        proc = subprocess.Popen(argv, cwd=cmd.workdir.replace(src, work), env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                                start_new_session=True)
        sampler = threading.Thread(target=nvml_peak, args=(proc.pid, stop, peak), daemon=True)
        sampler.start()
        try:
            out, _ = proc.communicate(timeout=run_s)
            end = f"exit {proc.returncode}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            out, _ = proc.communicate()
            end = f"stopped after {run_s:g} s"
        finally:
            stop.set()
            sampler.join(timeout=5)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"run_end": end, "run_wall_s": round(time.monotonic() - t0, 1),
            "nvml_peak_mib": round(peak["mib"], 1) if peak.get("mib") else None, "run_tail": (out or "")[-800:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*")
    ap.add_argument("--root", required=True, help="folder of <name>/job.sh")
    ap.add_argument("--python", default="/opt/torch/.venv/bin/python3", help="the job's interpreter")
    ap.add_argument("--out", default="")
    ap.add_argument("--no-gpu", action="store_true")
    ap.add_argument("--probe-timeout", type=float, default=60.0)
    ap.add_argument("--run-s", type=float, default=60.0)
    ap.add_argument("--gpu-jobs", type=int, default=3)
    a = ap.parse_args()
    names = a.names or sorted(n for n in os.listdir(a.root) if os.path.isfile(os.path.join(a.root, n, "job.sh")))
    with cf.ThreadPoolExecutor(4) as ex:
        rows: List[Dict[str, Any]] = list(ex.map(lambda n: probe_one(a.root, n, a.python, a.probe_timeout), names))
    if not a.no_gpu:
        with cf.ThreadPoolExecutor(a.gpu_jobs) as ex:
            runs = list(ex.map(lambda r: real_run(a.root, r["script"], r["_cmd"], a.python, a.run_s), rows))
        for r, m in zip(rows, runs):
            r.update(m)
            r["figure_over_nvml_pct"] = _pct(r.get("probe_mib"), r.get("nvml_peak_mib"))
    print(f"{'script':<26}{'probe MiB':>10}{'NVML peak':>10}{'over %':>8}{'probe s':>8}  real run / reason")
    for r in rows:
        r.pop("_cmd", None)
        print(f"{r['script']:<26}{r['probe_mib'] or '-':>10}{r.get('nvml_peak_mib') or '-':>10}"
              f"{r.get('figure_over_nvml_pct') if r.get('figure_over_nvml_pct') is not None else '-':>8}"
              f"{r['probe_wall_s']:>8}  {r.get('run_end', '')} {r['reason']}")
    if a.out:
        with open(a.out, "w") as fh:
            json.dump({"python": a.python, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
