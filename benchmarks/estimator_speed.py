#!/usr/bin/env python3
"""coloc-estimate speed (issue 3): wall time of the CLI in a fresh process, cold and from the cache.

Every case runs ``--repeat`` times (default 7) as a subprocess, interpreter start included, and the
table gives median / p90 / min wall seconds and the median CPU seconds (user + sys of the child: a
figure other processes on the machine disturb less than wall time; the load average is printed too).

Cases: ``python -c pass``; ``import torch``; ``import torchvision``; ``coloc-estimate`` for ResNet-50
(3x224x224, batch 32, SGD, fp32, the issue's example) and for a small model (ResNet-18, 3x32x32,
batch 128, Adam), each cold (``--no-cache --no-server``: import torch, trace, replay in-process) and
warm (a cache hit: one untimed run fills the cache first; torch is not imported). Every run gets its
own empty ``XDG_CACHE_HOME`` and ``XDG_RUNTIME_DIR`` in a temporary directory (the warm cases one
shared per case), so the user's cache and estimate server are never touched. Then the warm estimate
server (``slurm_coloc/cli/estimate_daemon.py``): ResNet-50 "cold, server warm" (``--no-cache``, a server
already started and warmed up by an untimed call; its CPU column adds the server's forked request
child, read from the server's ``cutime + cstime``) and "first call (starts server)" (empty cache, no
server: in-process estimate, then the server is spawned in the background; each run's server is
waited for and stopped, untimed, before the next run). Last, the learned model's inference
(``learned.predict`` on ResNet-50's traced features from ``data/hopper/hopper_traces.csv``), in
process, median of ``--calls`` calls.

Targets (issue 3): ResNet-50 ``coloc-estimate`` median <= 1.5 s wall; learned inference <= 5 ms.

    .venv/bin/python -m benchmarks.estimator_speed            # ~5 min on the 2-core machine
    .venv/bin/python -m benchmarks.estimator_speed --repeat 3 --calls 1000
"""
from __future__ import annotations

import argparse
import csv
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

TARGET_CLI_S = 1.5
TARGET_LEARNED_MS = 5.0
RESNET50 = ["--model", "torchvision.models:resnet50", "--input-shape", "3,224,224", "--batch-size", "32",
            "--optimizer", "sgd", "--json"]
RESNET18 = ["--model", "torchvision.models:resnet18", "--input-shape", "3,32,32", "--batch-size", "128",
            "--optimizer", "adam", "--json"]


def _p90(xs: list) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(0.9 * (len(s) - 1))))]


def _run(cmd: list, env: dict) -> tuple:
    """(wall s, child CPU s) of one subprocess run; exits on failure."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _env(home: str) -> dict:
    """The environment of one run: its own cache and runtime (server) directories under ``home``."""
    run_dir = os.path.join(home, "run")
    os.makedirs(run_dir, mode=0o700, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_CURRENT_TEST", "COLOC_ESTIMATE_SERVER")}
    return {**env, "XDG_CACHE_HOME": os.path.join(home, "cache"), "XDG_RUNTIME_DIR": run_dir}


def _server_log(home: str) -> str:
    d = Path(home, "run", "slurm-coloc")
    return "".join(p.read_text() for p in d.glob("*.log")) if d.is_dir() else ""


def _wait_server(home: str, timeout: float = 120) -> int:
    """Pid of the server of ``home`` once it listens (its log says 'start')."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        m = re.search(r"pid=(\d+) start key=", _server_log(home))
        if m:
            return int(m.group(1))
        time.sleep(0.05)
    sys.exit(f"no estimate server started under {home}: {_server_log(home)!r}")


def _stop_server(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(200):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def _children_cpu(pid: int) -> float:
    """CPU seconds (user + sys) of the reaped children of ``pid`` (``/proc/pid/stat`` cutime + cstime)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def time_case(cmd: list, repeat: int, mode: str) -> dict:
    """Run ``cmd`` ``repeat`` times in a fresh process each. ``mode``: ``cold`` (an isolated empty
    home per run), ``warm`` (one home, filled by an untimed first run), ``server`` (one home whose
    server an untimed first run started; waits for it to listen) or ``first`` (an isolated home per
    run; the server that run spawns is waited for and stopped, untimed)."""
    walls, cpus = [], []
    shared = tempfile.mkdtemp(prefix="cs-", dir="/tmp") if mode in ("warm", "server") else None
    server = None
    try:
        if shared:
            _run(cmd, _env(shared))
            if mode == "server":
                server = _wait_server(shared)
        for _ in range(repeat):
            home = shared or tempfile.mkdtemp(prefix="cs-", dir="/tmp")
            try:
                before = _children_cpu(server) if server else 0.0
                w, c = _run(cmd, _env(home))
                if server:
                    time.sleep(1.2)  # the server reaps its request child within its 1 s accept poll
                    c += _children_cpu(server) - before
                if mode == "first":
                    _stop_server(_wait_server(home))
            finally:
                if not shared:
                    shutil.rmtree(home, ignore_errors=True)
            walls.append(w)
            cpus.append(c)
    finally:
        if server:
            _stop_server(server)
        if shared:
            shutil.rmtree(shared, ignore_errors=True)
    return {"median": statistics.median(walls), "p90": _p90(walls), "min": min(walls),
            "cpu": statistics.median(cpus), "n": repeat}


def learned_ms(calls: int) -> dict:
    """Median / p90 / min ms of one ``learned.predict`` call on ResNet-50's traced features (in process)."""
    from benchmarks.estimator import learned
    from benchmarks.estimator.features import COUNT_KEYS
    from slurm_coloc.estimate.spec import ModelSpec
    from slurm_coloc.estimate.trace import TraceResult

    with open(REPO / "data/hopper/hopper_runs.csv", newline="") as fh:
        run = next(r for r in csv.DictReader(fh) if r["model"] == "torchvision.models:resnet50"
                   and r["status"] == "ok")
    with open(REPO / "data/hopper/hopper_traces.csv", newline="") as fh:
        tr = next(t for t in csv.DictReader(fh) if t["config_id"] == run["config_id"])
    spec = ModelSpec(run["model"], tuple(int(d) for d in run["input_shape"].split(",")), int(run["batch_size"]),
                     optimizer=run["optimizer"], precision=run["precision"])
    trace = TraceResult(peak_allocated_b=int(tr["sim_peak_allocated_b"]),
                        peak_reserved_b=int(tr["sim_peak_reserved_b"]),
                        params=int(tr["params"]), param_b=int(tr["param_b"]), buffer_b=0,
                        activations_per_sample=float(tr["acts_per_sample"]),
                        layer_counts={"leaf": int(tr["depth"]), **{k: int(tr[f"n_{k}"]) for k in COUNT_KEYS}},
                        activation_fn=tr["activation"])
    t = time.perf_counter()
    learned.predict(spec, trace, "H100")  # loads the weights (numpy import, npz read): not per call
    first = time.perf_counter() - t
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        learned.predict(spec, trace, "H100")
        times.append((time.perf_counter() - t) * 1000)
    return {"median": statistics.median(times), "p90": _p90(times), "min": min(times), "first_ms": first * 1000,
            "n": calls}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7, help="runs per case (default 7)")
    ap.add_argument("--calls", type=int, default=2000, help="learned-model calls (default 2000)")
    ap.add_argument("--only", nargs="*", help="run only the cases whose name contains one of these words")
    args = ap.parse_args()
    py = sys.executable
    est = str(Path(py).parent / "coloc-estimate")
    cases = [
        ("python -c pass", [py, "-c", "pass"], "cold", None),
        ("python -c 'import torch'", [py, "-c", "import torch"], "cold", None),
        ("python -c 'import torchvision'", [py, "-c", "import torchvision"], "cold", None),
        ("coloc-estimate ResNet-50 cold, in-process (--no-cache --no-server)",
         [est, *RESNET50, "--no-cache", "--no-server"], "cold", TARGET_CLI_S),
        ("coloc-estimate ResNet-50 warm (cache hit)", [est, *RESNET50, "--no-server"], "warm", TARGET_CLI_S),
        ("coloc-estimate ResNet-50 cold, server warm (--no-cache)", [est, *RESNET50, "--no-cache"], "server",
         TARGET_CLI_S),
        ("coloc-estimate ResNet-50 first call (starts server)", [est, *RESNET50], "first", None),
        ("coloc-estimate ResNet-18/32px cold, in-process", [est, *RESNET18, "--no-cache", "--no-server"], "cold",
         None),
        ("coloc-estimate ResNet-18/32px warm (cache hit)", [est, *RESNET18, "--no-server"], "warm", None),
        ("coloc-estimate ResNet-18/32px cold, server warm", [est, *RESNET18, "--no-cache"], "server", None),
    ]
    if args.only:
        cases = [c for c in cases if any(word in c[0] for word in args.only)]
    load0 = os.getloadavg()
    rows = []
    for name, cmd, mode, target in cases:
        r = time_case(cmd, args.repeat, mode)
        print(f"{name}: median {r['median']:.2f} s", file=sys.stderr)
        rows.append((name, r, target, "s"))
    lr = learned_ms(args.calls)
    rows.append((f"learned.predict, in process (first call {lr['first_ms']:.0f} ms)", lr, TARGET_LEARNED_MS, "ms"))
    load1 = os.getloadavg()

    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"coloc-estimate speed: {os.cpu_count()} CPUs, load average {load0[0]:.1f} -> {load1[0]:.1f} "
                    f"(1 min), repeat {args.repeat}")
    for col in ("case", "n", "median", "p90", "min", "CPU median", "target", "verdict"):
        t.add_column(col, justify="left" if col in ("case", "verdict") else "right")
    for name, r, target, unit in rows:
        fmt = (lambda v: f"{v:.2f} s") if unit == "s" else (lambda v: f"{v:.3f} ms")
        verdict = "" if target is None else ("PASS" if r["median"] <= target else "FAIL")
        t.add_row(name, str(r["n"]), fmt(r["median"]), fmt(r["p90"]), fmt(r["min"]),
                  fmt(r["cpu"]) if "cpu" in r else "", "" if target is None else f"<= {fmt(target)}", verdict)
    Console(width=150).print(t)


if __name__ == "__main__":
    main()
