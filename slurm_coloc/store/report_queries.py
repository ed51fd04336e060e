"""Read-only aggregate queries for coloc-report over the sample tables of a node database. The SQL aggregates
inside SQLite so a 30-day window stays fast (``benchmarks/report_speed.py``). Times are Unix s; windows are
inclusive. Weights: every ``gpu_samples`` row covers ``res_s`` seconds (the sampling interval for raw rows,
the bucket for rows folded by ``samples.downsample``), so means are time-weighted: ``SUM(x * res_s) /
SUM(res_s)`` over rows where ``x`` is not NULL. Percentiles come from a 1-%-wide histogram of the same weights
(truncated to whole percent)."""
from __future__ import annotations

import bisect
import math
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

from sqlite_utils import Database

from slurm_coloc.errors import StoreError
from slurm_coloc.store.db import open_readonly

GPU_TABLE = "gpu_samples"
PROC_TABLE = "proc_samples"


@dataclass(frozen=True)
class GpuWindowStats:
    """Aggregates of one GPU's samples over a time window (None: no non-NULL sample of that metric).
    ``covered_s``: seconds covered by samples (sum of ``res_s``); ``util_mean``: coarse NVML utilization (%),
    time-weighted mean; smact_mean / smact_p95, smocc_mean / smocc_p95: GPM SM activity / occupancy (%);
    ``energy_j``: rise of the NVML energy counter, or the power integral when the counter is missing or went
    backwards (driver reload)."""

    gpu_index: int
    covered_s: float
    first_ts: Optional[float]
    last_ts: Optional[float]
    util_mean: Optional[float]
    smact_mean: Optional[float]
    smact_p95: Optional[float]
    smocc_mean: Optional[float]
    smocc_p95: Optional[float]
    mem_used_mean_mib: Optional[float]
    mem_used_max_mib: Optional[float]
    power_mean_w: Optional[float]
    energy_j: Optional[float]


def open_for_report(path: Union[str, Path]) -> Database:
    """Open a database read-only for coloc-report, also as a user who cannot write its directory. A WAL
    database needs its ``-shm`` file; after a clean close the side files are gone and a non-root reader cannot
    create them in the root-owned directory ("attempt to write a readonly database"). Then the file is opened
    ``immutable=1``: all committed data is in the main file, read without locks (a writer active meanwhile may
    fail the read; the caller reports that file and skips it). Raises StoreError (missing, unreadable or not a
    SQLite database)."""
    try:
        return open_readonly(path)
    except StoreError as exc:
        if "readonly database" not in exc.message and "unable to open" not in exc.message:
            raise
    p = Path(path)
    try:
        conn = sqlite3.connect(f"file:{p}?mode=ro&immutable=1", uri=True)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as err:
        raise StoreError(f"cannot read database {str(p)!r}: {err}") from None
    return Database(conn)


def has_samples(db: Database) -> bool:
    """Whether the database has a GPU sample table (a node without the sampler has none)."""
    return db[GPU_TABLE].exists()


def _where(t0: Optional[float], t1: Optional[float], gpus: Optional[Sequence[int]]) -> Tuple[str,
                                                                                             List[object]]:
    parts, args = ["1"], []  # type: List[str], List[object]
    if t0 is not None:
        parts.append("ts >= ?")
        args.append(float(t0))
    if t1 is not None:
        parts.append("ts <= ?")
        args.append(float(t1))
    if gpus is not None:
        parts.append(f"gpu_index IN ({','.join('?' * len(gpus))})" if gpus else "0")
        args.extend(int(g) for g in gpus)
    return " AND ".join(parts), args


def percentile_from_histogram(hist: Dict[int, float], q: float) -> Optional[float]:
    """The ``q`` (0..1) quantile of ``{bucket %: weight s}``; None when empty or its total is not positive.
    Nearest-rank on cumulative weight: the smallest bucket whose cumulative weight reaches ``q`` of the total.
    """
    total = sum(hist.values())
    if total <= 0:
        return None
    acc = 0.0
    for bucket in sorted(hist):
        acc += hist[bucket]
        if acc >= q * total - 1e-9:
            return float(bucket)
    return float(max(hist))


def _scan_where(db: Database, t0: Optional[float], t1: Optional[float], gpus: Optional[Sequence[int]]
                ) -> Tuple[str, List[object]]:
    """WHERE clause for a window scan; one covering most of the table skips the ts index (``+ts``): faster."""
    where, args = _where(t0, t1, gpus)
    lo, hi = db.execute(f"SELECT MIN(ts), MAX(ts) FROM {GPU_TABLE}").fetchone()
    if lo is not None and hi is not None and hi > lo:
        a, b = (lo if t0 is None else max(lo, t0)), (hi if t1 is None else min(hi, t1))
        if (b - a) / (hi - lo) > 0.3:
            where = where.replace("ts >=", "+ts >=").replace("ts <=", "+ts <=")
    return where, args


_MEANS = ("util_pct", "smact_pct", "smocc_pct", "mem_used_mib", "power_w")


def _means_query(path: str, where: str, args: List[object]) -> List[tuple]:
    db = open_for_report(path)
    cols = ", ".join(f"SUM({m} * res_s), COUNT({m})" for m in _MEANS)
    rows = db.execute(f"SELECT gpu_index, SUM(res_s), COUNT(*), {cols}, MAX(mem_used_mib), MIN(energy_j), "
                      f"MAX(energy_j), COUNT(energy_j), MIN(ts), MAX(ts) FROM {GPU_TABLE} WHERE {where} "
                      f"GROUP BY gpu_index ORDER BY gpu_index", args).fetchall()
    out = []
    for r in rows:  # a metric NULL on some rows only: its own exact denominator (rare: NVML lacks it or not)
        r = list(r)
        for k, m in enumerate(_MEANS):
            if r[4 + 2 * k] not in (0, r[2]):
                den = db.execute(f"SELECT SUM(res_s) FROM {GPU_TABLE} WHERE {where} AND gpu_index = ? AND "
                                 f"{m} "
                                 f"IS NOT NULL", [*args, r[0]]).fetchone()[0]
                r[4 + 2 * k] = -float(den)  # negative marks an exact denominator
        out.append(tuple(r))
    return out


def _hist_query(path: str, where: str, args: List[object]) -> Dict[int,
                                                                   Tuple[Dict[int, float], Dict[int, float]]]:
    db = open_for_report(path)
    out: Dict[int, Tuple[Dict[int, float], Dict[int, float]]] = {}
    sql = (f"SELECT gpu_index * 1000000 + COALESCE(CAST(smact_pct AS INTEGER), 999) * 1000 "
           f"+ COALESCE(CAST(smocc_pct AS INTEGER), 999) AS k, SUM(res_s) FROM {GPU_TABLE} WHERE {where} "
           "GROUP BY k")
    for key, weight in db.execute(sql, args).fetchall():
        gpu, rest = divmod(int(key), 1000000)
        a, b = divmod(rest, 1000)
        sma, smo = out.setdefault(gpu, ({}, {}))
        if a != 999:
            sma[a] = sma.get(a, 0.0) + float(weight)
        if b != 999:
            smo[b] = smo.get(b, 0.0) + float(weight)
    return out


def gpu_window_stats(db: Database, t0: Optional[float] = None, t1: Optional[float] = None,
                     gpus: Optional[Sequence[int]] = None,
                     path: Optional[str] = None) -> List[GpuWindowStats]:
    """Per-GPU aggregates of ``gpu_samples`` in ``[t0, t1]`` (None: unbounded), by index; [] without samples.
    Two scans inside SQLite: time-weighted sums, and a joint SM activity x SM occupancy histogram (1 %
    buckets, truncated) for the p95s. With ``path`` (the database file) the two run in parallel threads, each
    on its own read-only connection (sqlite3 releases the GIL while it steps). ``gpus``: None all, empty none.
    Raises StoreError (a scan's own read-only connection to the file cannot be opened (``open_for_report``)).
    """
    if not has_samples(db):
        return []
    where, args = _scan_where(db, t0, t1, gpus)
    if path:
        with ThreadPoolExecutor(max_workers=2) as pool:
            f_hist = pool.submit(_hist_query, path, where, args)
            rows = _means_query(path, where, args)
            hists = f_hist.result()
    else:
        file = db.execute("PRAGMA database_list").fetchone()[2]
        rows, hists = _means_query(file, where, args), _hist_query(file, where, args)
    out = []
    for r in rows:
        gpu, cov = int(r[0]), float(r[1] or 0.0)
        means = []
        for k in range(len(_MEANS)):
            num, cnt = r[3 + 2 * k], r[4 + 2 * k]
            den = -cnt if cnt < 0 else (cov if cnt else 0.0)
            means.append(num / den if num is not None and den else None)
        mem_max, e_min, e_max, n_e, first, last = r[3 + 2 * len(_MEANS):]
        energy = None
        if n_e and n_e > 1 and e_max is not None and e_min is not None and e_max >= e_min:
            energy = float(e_max - e_min)
        elif means[4] is not None:
            energy = means[4] * cov
        sma, smo = hists.get(gpu, ({}, {}))
        out.append(GpuWindowStats(
            gpu_index=gpu, covered_s=cov, first_ts=first, last_ts=last, util_mean=means[0],
            smact_mean=means[1],
            smact_p95=percentile_from_histogram(sma, 0.95), smocc_mean=means[2],
            smocc_p95=percentile_from_histogram(smo, 0.95), mem_used_mean_mib=means[3],
            mem_used_max_mib=mem_max,
            power_mean_w=means[4], energy_j=energy))
    return out


def job_util_sums(db: Database, spans: Sequence[Tuple[int, int, float, float]], bucket_s: float = 600.0
                  ) -> Dict[int, Tuple[float, float]]:
    """Coarse utilization of many jobs at once: ``{key: (sum util_pct x s, covered s)}``; {} without samples.
    ``spans``: ``(key, gpu_index, t0, t1)``; a key's spans add up. One scan folds the samples into
    ``bucket_s`` buckets per GPU (a speed setting, not a resolution); whole buckets inside a span come from
    prefix sums, the partial ones at its ends from exact range queries, so the result is exact."""
    if not spans or not has_samples(db):
        return {}
    lo = min(s[2] for s in spans)
    hi = max(s[3] for s in spans)
    b = float(bucket_s)
    where, args = _scan_where(db, lo, hi, None)
    rows = db.execute(f"SELECT gpu_index, CAST(ts / {b} AS INTEGER) AS bk, SUM(util_pct * res_s), "
                      f"SUM(CASE WHEN util_pct IS NULL THEN 0 ELSE res_s END) FROM {GPU_TABLE} WHERE {where} "
                      f"GROUP BY gpu_index, bk ORDER BY gpu_index, bk", args).fetchall()
    idx: Dict[int, List[int]] = {}
    cum: Dict[int, List[Tuple[float, float]]] = {}
    for gpu, bk, num, den in rows:
        g = int(gpu)
        pn, pd = cum[g][-1] if g in cum else (0.0, 0.0)
        idx.setdefault(g, []).append(int(bk))
        cum.setdefault(g, []).append((pn + (num or 0.0), pd + (den or 0.0)))
    exact = (f"SELECT SUM(util_pct * res_s), SUM(CASE WHEN util_pct IS NULL THEN 0 ELSE res_s END) "
             f"FROM {GPU_TABLE} WHERE ts >= ? AND ts < ? AND gpu_index = ?")
    out: Dict[int, Tuple[float, float]] = {}
    for key, gpu, t0, t1 in spans:
        first, last = math.ceil(t0 / b), math.floor(t1 / b)  # whole buckets first..last-1
        parts = [(t0, t1 + 1e-6)] if last - first < 1 else [(t0, first * b), (last * b, t1 + 1e-6)]
        num = den = 0.0
        for a, z in parts:
            if z > a:
                n, d = db.execute(exact, [a, z, gpu]).fetchone()
                num, den = num + (n or 0.0), den + (d or 0.0)
        if last - first >= 1 and gpu in idx:
            ks = idx[gpu]
            i = bisect.bisect_left(ks, first)
            j = bisect.bisect_left(ks, last) - 1
            if j >= i:
                before = cum[gpu][i - 1] if i > 0 else (0.0, 0.0)
                num += cum[gpu][j][0] - before[0]
                den += cum[gpu][j][1] - before[1]
        pn, pd = out.get(key, (0.0, 0.0))
        out[key] = (pn + num, pd + den)
    return out


def job_peak_mem_mib(db: Database, job_id: int) -> Optional[float]:
    """Peak over sample instants of the summed NVML memory of ``job_id``'s processes (MiB), or None."""
    if not db[PROC_TABLE].exists():
        return None
    row = db.execute(f"SELECT MAX(s) FROM (SELECT SUM(used_mem_mib) AS s FROM {PROC_TABLE} WHERE job_id = ? "
                     f"GROUP BY ts)", [int(job_id)]).fetchone()
    return None if row is None or row[0] is None else float(row[0])


def gpu_series(db: Database, t0: float, t1: float, bucket_s: float) -> List[Tuple[int, float, Optional[float],
                                                                                    Optional[float]]]:
    """Plot series: ``(gpu_index, bucket start, max mem_used_mib, mean smact_pct)`` by GPU, then time.
    Bucketing happens in SQLite, so a 30-day window gives at most ``(t1 - t0) / bucket_s`` rows per GPU
    (``bucket_s`` at least 1 ms)."""
    if not has_samples(db):
        return []
    b = max(float(bucket_s), 1e-3)
    sql = (f"SELECT gpu_index, CAST(ts / {b} AS INTEGER) * {b} AS bt, MAX(mem_used_mib), AVG(smact_pct) "
           f"FROM {GPU_TABLE} WHERE ts >= ? AND ts <= ? GROUP BY gpu_index, bt ORDER BY gpu_index, bt")
    return [(int(g), float(t), m, s) for g, t, m, s in db.execute(sql, [float(t0), float(t1)]).fetchall()]


def gpu_totals_mib(db: Database) -> Dict[int, float]:
    """``{gpu_index: total memory MiB}`` from the sampler's GPU table ({} when absent)."""
    if not db.table("gpus").exists():
        return {}
    return {int(g): float(m) for g, m in db.execute("SELECT gpu_index, mem_total_mib FROM gpus").fetchall()
            if m is not None}


def load_job_row(db: Database, job_id: int) -> Optional[Dict[str, object]]:
    """The controller ``jobs`` row of ``job_id`` as a dict, or None (one indexed lookup)."""
    if not db.table("jobs").exists():
        return None
    rows = list(db.table("jobs").rows_where("job_id = ?", [int(job_id)]))
    return rows[0] if rows else None


def load_job_run_rows(db: Database, job_id: int) -> List[Dict[str, object]]:
    """The node ``job_runs`` rows of ``job_id`` (one per node in that database)."""
    if not db.table("job_runs").exists():
        return []
    return list(db.table("job_runs").rows_where("job_id = ?", [int(job_id)]))
