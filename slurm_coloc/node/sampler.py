"""The node sampler: one daemon per node reads NVML every ``sampler_interval_s`` and logs GPUs and processes.

Each process is attributed to its Slurm job by node/attribution.py; MPS clients are listed by NVML like other
processes. Rows are buffered and written in one transaction per ``sampler_batch_s``; a locked or full database
or an NVML error is logged once per kind and the sampler carries on (the buffer is bounded: oldest rows
dropped first). Each job's CPU use (node/cpu.py) goes into ``cpu_samples``, one row per job and tick. Old
samples are downsampled and purged every ``RETENTION_EVERY_S``. One instance per node
(node/sampler_daemon.py); ``SIGUSR1`` (the Epilog's flush request, same module) writes the buffer at once.

Between ticks the loop blocks once in ``select`` on a self-pipe: setting ``stopping`` or ``flush_requested``
(the signal handlers, or another thread) writes a byte to it, which ends the wait at once.
"""
from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import sqlite3
import time
from pathlib import Path
from types import FrameType
from typing import Any, Dict, List, Optional, Protocol, Tuple

from slurm_coloc.config import Config
from slurm_coloc.errors import ColocError
from slurm_coloc.node import sampler_daemon
from slurm_coloc.node.attribution import JobAttributor
from slurm_coloc.node.cpu import CpuReader
from slurm_coloc.node.watchdog import Watchdog
from slurm_coloc.nvml.readings import Frame, GpuReading
from slurm_coloc.store import oom as store_oom
from slurm_coloc.store import samples as store_samples
from slurm_coloc.store.db import open_node_db

log = logging.getLogger("slurm_coloc.sampler")

RETENTION_EVERY_S = 600.0
MAX_BUFFER_ROWS = 200_000


class Reader(Protocol):
    """A source of frames: ``NvmlReader`` or ``ReplayReader``."""

    def read(self) -> Frame: ...

    def close(self) -> None: ...


class Live(Protocol):
    """Where each frame is published for the metrics endpoint (``node.livestate.LiveState``)."""

    def observe(self, frame: Frame, procs: List[store_samples.ProcSample]) -> None:
        """Publish one frame (wall time Unix s) and its attributed processes."""
        ...

    def read_failed(self) -> None: ...


class Sampler:
    """The sampling loop.

    ``db_path`` overrides the node database (tests); ``live`` gets every frame for the metrics endpoint (its
    failure is logged once and never stops sampling).
    """

    def __init__(self, cfg: Config, node: str, reader: Reader, db_path: Optional[Path] = None,
                 attributor: Optional[JobAttributor] = None, interval_s: Optional[float] = None,
                 live: Optional[Live] = None, cpu: Optional[CpuReader] = None) -> None:
        self.cfg, self.node, self.reader = cfg, node, reader
        self.db_path = Path(db_path) if db_path else cfg.node_db_path(node)
        self.attr = attributor or JobAttributor()
        # cgroup owners and SLURM_JOB_ID claims are checked against the job's uid
        if self.attr.job_uid is None:
            self.attr.job_uid = self._job_uid
        if self.attr.uid_jobs is None:
            self.attr.uid_jobs = self._uid_jobs
        self.interval_s = interval_s or cfg.sampler_interval_s
        self.watchdog = Watchdog(cfg, node, self.db_path, self.attr)  # may shorten the tick: node/watchdog.py
        self.tick_s = self.interval_s
        self.gpu_buf: List[Dict[str, Any]] = []
        self.proc_buf: List[Dict[str, Any]] = []
        self.cpu_buf: List[Dict[str, Any]] = []
        self.cpu = cpu or CpuReader()
        self.static: Dict[int, GpuReading] = {}
        self._static_dirty = False
        self._db: Any = None
        self._logged: set = set()
        self.frames = self.errors = self.flushes = self.dropped = 0
        self._last_retention = 0.0
        self._wake: Optional[Tuple[int,
                                   int]] = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)  # self-pipe (read, write)
        self._stopping = False
        self._flush_requested = False
        self.live = live

    @property
    def stopping(self) -> bool:
        """Set by SIGTERM/SIGINT (or another thread): finish the step, flush, return."""
        return self._stopping

    @stopping.setter
    def stopping(self, value: bool) -> None:
        """Set or clear the stop request; setting it wakes the loop."""
        self._stopping = value
        if value:
            self._wakeup()

    @property
    def flush_requested(self) -> bool:
        """Set by SIGUSR1 (the Epilog's flush request): the loop writes the buffer at once."""
        return self._flush_requested

    @flush_requested.setter
    def flush_requested(self, value: bool) -> None:
        """Set or clear the flush request; setting it wakes the loop (which writes, then clears it)."""
        self._flush_requested = value
        if value:
            self._wakeup()

    def _wakeup(self) -> None:
        """End the current wait (safe in a signal handler: one non-blocking write; a full pipe is awake
        anyway)."""
        wake = self._wake
        if wake is not None:
            with contextlib.suppress(OSError):  # EAGAIN: already full of wake-ups
                os.write(wake[1], b"!")

    def __del__(self) -> None:
        wake, self._wake = getattr(self, "_wake", None), None
        if wake is not None:  # nobody can set a flag any more: the fds cannot be written after this close
            for fd in wake:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _once(self, kind: str, msg: str, *args: Any) -> None:
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning(msg, *args)

    def step(self) -> bool:
        """Read one frame and buffer its rows; False when the read failed (logged, sampler carries on)."""
        try:
            frame = self.reader.read()
            if frame.error:
                raise ColocError(f"recorded NVML error: {frame.error}")
        except Exception as exc:  # NVMLError (GPU lost, Xid), replay error: keep sampling
            self.errors += 1
            self._once(f"read:{type(exc).__name__}", "NVML read failed (%s): %s; sampling goes on",
                       type(exc).__name__, exc)
            if self.live is not None:
                self.live.read_failed()
            return False
        self.frames += 1
        for g in frame.gpus:
            old = self.static.get(g.index)
            if old is None or (old.uuid, old.name, old.mem_total_mib) != (g.uuid, g.name, g.mem_total_mib):
                self.static[g.index] = g
                self._static_dirty = True
        procs = [store_samples.ProcSample(p, self.attr.job_of(p.pid)) for p in frame.procs]
        self.tick_s = self.watchdog.tick(frame, {p.reading.pid: p.job_id for p in procs}, self.interval_s)
        self.gpu_buf.extend(store_samples.gpu_rows(frame.ts, frame.gpus, self.tick_s))
        self.proc_buf.extend(store_samples.proc_rows(frame.ts, procs, self.tick_s))
        self._read_cpu(frame.ts, procs)
        if self.live is not None:
            try:
                self.live.observe(frame, procs)
            except Exception as exc:  # the metrics endpoint never stops sampling
                self._once(f"live:{type(exc).__name__}", "metrics: cannot publish the frame (%s: %s); "
                           "sampling goes on", type(exc).__name__, exc)
        over = len(self.gpu_buf) + len(self.proc_buf) + len(self.cpu_buf) - MAX_BUFFER_ROWS
        if over > 0:
            self.dropped += over
            for buf in (self.gpu_buf, self.proc_buf, self.cpu_buf):
                drop = min(over, len(buf))
                del buf[:drop]
                over -= drop
        return True

    def _read_cpu(self, ts: float, procs: List[store_samples.ProcSample]) -> None:
        """Buffer the CPU use of every job with a process on a GPU (node/cpu.py); a failure is logged once."""
        job_pids: Dict[int, List[int]] = {}
        for p in procs:
            if p.job_id is not None:
                job_pids.setdefault(p.job_id, []).append(p.reading.pid)
        try:
            self.cpu_buf.extend(store_samples.cpu_rows(ts, self.cpu.read(job_pids), self.tick_s))
        except Exception as exc:  # CPU figures are extra: never stop the GPU sampling
            self._once(f"cpu:{type(exc).__name__}", "cannot read the jobs' CPU use (%s: %s); "
                       "sampling goes on", type(exc).__name__, exc)

    def _job_uid(self, job_id: int) -> Optional[int]:
        """The uid of ``job_id`` as the node Prolog recorded it (node attribution's check of a claimed
        job)."""
        try:
            return store_oom.job_uid(self._open(), job_id)
        except (sqlite3.Error, ColocError):
            return None

    def _uid_jobs(self, uid: int) -> Optional[List[int]]:
        """Jobs of ``uid`` running on this node as the node Prolog recorded them (None: unreadable)."""
        try:
            return store_oom.running_jobs_of_uid(self._open(), uid)
        except (sqlite3.Error, ColocError):
            return None

    def _open(self) -> Any:
        if self._db is None:
            self._db = open_node_db(self.db_path, self.cfg.db_busy_timeout_s)
        return self._db

    def flush(self) -> bool:
        """Write buffered rows in one transaction (kept for the next try on failure); return success. After a
        success the flush marker says every frame read before this call is in the database."""
        upto_ts = time.time()
        if not (self.gpu_buf or self.proc_buf or self.cpu_buf or self._static_dirty):
            self._mark(upto_ts)
            return True
        try:
            db = self._open()
            store_samples.write_rows(db, self.gpu_buf, self.proc_buf,
                                     list(self.static.values()) if self._static_dirty else [], self.cpu_buf)
        except (sqlite3.Error, ColocError, OSError) as exc:
            self._once(f"flush:{exc}", "cannot write samples to %s (%s); kept %d rows in memory",
                       self.db_path, exc, len(self.gpu_buf) + len(self.proc_buf) + len(self.cpu_buf))
            if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError):
                self._db = None  # reopen next time (e.g. the file was replaced)
            return False
        self.gpu_buf.clear()
        self.proc_buf.clear()
        self.cpu_buf.clear()
        self._static_dirty = False
        self.flushes += 1
        self._mark(upto_ts)
        return True

    def _mark(self, upto_ts: float) -> None:
        try:
            sampler_daemon.write_marker(self.cfg, self.node, upto_ts, self.flushes)
        except OSError as exc:
            self._once(f"marker:{type(exc).__name__}", "cannot write the flush marker (%s); Epilogs "
                       "wait for it in vain", exc)

    def retention(self, now: Optional[float] = None) -> int:
        """Downsample raw rows older than ``sampler_raw_retention_h``, purge beyond
        ``sampler_retention_days``.

        Returns rows folded plus deleted; 0 when it failed (sqlite3 and ``ColocError`` failures are logged
        once, never raised).
        """
        now = time.time() if now is None else now
        try:
            db = self._open()
            n = store_samples.downsample(db, now - self.cfg.sampler_raw_retention_h * 3600,
                                         self.cfg.sampler_downsample_s)
            n += store_samples.purge(db, now - self.cfg.sampler_retention_days * 86400)
            return n
        except (sqlite3.Error, ColocError) as exc:
            self._once(f"retention:{exc}", "retention failed: %s", exc)
            return 0

    def run(self, duration_s: Optional[float] = None, max_frames: Optional[int] = None) -> None:
        """Sample until stopped (SIGTERM/SIGINT), ``duration_s`` (monotonic) or ``max_frames`` (reads, failed
        ones included); flush at exit and close the reader.
        """
        self._loop(duration_s, max_frames)
        self.flush()
        self.reader.close()

    def _loop(self, duration_s: Optional[float], max_frames: Optional[int]) -> None:
        t_start = time.monotonic()
        next_tick = t_start
        last_flush = t_start
        while not self.stopping:
            self.step()
            now = time.monotonic()
            if now - last_flush >= self.cfg.sampler_batch_s:
                self.flush()
                last_flush = now
            if now - self._last_retention >= RETENTION_EVERY_S:
                self.retention()
                self._last_retention = now
            if (duration_s is not None and now - t_start >= duration_s) or \
                    (max_frames is not None and self.frames + self.errors >= max_frames):
                break
            next_tick += self.tick_s
            if next_tick < now:  # we fell behind (slow NVML or DB): skip, do not burst
                next_tick = now
            self._sleep(next_tick - now)

    def _sleep(self, s: float) -> None:
        """Wait ``s`` seconds in one blocking ``select`` on the wake pipe; serve a flush request (SIGUSR1) as
        soon as it is set, and return early when ``stopping`` is set. A flag set just before the wait has
        already written its byte, so the wait cannot miss it."""
        end = time.monotonic() + max(0.0, s)
        wake = self._wake
        while not self._stopping:
            if self._flush_requested:
                self._flush_requested = False
                self.flush()
            left = end - time.monotonic()
            if left <= 0:
                break
            if wake is None:  # closed (only in ``__del__``): plain sleep
                time.sleep(left)
                continue
            if select.select([wake[0]], [], [], left)[0]:
                with contextlib.suppress(OSError):
                    os.read(wake[0], 512)  # drain: the flags say what was asked


def make_reader(cfg: Config, replay: Optional[str] = None,
                pid_map: Optional[Dict[int, int]] = None) -> Reader:
    """``ReplayReader`` of a recording (argument or ``sampler_replay_path``; ``pid_map``: recorded -> live),
    else ``NvmlReader``.

    Raises:
        NvmlUnavailable / ColocError: no NVML, or a bad recording.
    """
    from slurm_coloc.nvml import NvmlReader, ReplayReader
    path = replay or cfg.sampler_replay_path
    if path:
        log.info("replaying the NVML recording %s (not live readings)", path)
        return ReplayReader(path, pid_map)
    return NvmlReader()


def install_signal_handlers(sampler: Sampler) -> None:
    """SIGTERM/SIGINT: finish the step, flush, exit. SIGUSR1: flush now (served by the loop, not here)."""
    def _stop(signum: int, frame: Optional[FrameType]) -> None:
        sampler.stopping = True

    def _flush(signum: int, frame: Optional[FrameType]) -> None:
        sampler.flush_requested = True
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGUSR1, _flush)
