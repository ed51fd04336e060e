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

    PYTHONPATH=$PWD:/tmp/site /opt/torch/.venv/bin/python3 -m benchmarks.probe_corpus.measure_public \
        --root .pub --out $OUT/public.json [--cudnn-benchmark off|on] [NAME...]
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
from typing import Any, Dict, List

from benchmarks.probe_corpus.measure_gpu import _pct, nvml_peak
from slurm_coloc.probe.probe import probe_script
from slurm_coloc.probe.runner import OFFLINE_ENV

HERE = os.path.dirname(os.path.abspath(__file__))


def probe_one(root: str, name: str, python: str, timeout_s: float) -> Dict[str, Any]:
    d = os.path.join(root, name)
    r = probe_script(os.path.join(d, "job.sh"), submit_dir=d, timeout_s=timeout_s, use_cache=False,
                     python=python, keep_log=True)
    return {"script": name, "probe_mib": r.estimate.mem_mib if r.estimate else None,
            "probe_reserved_mib": round(r.detail.get("peak_reserved_b", 0) / 2**20, 1),
            "probe_wall_s": round(r.wall_s, 1), "reason": r.reason, "ran": r.ran,
            "notes": r.detail.get("notes", []), "_cmd": r.command}


_RESERVED_RE = re.compile(r"pub_max_memory_reserved_mib=([0-9.]+)")
# Put first on the program's PYTHONPATH: prints the peak reserved memory when the program ends (atexit, or
# SIGTERM-free: a killed run prints nothing, its NVML peak stands alone); PUB_CUDNN_BENCHMARK=0|1 forces
# torch.backends.cudnn.benchmark whatever the script sets (to measure its cost).
SITECUSTOMIZE = """
import atexit, os, sys, threading, time
def _peak():
    t = sys.modules.get("torch")
    if t is not None and t.cuda.is_initialized():
        print(f"pub_max_memory_reserved_mib={t.cuda.max_memory_reserved() / 2**20:.1f}", flush=True)
atexit.register(_peak)
def _every():
    while True:
        time.sleep(5)
        _peak()
threading.Thread(target=_every, daemon=True).start()
_force = os.environ.get("PUB_CUDNN_BENCHMARK")
if _force is not None:
    import torch.backends.cudnn as _c
    _orig = type(_c).__dict__["benchmark"]
    class _Flag:
        def __get__(self, obj, typ=None): return _orig.__get__(obj, typ)
        def __set__(self, obj, value): _orig.__set__(obj, _force == "1")
    type(_c).benchmark = _Flag()
    _c.benchmark = True
"""


def real_run(root: str, name: str, cmd: Any, python: str, run_s: float,
             cudnn_benchmark: Any = None) -> Dict[str, Any]:
    """Run the found command as written for at most ``run_s`` s in a scratch copy of ``root``; NVML peak of its
    process tree and the peak reserved memory it printed last (``SITECUSTOMIZE``)."""
    if cmd is None:
        return {"run_end": "no command found"}
    src_root = os.path.abspath(root)
    base = tempfile.mkdtemp(prefix=f"pub-{name}-")
    shutil.copytree(src_root, base, dirs_exist_ok=True)  # the whole root: ../data as beside the script
    src, work = os.path.join(src_root, name), os.path.join(base, name)
    target = cmd.target.replace(src, work) if cmd.mode == "file" else cmd.target
    site = os.path.join(base, "_site")  # sitecustomize: the process's peak reserved memory at its exit
    os.makedirs(site, exist_ok=True)
    with open(os.path.join(site, "sitecustomize.py"), "w") as fh:
        fh.write(SITECUSTOMIZE)
    argv = [python] + (["-m", target] if cmd.mode == "module" else [target]) + list(cmd.args)
    env = dict(os.environ, **{k: v for k, v in OFFLINE_ENV.items() if k != "CUDA_VISIBLE_DEVICES"})
    env.update(dict(cmd.env))
    env.update(SLURM_SUBMIT_DIR=work, PYTHONPATH=os.pathsep.join(
        p for p in (site, env.get("PYTHONPATH", "")) if p))
    if cudnn_benchmark is not None:
        env["PUB_CUDNN_BENCHMARK"] = "1" if cudnn_benchmark else "0"
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
        shutil.rmtree(base, ignore_errors=True)
    found = _RESERVED_RE.findall(out or "")
    return {"run_end": end, "run_wall_s": round(time.monotonic() - t0, 1),
            "nvml_peak_mib": round(peak["mib"], 1) if peak.get("mib") else None,
            "measured_reserved_mib": float(found[-1]) if found else None, "run_tail": (out or "")[-800:]}


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
    ap.add_argument("--cudnn-benchmark", choices=("script", "off", "on"), default="script",
                    help="real runs: torch.backends.cudnn.benchmark as the script sets it, or forced")
    a = ap.parse_args()
    names = a.names or sorted(n for n in os.listdir(a.root) if os.path.isfile(os.path.join(a.root, n, "job.sh")))
    with cf.ThreadPoolExecutor(4) as ex:
        rows: List[Dict[str, Any]] = list(ex.map(lambda n: probe_one(a.root, n, a.python, a.probe_timeout), names))
    if not a.no_gpu:
        with cf.ThreadPoolExecutor(a.gpu_jobs) as ex:
            force = None if a.cudnn_benchmark == "script" else a.cudnn_benchmark == "on"
            runs = list(ex.map(lambda r: real_run(a.root, r["script"], r["_cmd"], a.python, a.run_s, force), rows))
        for r, m in zip(rows, runs):
            r.update(m)
            r["figure_over_nvml_pct"] = _pct(r.get("probe_mib"), r.get("nvml_peak_mib"))
    print(f"{'script':<26}{'probe MiB':>10}{'probe rsv':>10}{'real rsv':>10}{'NVML peak':>10}{'over %':>8}"
          f"{'probe s':>8}  real run / reason")
    for r in rows:
        r.pop("_cmd", None)
        print(f"{r['script']:<26}{r['probe_mib'] or '-':>10}{r['probe_reserved_mib']:>10}"
              f"{r.get('measured_reserved_mib') or '-':>10}{r.get('nvml_peak_mib') or '-':>10}"
              f"{r.get('figure_over_nvml_pct') if r.get('figure_over_nvml_pct') is not None else '-':>8}"
              f"{r['probe_wall_s']:>8}  {r.get('run_end', '')} {r['reason']}")
    if a.out:
        with open(a.out, "w") as fh:
            json.dump({"python": a.python, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
