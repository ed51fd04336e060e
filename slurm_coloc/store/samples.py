"""Sample tables of a node database: per-GPU and per-process NVML samples, per-job CPU use, node events
(per-job summaries: store/summaries.py). Writes are batched: one transaction per ``write_frames`` call. Old
raw samples are folded into coarser rows by ``downsample`` (mean of rates, max of memory and of the energy
counter) and dropped after ``purge``. Row ``n`` = raw samples folded in; ``res_s`` = the row's time resolution
(the sampling interval for raw rows). All times are Unix s; a read of a missing table gives []."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from sqlite_utils import Database

from slurm_coloc.nvml.readings import GpuReading, ProcReading

GPU_METRICS = ("util_pct", "mem_util_pct", "mem_used_mib", "power_w", "energy_j", "temp_c", "sm_clock_mhz",
               "smact_pct", "smocc_pct", "tensor_pct", "dram_bw_pct")
PROC_METRICS = ("used_mem_mib", "sm_util_pct", "mem_util_pct")
CPU_METRICS = ("train_pids", "train_cores", "workers", "workers_cores", "job_cores", "cpus")
# kept as max when downsampling; the rest: mean
_MAX_OF = {"mem_used_mib", "energy_j", "used_mem_mib", "train_pids", "cpus"}


@dataclass(frozen=True)
class ProcSample:
    """A process reading attributed to a Slurm job (``job_id`` None: not a Slurm job, e.g. the MPS server)."""

    reading: ProcReading
    job_id: Optional[int]


def _r(v: Optional[float]) -> Optional[float]:
    return None if v is None else round(float(v), 2)


_GPU_GET = attrgetter(*GPU_METRICS)
_PROC_GET = attrgetter(*PROC_METRICS)
GPU_COLS = ("ts", "gpu_index", *GPU_METRICS, "n", "res_s")
PROC_COLS = ("ts", "gpu_index", "pid", "job_id", *PROC_METRICS, "mps_client", "n", "res_s")
# Prepared once: named parameters take the row dicts as they are (no per-row SQL building or type sniffing).
_INSERT_GPU = (f"INSERT INTO gpu_samples ({', '.join(GPU_COLS)}) "
               f"VALUES ({', '.join(':' + c for c in GPU_COLS)})")
CPU_COLS = ("ts", "job_id", *CPU_METRICS, "n", "res_s")
_INSERT_CPU = (f"INSERT INTO cpu_samples ({', '.join(CPU_COLS)}) "
               f"VALUES ({', '.join(':' + c for c in CPU_COLS)})")
_INSERT_PROC = (f"INSERT INTO proc_samples ({', '.join(PROC_COLS)}) "
                f"VALUES ({', '.join(':' + c for c in PROC_COLS)})")


def gpu_rows(ts: float, gpus: Iterable[GpuReading], res_s: float) -> List[Dict[str, Any]]:
    """``gpu_samples`` rows (``GPU_COLS``) of one frame: ``ts`` to ms, metrics to 2 decimals, ``n`` = 1."""
    t = round(ts, 3)
    return [{"ts": t, "gpu_index": g.index,
             **{m: None if v is None else round(float(v), 2) for m, v in zip(GPU_METRICS, _GPU_GET(g))},
             "n": 1, "res_s": res_s} for g in gpus]


def proc_rows(ts: float, procs: Iterable[ProcSample], res_s: float) -> List[Dict[str, Any]]:
    """``proc_samples`` rows (``PROC_COLS``) of one frame: ``ts`` to ms, metrics to 2 decimals, ``n`` = 1."""
    t = round(ts, 3)
    return [{"ts": t, "gpu_index": p.reading.gpu_index, "pid": p.reading.pid, "job_id": p.job_id,
             **{m: None if v is None else round(float(v), 2) for m,
                v in zip(PROC_METRICS, _PROC_GET(p.reading))},
             "mps_client": int(p.reading.mps_client), "n": 1, "res_s": res_s} for p in procs]


def cpu_rows(ts: float, jobs: Iterable[Any], res_s: float) -> List[Dict[str, Any]]:
    """``cpu_samples`` rows (``CPU_COLS``, ``n`` = 1) of one reading ending at ``ts`` (rounded to ms).
    ``jobs``: ``node.cpu.JobCpu`` or alike; cores = CPU seconds per wall second over the interval."""
    t = round(ts, 3)
    return [{"ts": t, "job_id": j.job_id, **{m: getattr(j, m) for m in CPU_METRICS}, "n": 1, "res_s": res_s}
            for j in jobs]


def write_rows(db: Database, gpu: Sequence[Dict[str, Any]], proc: Sequence[Dict[str, Any]],
               gpus_static: Sequence[GpuReading] = (), cpu: Sequence[Dict[str, Any]] = ()) -> None:
    """Insert prepared rows in ONE transaction (all or nothing), one ``executemany`` per table.
    ``gpus_static``: readings whose uuid, name and total memory (MiB) are upserted into ``gpus``. Raises
    sqlite3.Error (locked past the busy timeout, disk full)."""
    with db.atomic():
        if gpu:
            db.conn.executemany(_INSERT_GPU, gpu)
        if proc:
            db.conn.executemany(_INSERT_PROC, proc)
        if cpu:
            db.conn.executemany(_INSERT_CPU, cpu)
        for g in gpus_static:
            db.table("gpus").upsert({"gpu_index": g.index, "uuid": g.uuid, "name": g.name,
                               "mem_total_mib": g.mem_total_mib, "updated_ts": time.time()}, pk="gpu_index")


def _fold(db: Database, table: str, keys: Tuple[str, ...], metrics: Tuple[str, ...], cutoff_ts: float,
          bucket_s: float) -> int:
    cols = ", ".join(f"{'MAX' if m in _MAX_OF else 'AVG'}({m})" for m in metrics)
    key_cols = ", ".join(keys)
    bucket = f"CAST(ts / {float(bucket_s)} AS INTEGER) * {float(bucket_s)}"
    where = "ts < ? AND res_s < ?"
    n_before = db.execute(f"SELECT count(*) FROM {table} WHERE {where}", [cutoff_ts, bucket_s]).fetchone()[0]
    if not n_before:
        return 0
    extra = ", mps_client" if table == "proc_samples" else ""
    db.execute(f"INSERT INTO {table} (ts, {key_cols}, {', '.join(metrics)}{extra}, n, res_s) "
               f"SELECT {bucket} AS b, {key_cols}, {cols}{', MAX(mps_client)' if extra else ''}, SUM(n), ? "
               f"FROM {table} WHERE {where} GROUP BY b, {key_cols}", [bucket_s, cutoff_ts, bucket_s])
    db.execute(f"DELETE FROM {table} WHERE {where}", [cutoff_ts, bucket_s])
    return int(n_before)


def downsample(db: Database, cutoff_ts: float, bucket_s: float) -> int:
    """Fold samples older than ``cutoff_ts`` finer than ``bucket_s`` into ``bucket_s`` rows; raw rows folded.
    Rates are averaged; memory and the energy counter keep their maximum; ``n`` sums. One transaction. Raises
    sqlite3.Error (locked past the busy timeout, disk full)."""
    with db.atomic():
        a = _fold(db, "gpu_samples", ("gpu_index",), GPU_METRICS, cutoff_ts, bucket_s)
        b = _fold(db, "proc_samples", ("gpu_index", "pid", "job_id"), PROC_METRICS, cutoff_ts, bucket_s)
        c = _fold(db, "cpu_samples", ("job_id",), CPU_METRICS, cutoff_ts, bucket_s)
    return a + b + c


def purge(db: Database, before_ts: float) -> int:
    """Delete samples older than ``before_ts`` (summaries and events stay); the rows deleted. Raises
    sqlite3.Error (locked past the busy timeout, disk full)."""
    with db.atomic():
        n = db.execute("DELETE FROM gpu_samples WHERE ts < ?", [before_ts]).rowcount
        n += db.execute("DELETE FROM proc_samples WHERE ts < ?", [before_ts]).rowcount
        n += db.execute("DELETE FROM cpu_samples WHERE ts < ?", [before_ts]).rowcount
    return int(n)


def _window_rows(db: Database, table: str, t0: float, t1: float,
                 gpu_indices: Sequence[int]) -> List[Dict[str, Any]]:
    """Rows of sample ``table`` with ``t0 <= ts <= t1`` on ``gpu_indices``, by time; [] without the table."""
    if not gpu_indices or not db.table(table).exists():
        return []
    marks = ",".join("?" * len(gpu_indices))
    return list(db.query(f"SELECT * FROM {table} WHERE ts >= ? AND ts <= ? AND gpu_index IN ({marks}) "
                         f"ORDER BY ts", [t0, t1, *gpu_indices]))


def load_gpu_samples(db: Database, t0: float, t1: float, gpu_indices: Sequence[int]) -> List[Dict[str, Any]]:
    """GPU sample rows with ``t0 <= ts <= t1`` on NVML indices ``gpu_indices`` (none: no rows), by time."""
    return _window_rows(db, "gpu_samples", t0, t1, gpu_indices)


def load_proc_samples(db: Database, t0: float, t1: float, gpu_indices: Sequence[int]) -> List[Dict[str, Any]]:
    """Process sample rows (every job's) with ``t0 <= ts <= t1`` on ``gpu_indices``, by time."""
    return _window_rows(db, "proc_samples", t0, t1, gpu_indices)


def load_job_proc_samples(db: Database, job_id: int) -> List[Dict[str, Any]]:
    """All process sample rows attributed to ``job_id``, by time."""
    if not db.table("proc_samples").exists():
        return []
    return list(db.query("SELECT * FROM proc_samples WHERE job_id = ? ORDER BY ts", [job_id]))


def load_job_cpu_samples(db: Database, job_id: int, t0: float, t1: float) -> List[Dict[str, Any]]:
    """CPU sample rows of ``job_id`` with ``t0 <= ts <= t1``, by time."""
    if not db.table("cpu_samples").exists():
        return []
    return list(db.query("SELECT * FROM cpu_samples WHERE job_id = ? AND ts >= ? AND ts <= ? ORDER BY ts",
                         [job_id, t0, t1]))


def count_samples(db: Database) -> Dict[str, int]:
    """``{"gpu_samples": n, "proc_samples": n, "cpu_samples": n}`` (a missing table counts 0)."""
    return {t: (db[t].count if db[t].exists() else 0) for t in ("gpu_samples", "proc_samples", "cpu_samples")}


def record_node_event(db: Database, job_id: Optional[int], kind: str, detail: Dict[str, Any]) -> None:
    """Append a node event (``mps-start``, ``mps-stop``, ...); ``job_id`` None: the node's own. ``detail`` is
    stored as sorted-key JSON (values JSON cannot encode written with ``str``). Raises sqlite3.Error (locked
    past the busy timeout, disk full)."""
    with db.atomic():
        db.table("node_events").insert({"ts": time.time(), "job_id": job_id, "kind": kind,
                                  "detail_json": json.dumps(detail, sort_keys=True, default=str)})


def load_node_events(db: Database, job_id: Optional[int] = None) -> List[Dict[str, Any]]:
    """Node events (of ``job_id``; None: all), oldest first; ``detail_json`` as stored text."""
    if not db.table("node_events").exists():
        return []
    where, args = ("job_id = ?", [job_id]) if job_id is not None else (None, [])
    return list(db.table("node_events").rows_where(where, args, order_by="id"))
