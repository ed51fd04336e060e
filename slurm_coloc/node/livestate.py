"""The sampler's live state for the metrics endpoint and the databases it reads (no prometheus_client here).

The sampler calls ``LiveState.observe`` once per frame (its own thread): that keeps the latest GPU readings,
the per-(job, GPU) memory, SM utilization and share of the GPU, and adds to each (job, GPU) pair its share of
the energy the GPU used since the previous frame. The share is the Epilog's attribution rule
(node/lifecycle.py, docs/node.md): SM utilization when every process reports it, else memory, the MPS server
left out.

A scrape (another thread) calls ``LiveState.view``: the latest frame joined with the running jobs of this node
(the Prolog's ``job_runs`` rows that no Epilog closed, opened since this boot) into ``View`` rows. A job's
rows exist while it runs (open row) or while a process of it is on a GPU; when it ends they are gone and its
energy accumulators are dropped, so label cardinality follows the running jobs. The job rows and the
controller's OOM counts are read with each database opened read-only per call (scrapes have threads).
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from slurm_coloc.config import Config
from slurm_coloc.node.lifecycle import attribution_share
from slurm_coloc.nvml.readings import Frame, GpuReading
from slurm_coloc.store import jobs as store_jobs
from slurm_coloc.store import oom as store_oom
from slurm_coloc.store.db import open_readonly
from slurm_coloc.store.jobs import JobRunRow
from slurm_coloc.store.samples import ProcSample

log = logging.getLogger("slurm_coloc.sampler")

MIB = 1 << 20
GIB = 1 << 30
JOB_ROWS_TTL_S = 2.0  # a scrape re-reads the running jobs at most this often
OOM_TTL_S = 60.0
STALE_AFTER_INTERVALS = 5  # GPU series vanish when the last frame is older than this many intervals (min 5 s)


@dataclass(frozen=True)
class GpuView:
    """One GPU at the latest frame: the reading, MPS on/off and the number of jobs on it (tenants)."""

    reading: GpuReading
    mps: bool
    tenants: int


@dataclass(frozen=True)
class JobGpuView:
    """One job on one GPU.

    ``mode``: ``shard``, ``whole`` (whole GPUs, or every shard of one) or ``unknown`` (no Prolog row here).
    ``mem_used_bytes``: NVML memory of its processes (CUDA contexts included); ``mem_granted_bytes``: shards x
    1 GiB split evenly over its GPUs, a whole GPU's memory, or None. ``sm_util_ratio`` (0..1) is None where
    NVML gives none (MPS); ``share_ratio`` follows the attribution rule; ``energy_j`` is attributed since the
    sampler first saw it.
    """

    job_id: int
    gpu: int
    uuid: str
    user: str
    uid: Optional[int]
    mode: str
    mem_used_bytes: float
    mem_granted_bytes: Optional[float]
    sm_util_ratio: Optional[float]
    share_ratio: float
    energy_j: float


@dataclass(frozen=True)
class View:
    """What one scrape publishes. ``frame_ts`` None: no fresh frame (starting, or NVML reads failing)."""

    node: str
    frame_ts: Optional[float]
    gpus: List[GpuView]
    jobs: List[JobGpuView]
    frames: int
    read_errors: int
    job_rows_ok: bool
    started_ts: float


def boot_time(proc_root: str = "/proc") -> float:
    """This host's boot time (Unix s, ``btime`` of ``/proc/stat``); 0 when unreadable."""
    try:
        for line in Path(proc_root, "stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


def node_job_rows(cfg: Config, node: str) -> Callable[[], List[JobRunRow]]:
    """A reader of ``node``'s running job rows since this boot. A missing database is no job (the Prolog
    creates it); an unreadable one makes the reader raise ``StoreError``."""
    since = boot_time()
    path = cfg.node_db_path(node)

    def rows() -> List[JobRunRow]:
        if not path.exists():
            return []
        db = open_readonly(path, busy_timeout_s=1.0)
        try:
            return store_jobs.load_open_job_runs(db, node, since)
        finally:
            db.conn.close()
    return rows


def ctld_oom_counts(cfg: Config) -> Callable[[], Optional[Tuple[int, int]]]:
    """A reader of ``(OOM deaths, reruns submitted)`` from ``ctld.db`` (shared ``state_dir``), cached
    ``OOM_TTL_S``; None where the database cannot be read (the families are then absent). Never raises."""
    cache: Dict[str, Any] = {"at": -1e9, "value": None}

    def counts() -> Optional[Tuple[int, int]]:
        now = time.monotonic()
        if now - cache["at"] >= OOM_TTL_S:
            cache["at"] = now
            try:
                db = open_readonly(cfg.ctld_db_path, busy_timeout_s=1.0)
                try:
                    recs = store_oom.load_oom_events(db)
                finally:
                    db.conn.close()
                cache["value"] = (len(recs), sum(r.retry_status == "submitted" for r in recs))
            except Exception:  # no controller database here: no OOM families
                cache["value"] = None
        return cache["value"]
    return counts


class LiveState:
    """Latest frame, per-(job, GPU) figures and energy accumulators, shared between the sampler and scrapes.

    ``job_rows`` returns this node's running job rows (raises on an unreadable database; the caller logs).
    """

    def __init__(self, cfg: Config, node: str, job_rows: Callable[[], List[JobRunRow]],
                 interval_s: Optional[float] = None) -> None:
        self.cfg, self.node, self._job_rows = cfg, node, job_rows
        self.interval_s = interval_s or cfg.sampler_interval_s
        self.started_ts = time.time()
        self._lock = threading.Lock()
        self._frame: Optional[Frame] = None
        self._per: Dict[Tuple[int, int],
                        Tuple[float, Optional[float], float]] = {}  # (job, gpu) -> mem, sm, share
        self._energy: Dict[Tuple[int, int], float] = {}
        self._prev: Dict[int,
                         Tuple[float, Optional[float], Optional[float]]] = {}  # gpu -> ts, energy_j, power_w
        self._mps_seen: Set[int] = set()
        self.frames = self.read_errors = 0
        self._rows: List[JobRunRow] = []
        self._rows_at = -1e9
        self._rows_ok = True
        self._logged: Set[str] = set()

    def observe(self, frame: Frame, procs: Sequence[ProcSample]) -> None:
        """Take one frame (Unix s, MiB, W, J) and its attributed processes (sampler thread, per tick)."""
        by_gpu: Dict[int, List[dict]] = {}
        for p in procs:
            r = p.reading
            by_gpu.setdefault(r.gpu_index, []).append(
                {"job_id": p.job_id, "used_mem_mib": r.used_mem_mib, "sm_util_pct": r.sm_util_pct,
                 "mps_client": r.mps_client})
        per: Dict[Tuple[int, int], Tuple[float, Optional[float], float]] = {}
        gained: Dict[Tuple[int, int], float] = {}
        prev_all, now_all = self._prev, {}
        for g in frame.gpus:
            now_all[g.index] = (frame.ts, g.energy_j, g.power_w)
            rows = by_gpu.get(g.index, [])
            de = _energy_delta(prev_all.get(g.index), now_all[g.index])
            for job in {r["job_id"] for r in rows if r["job_id"] is not None}:
                mine = [r for r in rows if r["job_id"] == job]
                mem = sum(float(r["used_mem_mib"] or 0.0) for r in mine) * MIB
                sm = None if any(r["sm_util_pct"] is None for r in mine) else \
                    min(1.0, sum(float(r["sm_util_pct"]) for r in mine) / 100.0)
                share = attribution_share(job, rows)
                per[(job, g.index)] = (mem, sm, share)
                if de is not None and share > 0:
                    gained[(job, g.index)] = share * de
        mps = {i for i, rows in by_gpu.items() if any(r["mps_client"] for r in rows)}
        with self._lock:
            self._frame, self._per, self._prev, self._mps_seen = frame, per, now_all, mps
            for key, e in gained.items():
                self._energy[key] = self._energy.get(key, 0.0) + e
            for key in per:
                self._energy.setdefault(key, 0.0)
            self.frames += 1

    def read_failed(self) -> None:
        """Count a failed NVML read (the sampler's thread)."""
        with self._lock:
            self.read_errors += 1

    def _running(self, now: float) -> List[JobRunRow]:
        if now - self._rows_at >= JOB_ROWS_TTL_S:
            self._rows_at = now
            try:
                self._rows, self._rows_ok = self._job_rows(), True
                self._logged.discard("rows")
            except Exception as exc:  # unreadable state: serve GPU series, jobs without user/grant
                self._rows, self._rows_ok = [], False
                if "rows" not in self._logged:
                    self._logged.add("rows")
                    log.error("metrics: cannot read the running jobs of %s (%s: %s); job series carry no "
                              "user or grant until it is readable; sampling goes on", self.node,
                              type(exc).__name__, exc)
        return self._rows

    def view(self, now: Optional[float] = None) -> View:
        """The latest frame joined with the running jobs (a scrape's thread); drops accumulators of ended
        jobs.

        A frame older than ``max(5 s, STALE_AFTER_INTERVALS x interval_s)`` at ``now`` (None: the clock) is
        stale: no readings. An unreadable database is logged and gives no job rows.
        """
        now = time.time() if now is None else now
        rows = self._running(now)
        with self._lock:
            frame, per = self._frame, dict(self._per)
            energy, mps_seen = dict(self._energy), set(self._mps_seen)
            frames, errors = self.frames, self.read_errors
        fresh = frame is not None and now - frame.ts <= max(5.0, STALE_AFTER_INTERVALS * self.interval_s)
        readings = {g.index: g for g in frame.gpus} if frame is not None and fresh else {}
        info: Dict[int, JobRunRow] = {r.job_id: r for r in rows}
        pairs: Set[Tuple[int, int]] = set(per) if fresh else set()
        for r in rows:
            pairs.update((r.job_id, g) for g in _gpus(r.gpus))
        live_jobs = {j for j, _ in pairs}
        with self._lock:  # an ended job's accumulators go with it
            for key in [k for k in self._energy if k[0] not in live_jobs]:
                del self._energy[key]
        jobs: List[JobGpuView] = []
        for job, g in sorted(pairs):
            row = info.get(job)
            mem, sm, share = per.get((job, g), (0.0, None, 0.0)) if fresh else (0.0, None, 0.0)
            reading = readings.get(g)
            mode, granted = _grant(row, reading, self.cfg)
            jobs.append(JobGpuView(job_id=job, gpu=g, uuid=(reading.uuid or "") if reading else "",
                                   user=(row.user_name or "") if row else "", uid=row.uid if row else None,
                                   mode=mode, mem_used_bytes=mem, mem_granted_bytes=granted, sm_util_ratio=sm,
                                   share_ratio=share, energy_j=energy.get((job, g), 0.0)))
        tenants: Dict[int, int] = {}
        for j in jobs:
            tenants[j.gpu] = tenants.get(j.gpu, 0) + 1
        gpus = [GpuView(reading=g, mps=g.index in mps_seen or self._mps_daemon(g),
                        tenants=tenants.get(g.index, 0))
                for g in sorted(readings.values(), key=lambda r: r.index)]
        return View(node=self.node, frame_ts=frame.ts if fresh and frame is not None else None, gpus=gpus,
                    jobs=jobs, frames=frames, read_errors=errors, job_rows_ok=self._rows_ok,
                    started_ts=self.started_ts)

    def _mps_daemon(self, g: GpuReading) -> bool:
        """A job is registered with an MPS daemon of this GPU (``<run_dir>/mps/<key>[.uid<N>]/members/*``)."""
        base = Path(self.cfg.run_dir) / "mps"
        for key in {k for k in (g.uuid, f"idx{g.index}") if k}:
            for d in (base / key, *base.glob(f"{key}.uid*")):
                try:
                    if any((d / "members").iterdir()):
                        return True
                except OSError:
                    continue
        return False


def _energy_delta(prev: Optional[Tuple[float, Optional[float], Optional[float]]],
                  cur: Tuple[float, Optional[float], Optional[float]]) -> Optional[float]:
    """Energy (J) between two frames: counter difference, else mean power x dt (node/lifecycle.py's rule)."""
    if prev is None or cur[0] <= prev[0]:
        return None
    if cur[1] is not None and prev[1] is not None and cur[1] >= prev[1]:
        return cur[1] - prev[1]
    if cur[2] is not None and prev[2] is not None:
        return (cur[2] + prev[2]) / 2 * (cur[0] - prev[0])
    return None


def _gpus(text: Optional[str]) -> List[int]:
    return [int(x) for x in (text or "").split(",") if x.strip().isdigit()]


def _grant(row: Optional[JobRunRow], reading: Optional[GpuReading], cfg: Config) -> Tuple[str,
                                                                                          Optional[float]]:
    """``(mode, granted bytes on one GPU)``: shards x 1 GiB over the job's GPUs, or the GPU's memory if
    whole."""
    known_mib = reading.mem_total_mib if reading is not None else None
    total = known_mib * MIB if known_mib else cfg.gpu_mem_gib * GIB
    if row is None:  # a process of a job this node has no Prolog row for
        return "unknown", None
    n = max(1, len(_gpus(row.gpus)))
    if row.shards and row.shards < cfg.gpu_mem_gib * n:
        return "shard", row.shards / n * GIB
    return "whole", float(total)
