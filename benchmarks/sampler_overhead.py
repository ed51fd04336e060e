#!/usr/bin/env python3
"""Sampler overhead on a real training loop (issue 4 benchmark; run on the GPU machine).

GPU-bound workload (ResNet-50, 224x224, batch 64, AMP off) so that a 0.5% difference is resolvable (see
gpu-facts.md "mind the noise"). Conditions: sampler off, `coloc-sampler run` at 1 Hz, at 10 Hz, each in its own
process pinned to a different CPU than the trainer. Runs are interleaved (off, 1 Hz, 10 Hz, off, ...) and paired:
the slowdown of each sampled run is taken against the mean of the two neighbouring "off" runs. Prints a table:
median and spread of throughput per condition, median paired slowdown, sampler CPU % of one core (from
/proc/<pid>/stat), and database growth (bytes per GPU-hour).

    python3 benchmarks/sampler_overhead.py --rounds 5 --seconds 20 --out $OUT/sampler_overhead.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRAIN = r"""
import sys, time, torch, torchvision
secs = float(sys.argv[1])
torch.backends.cudnn.benchmark = True
m = torchvision.models.resnet50().cuda()
opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
x = torch.randn(64, 3, 224, 224, device="cuda"); y = torch.randint(0, 1000, (64,), device="cuda")
lf = torch.nn.CrossEntropyLoss()
def step():
    opt.zero_grad(set_to_none=True); lf(m(x), y).backward(); opt.step()
for _ in range(15): step()
torch.cuda.synchronize(); t0 = time.time(); n = 0
while time.time() - t0 < secs:
    for _ in range(10): step()
    torch.cuda.synchronize(); n += 10
print(n * 64 / (time.time() - t0))
"""


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def run_once(python: str, seconds: float, interval: float | None, workdir: Path) -> dict:
    sampler = None
    db_before = 0
    env = dict(os.environ)
    if interval is not None:
        cfg = workdir / "coloc.yaml"
        cfg.write_text(f"state_dir: {workdir}/state\nrun_dir: {workdir}/run\nlog_dir: {workdir}/log\n")
        env["COLOC_CONFIG"] = str(cfg)
        db = workdir / "state" / "nodes" / "bench.db"
        db_before = db.stat().st_size if db.exists() else 0
        sampler = subprocess.Popen(["taskset", "-c", "1", python, "-m", "slurm_coloc.cli.sampler", "run",
                                    "--node", "bench", "--interval-s", str(interval),
                                    "--duration-s", str(seconds + 40)], env=env)
        time.sleep(2.0)
    t_cpu0 = cpu_ticks(sampler.pid) if sampler else 0
    t0 = time.time()
    out = subprocess.run(["taskset", "-c", "2", python, "-c", TRAIN, str(seconds)], capture_output=True,
                         text=True, check=True, env=env)
    wall = time.time() - t0
    res = {"interval_s": interval, "samples_per_s": float(out.stdout.strip().splitlines()[-1])}
    if sampler:
        res["sampler_cpu_pct"] = 100.0 * (cpu_ticks(sampler.pid) - t_cpu0) / os.sysconf("SC_CLK_TCK") / wall
        sampler.terminate()
        sampler.wait(timeout=20)
        db = workdir / "state" / "nodes" / "bench.db"
        size = sum(p.stat().st_size for p in db.parent.glob("bench.db*"))
        res["db_bytes_per_gpu_hour"] = (size - db_before) / (wall / 3600.0)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    runs = []
    for r in range(args.rounds):
        for interval in (None, 1.0, 10.0 ** -1):
            with tempfile.TemporaryDirectory() as d:
                res = run_once(args.python, args.seconds, interval, Path(d))
            res["round"] = r
            runs.append(res)
            print(json.dumps(res), flush=True)
    runs.append({**run_once(args.python, args.seconds, None, Path(tempfile.mkdtemp())), "round": args.rounds})
    offs = [x for x in runs if x["interval_s"] is None]
    rows = []
    for interval in (None, 1.0, 0.1):
        xs = [x for x in runs if x["interval_s"] == interval]
        tput = [x["samples_per_s"] for x in xs]
        slow = []
        if interval is not None:
            for x in xs:
                before = [o for o in offs if o["round"] == x["round"]][0]["samples_per_s"]
                after = [o for o in offs if o["round"] == x["round"] + 1][0]["samples_per_s"]
                slow.append(100.0 * (1 - x["samples_per_s"] / ((before + after) / 2)))
        rows.append({
            "condition": "off" if interval is None else f"{1 / interval:g} Hz",
            "median_samples_per_s": statistics.median(tput), "min": min(tput), "max": max(tput),
            "median_slowdown_pct": statistics.median(slow) if slow else None,
            "slowdown_range_pct": [min(slow), max(slow)] if slow else None,
            "sampler_cpu_pct": statistics.median([x["sampler_cpu_pct"] for x in xs]) if interval else None,
            "db_mb_per_gpu_hour": statistics.median([x["db_bytes_per_gpu_hour"] for x in xs]) / 1e6 if interval
            else None})
    print(f"{'condition':<10} {'median s/s':>11} {'min':>9} {'max':>9} {'slowdown %':>11} {'range %':>16} "
          f"{'CPU %':>6} {'MB/GPU-h':>9}")
    for r in rows:
        rng = "-" if r["slowdown_range_pct"] is None else f"{r['slowdown_range_pct'][0]:.2f}..{r['slowdown_range_pct'][1]:.2f}"
        print(f"{r['condition']:<10} {r['median_samples_per_s']:>11.1f} {r['min']:>9.1f} {r['max']:>9.1f} "
              f"{'-' if r['median_slowdown_pct'] is None else format(r['median_slowdown_pct'], '.2f'):>11} {rng:>16} "
              f"{'-' if r['sampler_cpu_pct'] is None else format(r['sampler_cpu_pct'], '.2f'):>6} "
              f"{'-' if r['db_mb_per_gpu_hour'] is None else format(r['db_mb_per_gpu_hour'], '.2f'):>9}")
    if args.out:
        Path(args.out).write_text(json.dumps({"runs": runs, "table": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
