#!/usr/bin/env python3
"""Steady-state cost of the node sampler loop on the NVML replay (issue 4; runs anywhere, no GPU needed).

Starts ``coloc-sampler run --replay tests/data/nvml/h100_mps_2jobs.jsonl`` (the real CLI, real SQLite, default
``sampler_batch_s`` unless ``--batch-s``) in a subprocess for each ``--interval-s``, waits ``--settle-s`` (start-up:
interpreter, imports, database creation), then measures over ``--seconds``:

- CPU ms per second of the sampler process: utime + stime delta from ``/proc/<pid>/stat`` (as
  benchmarks/sampler_overhead.py; clock ticks, so +-10 ms over the segment) and the precise on-CPU time from
  ``/proc/<pid>/task/*/schedstat`` (ns);
- wake-ups per second: delta of voluntary context switches summed over the process's threads
  (``/proc/<pid>/task/*/status``; every sleep that ends, every blocking syscall that waits, counts one);
- rows written: ``gpu_samples`` and ``proc_samples`` rows in the node database after the run (whole run).

The replay leaves out pynvml itself (on the H100 one ``NvmlReader.read()`` costs about 6 ms of CPU, 3-5 ms of it
the energy counter: benchmarks/device/nvml_call_cost.py), so these figures are the sampler's own share.
``--src DIR`` runs the package found in DIR instead (e.g. an export of an older commit) to compare before/after.
``--job-trees N`` maps the recording's two CUDA pids (jobs 9101, 9102) onto two live PyTorch processes (this
machine's, ``SLURM_JOB_ID`` in their environment) each with a DataLoader of N workers, idle once their prefetch
queue is full: the sampler then reads those jobs' CPU use every tick (node/cpu.py), as on a node running them.

    python3 -m benchmarks.sampler_tick_cpu --interval-s 1.0 --interval-s 0.1 --seconds 30
"""
from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]
REC = REPO / "tests" / "data" / "nvml" / "h100_mps_2jobs.jsonl"
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` in seconds (clock ticks: 10 ms resolution)."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK


def run_ns(pid: int) -> int:
    """Time on CPU of all threads of ``pid`` in ns (``/proc/<pid>/task/*/schedstat``, field 1): precise."""
    n = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            n += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return n


def wakeups(pid: int) -> int:
    """Voluntary context switches summed over the threads of ``pid``."""
    n = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    n += int(line.split()[1])
        except OSError:
            continue
    return n


TREE = """
import sys, time, torch
class D(torch.utils.data.Dataset):
    def __len__(self): return 10**6
    def __getitem__(self, i): return torch.zeros(8)
it = iter(torch.utils.data.DataLoader(D(), batch_size=4, num_workers=int(sys.argv[1])))
next(it)
torch.ones(64, 64) @ torch.ones(64, 64)  # start the intra-op thread pool, as training does
print("ready", flush=True)
time.sleep(3600)
"""


def start_trees(n_workers: int, python: str) -> List[subprocess.Popen]:
    """Two PyTorch processes (jobs 9101, 9102) with ``n_workers`` DataLoader workers each, started and ready."""
    procs = []
    for job in (9101, 9102):
        p = subprocess.Popen([python, "-c", TREE, str(n_workers)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "SLURM_JOB_ID": str(job)}, start_new_session=True)
        assert p.stdout is not None
        if p.stdout.readline().strip() != "ready":
            raise SystemExit("a job tree did not start (needs torch)")
        procs.append(p)
    return procs


def measure(interval_s: float, seconds: float, settle_s: float, batch_s: Optional[float], src: Path,
            python: str, trees: Optional[List[subprocess.Popen]] = None) -> Dict[str, float]:
    """Run one sampler and return its steady-state figures (``trees``: live processes for the recorded pids)."""
    d = Path(tempfile.mkdtemp(prefix="tickcpu-"))
    conf = d / "c.yaml"
    keys: List[Tuple[str, object]] = [("state_dir", str(d / "state")), ("run_dir", str(d / "run")),
                                      ("log_dir", str(d / "log")), ("sampler_interval_s", interval_s)]
    if batch_s is not None:
        keys.append(("sampler_batch_s", batch_s))
    conf.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in keys))
    env = {**os.environ, "COLOC_CONFIG": str(conf), "PYTHONPATH": str(src)}
    pid_map = ["--pid-map", f"2340={trees[0].pid},2342={trees[1].pid}"] if trees else []
    p = subprocess.Popen([python, "-m", "slurm_coloc.cli.sampler", "run", "--node", "b1", "--replay", str(REC),
                          "--interval-s", str(interval_s), "--foreground-log", *pid_map], env=env, cwd=str(src),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(settle_s)
        c0, n0, w0, t0 = cpu_s(p.pid), run_ns(p.pid), wakeups(p.pid), time.monotonic()
        time.sleep(seconds)
        c1, n1, w1, t1 = cpu_s(p.pid), run_ns(p.pid), wakeups(p.pid), time.monotonic()
    finally:
        p.terminate()
        _, err = p.communicate(timeout=30)
    if p.returncode != 0:
        raise SystemExit(f"sampler exited {p.returncode}: {err[-2000:]}")
    db = sqlite3.connect(str(d / "state" / "nodes" / "b1.db"))
    rows = {t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("gpu_samples", "proc_samples")}
    has_cpu = db.execute("SELECT count(*) FROM sqlite_master WHERE name = 'cpu_samples'").fetchone()[0]
    rows["cpu_samples"] = db.execute("SELECT count(*) FROM cpu_samples").fetchone()[0] if has_cpu else 0
    dt = t1 - t0
    return {"interval_s": interval_s, "cpu_ms_per_s": round(1000 * (c1 - c0) / dt, 2),
            "oncpu_ms_per_s": round((n1 - n0) / 1e6 / dt, 3),
            "wakeups_per_s": round((w1 - w0) / dt, 1), "gpu_rows": rows["gpu_samples"],
            "proc_rows": rows["proc_samples"], "cpu_rows": rows["cpu_samples"], "run_s": round(settle_s + dt, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--interval-s", type=float, action="append", help="repeatable (default 1.0)")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--settle-s", type=float, default=4.0)
    ap.add_argument("--batch-s", type=float, default=None, help="sampler_batch_s (default: the config default)")
    ap.add_argument("--src", type=Path, default=REPO, help="directory holding the slurm_coloc package to run")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    ap.add_argument("--job-trees", type=int, default=None, metavar="N",
                    help="live PyTorch processes with N DataLoader workers for the recorded jobs (see above)")
    a = ap.parse_args()
    trees = start_trees(a.job_trees, a.python) if a.job_trees is not None else None
    try:
        res = [measure(i, a.seconds, a.settle_s, a.batch_s, a.src.resolve(), a.python, trees)
               for i in (a.interval_s or [1.0])]
    finally:
        for t in trees or []:
            os.killpg(t.pid, 9)  # the tree this script started: its session (the process and its workers)
    if a.json:
        for r in res:
            print(json.dumps(r))
        return
    print(f"{'interval_s':>10} {'cpu_ms/s':>9} {'oncpu_ms/s':>10} {'wakeups/s':>10} {'gpu_rows':>9} "
          f"{'proc_rows':>10} {'cpu_rows':>9} {'run_s':>6}")
    for r in res:
        print(f"{r['interval_s']:>10} {r['cpu_ms_per_s']:>9} {r['oncpu_ms_per_s']:>10} {r['wakeups_per_s']:>10} "
              f"{r['gpu_rows']:>9} {r['proc_rows']:>10} {r['cpu_rows']:>9} {r['run_s']:>6}")


if __name__ == "__main__":
    main()
