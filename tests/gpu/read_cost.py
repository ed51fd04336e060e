"""Device measurement (not a test): cost of one NvmlReader.read() (all GPU metrics, GPM window, processes) and
database bytes per GPU sample row at the default 1 s interval. Prints one JSON line.

Usage: python3 tests/gpu/read_cost.py OUT.json
"""
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from slurm_coloc.config import Config
from slurm_coloc.node.sampler import JobAttributor, Sampler
from slurm_coloc.nvml import NvmlReader

r = NvmlReader()
r.read()
times = []
for _ in range(40):
    time.sleep(0.11)  # GPM window >= 100 ms
    t0 = time.perf_counter()
    r.read()
    times.append((time.perf_counter() - t0) * 1000)
cpu0 = time.process_time()
d = Path(tempfile.mkdtemp())
cfg = dataclasses.replace(Config(), state_dir=str(d), run_dir=str(d / "run"), log_dir=str(d),
                          sampler_batch_s=5.0)
s = Sampler(cfg, "dev", r, attributor=JobAttributor(), interval_s=1.0)
t0 = time.time()
s.run(duration_s=30)
cpu = time.process_time() - cpu0
db = cfg.node_db_path("dev")
size = sum(p.stat().st_size for p in db.parent.glob("dev.db*"))
out = {"read_ms_median": round(statistics.median(times), 3), "read_ms_p95": round(sorted(times)[37], 3),
       "sampler_30s_frames": s.frames,
       "sampler_cpu_pct_of_core_at_1hz": round(100 * cpu / (time.time() - t0), 3),
       "db_bytes_after_30_frames": size, "gpus": len(r._handles)}
print(json.dumps(out))
Path(sys.argv[1]).write_text(json.dumps(out))
