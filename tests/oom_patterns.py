"""Synthetic sampler records of jobs that die of CUDA OOM under a 2 GiB grant ("the lost rerun").

SYNTHETIC, not recordings: each pattern is the series of per-job memory readings (MiB) the sampler's watchdog
would store in ``proc_samples`` at its 0.5 s period while a 2-shard PyTorch job under an MPS fence of ``0=2G``
runs, plus the last line PyTorch prints (c10/cuda/CUDACachingAllocator.cpp). The honest shapes are those of
the GPU test ``tests/gpu/test_honest_rerun.py`` (benchmarks/device/honest_oom.py), which checks them on a real
GPU.

Each pattern: ``(proc_mib, message, honest)``. ``proc_mib`` empty: the process died between two looks of the
sampler (the sampler still recorded its GPU: ``gpu_samples`` rows).
"""
from __future__ import annotations

import time
from typing import Dict, List, Sequence, Tuple

from slurm_coloc.store.db import open_node_db
from slurm_coloc.store.samples import write_rows

GRANT_SHARDS = 2
PERIOD_S = 0.5


def _msg(tried: str) -> str:
    return (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried}. GPU 0 has a total "
            "capacity of "
            "2.00 GiB of which 1.12 GiB is free.")


PATTERNS: Dict[str, Tuple[List[float], str, bool]] = {
    # one 4 GiB allocation at the first step: it fails at once, the sampler never saw the process
    "one-alloc-first-step": ([], _msg("4.00 GiB"), True),
    # the same, where the sampler caught the CUDA context (about 300 MiB) before the allocation
    "one-alloc-context-seen": ([310.0], _msg("4.00 GiB"), True),
    # gradual growth: 128 MiB more per step until the fence
    "gradual-growth": ([400.0 + 128 * i for i in range(12)], _msg("128.00 MiB"), True),
    # steady 1 GiB of training, a 1 GiB temporary mid-run fails
    "mid-run-peak": ([1040.0] * 6 + [1090.0] * 2, _msg("1.00 GiB"), True),
    # steady training, then the evaluation pass asks for 1.5 GiB more
    "eval-pass-peak": ([820.0] * 10, _msg("1.50 GiB"), True),
    # farming: a line printed by a job that never touched the GPU while the sampler watched
    "fake-no-gpu": ([], _msg("20.00 MiB"), False),
    # farming: a small CUDA context and a line naming a small allocation
    "fake-small": ([300.0] * 6, _msg("20.00 MiB"), False),
    # farming: a line naming an allocation no whole GPU holds
    "fake-huge": ([], _msg("200.00 GiB"), False),
}


def write_pattern(db_path, job_id: int, proc_mib: Sequence[float], t0: float = 0.0) -> None:
    """Store what the sampler records for ``job_id`` into the node database at ``db_path``: one
    ``gpu_samples`` row of GPU 0 per period (the sampler watched) and one ``proc_samples`` row per reading of
    the job's process, through the sampler's own ``write_rows``."""
    t0 = t0 or time.time()
    n = max(2, len(proc_mib))
    gpu = [{"ts": round(t0 + i * PERIOD_S, 3), "gpu_index": 0,
            "mem_used_mib": 500.0 + (proc_mib[i] if i < len(proc_mib)
                                                                                        else 0.0),
            "n": 1, "res_s": PERIOD_S} for i in range(n)]
    proc = [{"ts": round(t0 + i * PERIOD_S, 3), "gpu_index": 0, "pid": 40000 + job_id % 1000,
             "job_id": job_id,
             "used_mem_mib": v, "mps_client": 1, "n": 1, "res_s": PERIOD_S} for i, v in enumerate(proc_mib)]
    db = open_node_db(db_path)
    try:
        write_rows(db, [_full_gpu_row(r) for r in gpu], [_full_proc_row(r) for r in proc])
    finally:
        db.conn.close()


def _full_gpu_row(row: Dict) -> Dict:
    from slurm_coloc.store.samples import GPU_COLS

    return {c: row.get(c) for c in GPU_COLS}


def _full_proc_row(row: Dict) -> Dict:
    from slurm_coloc.store.samples import PROC_COLS

    return {c: row.get(c) for c in PROC_COLS}
