#!/usr/bin/env python3
"""Sampler overhead on a real training loop (issue 4 benchmark; run on the GPU machine).

GPU-bound workload (ResNet-50, 224x224, batch 64, fp32) in ONE long-lived trainer process, so that process-level
differences (cuDNN algorithm choice, allocator layout, clock ramp-up) cancel: the trainer logs its progress
(time, steps) every 5 synchronised steps, while this script starts and stops `coloc-sampler run` around it in
segments of `--segment-s` seconds in the pattern off, 1 Hz, off, 10 Hz, off, 1 Hz, ... (sampler pinned to a
different CPU than the trainer). A segment's throughput is measured from its progress log, skipping the first
`--settle-s` seconds after each switch (sampler start-up: interpreter, NVML init). Each sampled segment is
paired with the mean of the two neighbouring "off" segments. Prints a table: median and spread of throughput per
condition, median paired slowdown and its spread, sampler CPU % of one core (utime+stime from /proc/<pid>/stat over
the segment), and steady database growth per GPU-hour (each rate keeps its own database across its segments;
growth is counted from the end of that rate's first segment, so schema creation is excluded).

Targets (issue 4): slowdown <= 0.5% at 1 Hz and <= 2% at 10 Hz; sampler CPU <= 1% of one core at 1 Hz; database
growth <= 1 MB per GPU-hour at 1 Hz.

    python3 -m benchmarks.sampler_overhead --rounds 6 --segment-s 20 --out $OUT/sampler_overhead.json
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
dev = sys.argv[2]
m = getattr(torchvision.models, sys.argv[3])().to(dev)
opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
hw = int(sys.argv[4])
x = torch.randn(64, 3, hw, hw, device=dev); y = torch.randint(0, 1000, (64,), device=dev)
lf = torch.nn.CrossEntropyLoss()
def step():
    opt.zero_grad(set_to_none=True); lf(m(x), y).backward(); opt.step()
for _ in range(20): step()
(torch.cuda.synchronize() if dev == "cuda" else None)
print("READY", time.time(), flush=True)
t0 = time.time(); n = 0
while time.time() - t0 < secs:
    for _ in range(5): step()
    (torch.cuda.synchronize() if dev == "cuda" else None); n += 5
    print(f"P {time.time():.6f} {n}", flush=True)
"""
BATCH = 64


def cpu_ticks(pid: int) -> int:
    """utime + stime of `pid` in clock ticks (from /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def db_bytes(workdir: Path) -> int:
    """Bytes of the sampler's database files (main, WAL, SHM) under `workdir`."""
    return sum(p.stat().st_size for p in (workdir / "state" / "nodes").glob("bench.db*"))


def rate_between(progress: list[tuple[float, int]], t0: float, t1: float) -> float | None:
    """Samples/s between the first progress point >= t0 and the last <= t1 (None if under 2 points)."""
    pts = [p for p in progress if t0 <= p[0] <= t1]
    if len(pts) < 2:
        return None
    return (pts[-1][1] - pts[0][1]) * BATCH / (pts[-1][0] - pts[0][0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6, help="rounds of (off, 1 Hz, off, 10 Hz)")
    ap.add_argument("--segment-s", type=float, default=20.0)
    ap.add_argument("--settle-s", type=float, default=4.0)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--out", default=None)
    ap.add_argument("--trainer-cpu", default="2")
    ap.add_argument("--sampler-cpu", default="1")
    ap.add_argument("--sampler-arg", action="append", default=[], help="extra `coloc-sampler run` argument")
    ap.add_argument("--device", default="cuda", help="cpu only for a smoke test of this script")
    ap.add_argument("--model", default="resnet50", help="torchvision model of the trainer")
    ap.add_argument("--input-hw", type=int, default=224, help="input height = width of the trainer's images")
    args = ap.parse_args()
    plan = [c for _ in range(args.rounds) for c in (None, 1.0, None, 0.1)] + [None]
    total = len(plan) * args.segment_s + 30
    dirs = {1.0: Path(tempfile.mkdtemp(prefix="so-1hz-")), 0.1: Path(tempfile.mkdtemp(prefix="so-10hz-"))}
    for d in dirs.values():
        (d / "coloc.yaml").write_text(f"state_dir: {d}/state\nrun_dir: {d}/run\nlog_dir: {d}/log\n")
    trainer = subprocess.Popen(["taskset", "-c", args.trainer_cpu, args.python, "-c", TRAIN, str(total), args.device,
                                args.model, str(args.input_hw)],
                               stdout=subprocess.PIPE, text=True)
    assert trainer.stdout is not None
    progress: list[tuple[float, int]] = []
    line = trainer.stdout.readline()
    if not line.startswith("READY"):
        print(f"sampler_overhead: trainer did not start: {line!r}", file=sys.stderr)
        return 1
    import threading

    def reader() -> None:
        for ln in trainer.stdout:  # type: ignore[union-attr]
            if ln.startswith("P "):
                _, t, n = ln.split()
                progress.append((float(t), int(n)))
    th = threading.Thread(target=reader, daemon=True)
    th.start()
    segments = []
    first_end: dict[float, int] = {}
    for i, interval in enumerate(plan):
        seg: dict = {"i": i, "interval_s": interval}
        sampler = None
        if interval is not None:
            env = dict(os.environ, COLOC_CONFIG=str(dirs[interval] / "coloc.yaml"))
            seg["db_before"] = db_bytes(dirs[interval]) if (dirs[interval] / "state").exists() else 0
            sampler = subprocess.Popen(["taskset", "-c", args.sampler_cpu, args.python,
                                        "-m", "slurm_coloc.cli.sampler", "run",
                                        "--node", "bench", "--interval-s", str(interval),
                                        "--duration-s", str(args.segment_s + 30), *args.sampler_arg], env=env)
        t_start = time.time()
        time.sleep(args.settle_s)
        c0 = cpu_ticks(sampler.pid) if sampler else 0
        t_meas = time.time()
        time.sleep(args.segment_s - args.settle_s)
        t_end = time.time()
        seg.update(t0=t_meas, t1=t_end, t_switch=t_start)
        if sampler:
            seg["sampler_cpu_pct"] = 100.0 * (cpu_ticks(sampler.pid) - c0) / os.sysconf("SC_CLK_TCK") / (t_end - t_meas)
            sampler.terminate()
            sampler.wait(timeout=20)
            size = db_bytes(dirs[interval])
            if interval not in first_end:
                first_end[interval] = size
                seg["db_after_first"] = size
            seg["db_after"] = size
        segments.append(seg)
    trainer.wait(timeout=120)
    th.join(timeout=5)
    print(f"progress points: {len(progress)}", file=sys.stderr)
    for s in segments:
        s["samples_per_s"] = rate_between(progress, s["t0"], s["t1"])
        print(json.dumps({k: v for k, v in s.items() if k not in ("t0", "t1", "t_switch")}), flush=True)
    rows = []
    for interval in (None, 1.0, 0.1):
        xs = [s for s in segments if s["interval_s"] == interval and s["samples_per_s"]]
        tput = [s["samples_per_s"] for s in xs]
        if not tput:
            print(f"sampler_overhead: no measurable segment for {interval}", file=sys.stderr)
            return 1
        slow = []
        if interval is not None:
            for s in xs:
                nb = [segments[s["i"] - 1]["samples_per_s"], segments[s["i"] + 1]["samples_per_s"]]
                if all(nb):
                    slow.append(100.0 * (1 - s["samples_per_s"] / (sum(nb) / 2)))
        growth = None
        if interval is not None:
            # growth after the first segment of this rate, over the wall time its later segments ran
            later = [s for s in segments if s["interval_s"] == interval][1:]
            last = later[-1]["db_after"] if later else first_end[interval]
            secs = sum(s["t1"] - s["t_switch"] for s in later)
            growth = (last - first_end[interval]) / (secs / 3600.0) / 1e6 if secs else None
        rows.append({
            "condition": "off" if interval is None else f"{1 / interval:g} Hz",
            "segments": len(xs),
            "median_samples_per_s": statistics.median(tput), "min": min(tput), "max": max(tput),
            "median_slowdown_pct": statistics.median(slow) if slow else None,
            "slowdown_range_pct": [min(slow), max(slow)] if slow else None,
            "mean_slowdown_pct": statistics.mean(slow) if slow else None,
            "sampler_cpu_pct": statistics.median([s["sampler_cpu_pct"] for s in xs]) if interval else None,
            "db_mb_per_gpu_hour": growth})
    print(f"{'condition':<10} {'n':>3} {'median s/s':>11} {'min':>9} {'max':>9} {'slowdown %':>11} {'mean %':>7} "
          f"{'range %':>14} {'CPU %':>6} {'MB/GPU-h':>9}")
    for r in rows:
        span = r["slowdown_range_pct"]
        rng = "-" if span is None else f"{span[0]:.2f}..{span[1]:.2f}"
        f2 = (lambda v: "-" if v is None else format(v, ".2f"))
        print(f"{r['condition']:<10} {r['segments']:>3} {r['median_samples_per_s']:>11.1f} {r['min']:>9.1f} "
              f"{r['max']:>9.1f} {f2(r['median_slowdown_pct']):>11} {f2(r['mean_slowdown_pct']):>7} {rng:>14} "
              f"{f2(r['sampler_cpu_pct']):>6} {f2(r['db_mb_per_gpu_hour']):>9}")
    if args.out:
        Path(args.out).write_text(json.dumps({"segments": segments, "table": rows,
                                              "args": vars(args)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
