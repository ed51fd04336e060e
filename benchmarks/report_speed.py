#!/usr/bin/env python3
"""coloc-report speed: 30 days of 1 Hz samples for 8 GPUs on one node, every view timed end to end.

Generates (once, cached under ``--dir``) a controller DB and one node DB through the package's own writers
(``store/jobs.py``, ``store/samples.py``, ``store/summaries.py``, ``store/oom.py``), then runs
``coloc-report <view> --since 30d`` in a fresh process per view and prints a table of wall times (median of
``--repeat`` runs, process start included).

Two layouts of the same 30 days (``--layout``):
  stored  what the sampler keeps with the default config: the last 24 h raw (1 Hz), older samples folded to
          60 s rows (``samples.downsample``; ``sampler_raw_retention_h: 24``, ``sampler_downsample_s: 60``).
  raw     every 1 Hz sample kept (a site that turns downsampling off): 30 x 86400 x 8 = 20.7 M rows.

Usage::

    .venv/bin/python -m benchmarks.report_speed --layout stored
    .venv/bin/python -m benchmarks.report_speed --layout raw --dir /tmp/coloc-bench-raw
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from slurm_coloc.nvml.readings import GpuReading
from slurm_coloc.store import jobs as store_jobs
from slurm_coloc.store import oom as store_oom
from slurm_coloc.store import samples, summaries
from slurm_coloc.store.db import open_ctld_db, open_node_db

REPO = Path(__file__).resolve().parents[1]

DAYS, GPUS, NODE = 30, 8, "n1"


def _gpu_reading(rng: random.Random, g: int, busy: int, energy_j: float) -> GpuReading:
    sm = min(100.0, busy * rng.uniform(15, 40)) if busy else 0.0
    return GpuReading(index=g, util_pct=100.0 if busy else 0.0, mem_util_pct=sm / 2,
                      mem_used_mib=busy * rng.uniform(3000, 9000), power_w=70 + 3 * sm, energy_j=energy_j,
                      temp_c=40 + sm / 5, sm_clock_mhz=1980, smact_pct=sm, smocc_pct=sm * 0.6,
                      tensor_pct=sm * 0.3, dram_bw_pct=sm * 0.4)


def generate(state: Path, layout: str, seed: int = 7) -> dict:
    """Write ctld.db and nodes/n1.db under ``state``; return counts."""
    rng = random.Random(seed)
    end = time.time() - 60
    start = end - DAYS * 86400
    ctld = open_ctld_db(state / "ctld.db")
    node = open_node_db(state / "nodes" / f"{NODE}.db")
    # jobs: per GPU, 2-3 overlapping lanes of 1-6 h jobs
    busy = {g: [] for g in range(GPUS)}  # type: dict
    job_id, n_jobs = 1000, 0
    with ctld.atomic(), node.atomic():
        for g in range(GPUS):
            for _ in range(rng.choice((2, 3))):
                t = start + rng.uniform(0, 3600)
                while t < end - 600:
                    dur = rng.uniform(3600, 6 * 3600)
                    t_end = min(t + dur, end - 60)
                    job_id += 1
                    n_jobs += 1
                    shards = rng.choice((4, 8, 12, 16, 24))
                    est = shards * 1024 - 256
                    peak = est * rng.uniform(0.4, 1.2)
                    user = f"user{job_id % 12}"
                    store_jobs.record_submission(ctld, store_jobs.JobSubmission(
                        job_id=job_id, user_name=user, job_name="train", shards_req=shards, share_mode="shard",
                        estimate_mib=est, estimate_method="learned", submit_ts=t - 5))
                    state_ = "FAILED" if peak > shards * 1024 else "COMPLETED"
                    store_jobs.record_ctld_end(ctld, store_jobs.JobEnd(job_id, t_end, state_, 1 if state_ ==
                                                                       "FAILED" else 0, 0), NODE, t)
                    store_jobs.record_node_start(node, store_jobs.JobStart(job_id, NODE, user, None, str(g), shards,
                                                                           f"gres:shard:{shards}", t))
                    store_jobs.record_node_end(node, store_jobs.JobEnd(job_id, t_end, state_, 0, 0, NODE))
                    sm = rng.uniform(2, 60)
                    summaries.record_summary(node, summaries.JobSummary(
                        job_id, NODE, str(g), t, t_end, min(peak, shards * 1024), sm, min(100, sm * 1.4), sm * .6,
                        sm * .8, (t_end - t) * 150 * shards / 80, (t_end - t) * shards / 80, int(t_end - t)))
                    if state_ == "FAILED":
                        store_oom.claim_retry(ctld, store_oom.OomRecord(
                            job_id=job_id, ts=t_end, user_name=user, share_mode="shard", shards=shards,
                            fence_mib=shards * 1024, retry_status="submitted", retry_job_id=job_id + 900000,
                            retry_state="COMPLETED"))
                    busy[g].append((t, t_end))
                    t = t_end + rng.uniform(0, 1800)
    # samples
    raw_from = start if layout == "raw" else end - 86400
    n_rows = 0
    energy = [0.0] * GPUS
    statics = [GpuReading(index=g, uuid=f"GPU-{g:04d}", name="NVIDIA H100 80GB HBM3", mem_total_mib=81559.0)
               for g in range(GPUS)]
    spans = {g: sorted(busy[g]) for g in range(GPUS)}

    def n_busy(g: int, ts: float) -> int:
        return sum(1 for s, e in spans[g] if s <= ts <= e)

    def emit(ts_list, res_s):  # type: ignore[no-untyped-def]
        nonlocal n_rows
        batch = []
        for ts in ts_list:
            frame = []
            for g in range(GPUS):
                b = n_busy(g, ts) if int(ts) % 60 == 0 or res_s > 1 else cache[g]
                cache[g] = b
                r = _gpu_reading(rng, g, b, energy[g])
                energy[g] += (r.power_w or 0) * res_s
                frame.append(r)
            for row in samples.gpu_rows(ts, frame, res_s):
                if res_s > 1:
                    row["n"] = int(res_s)
                batch.append(row)
            if len(batch) >= 200000:
                samples.write_rows(node, batch, [])
                n_rows += len(batch)
                batch = []
        samples.write_rows(node, batch, [], statics)
        n_rows += len(batch)

    cache = [0] * GPUS
    if raw_from > start:
        emit((start + 60 * k for k in range(int((raw_from - start) // 60))), 60.0)
    emit((raw_from + k for k in range(int(end - raw_from))), 1.0)
    node.execute("ANALYZE")
    return {"jobs": n_jobs, "gpu_sample_rows": n_rows,
            "db_mib": round(sum(p.stat().st_size for p in state.rglob("*.db*")) / 2 ** 20)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layout", choices=("stored", "raw"), default="stored")
    ap.add_argument("--dir", default=None, help="where the generated DBs live (reused when present)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    base = Path(args.dir or f"/tmp/coloc-bench-{args.layout}")
    state = base / "state"
    cfg = base / "coloc.yaml"
    if not (state / "ctld.db").exists():
        t = time.time()
        info = generate(state, args.layout)
        print(f"generated {info} in {time.time() - t:.0f} s", file=sys.stderr)
    cfg.write_text(f"state_dir: {state}\ngpu_mem_gib: 80\n")
    exe = str(Path(sys.executable).parent / "coloc-report")
    env = {**os.environ, "COLOC_CONFIG": str(cfg)}
    rows = []
    for view, extra in (("jobs", []), ("jobs", ["--user", "user3"]), ("users", []), ("gpus", []),
                        ("nodes", []), ("cluster", []), ("jobs", ["--json"]), ("gpus", ["--csv"])):
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            proc = subprocess.run([exe, view, "--since", "30d", *extra], env=env, capture_output=True, text=True)
            times.append(time.perf_counter() - t)
            if proc.returncode != 0:
                sys.exit(f"coloc-report {view} failed: {proc.stderr.strip()}")
        rows.append((" ".join([view, *extra]), statistics.median(times), max(times), len(proc.stdout)))
    n = state / "nodes" / f"{NODE}.db"
    print(f"\ncoloc-report over {DAYS} days x 1 Hz x {GPUS} GPUs, layout={args.layout}, node DB "
          f"{n.stat().st_size / 2 ** 20:.0f} MiB, {os.cpu_count()} CPUs, target <= 2.0 s")
    print(f"{'command':<28} {'median s':>9} {'max s':>7} {'output B':>9}  verdict")
    for name, med, mx, size in rows:
        print(f"{name:<28} {med:>9.2f} {mx:>7.2f} {size:>9}  {'ok' if mx <= 2.0 else 'OVER'}")


if __name__ == "__main__":
    main()
