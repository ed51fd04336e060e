"""The GPU watchdog: runs in the node sampler's tick and stops a shard job that takes more than its grant.

On every frame (``Frame.lists``: NVML's compute and MPS process lists with per-process memory, pids
attributed by node/attribution.py), for every tenant (a shard job with a ``<run_dir>/jobs/<id>.env`` file and
an open ``job_runs`` row naming its GPU):

- **over-grant**: the job's summed NVML memory on a GPU exceeds its grant there plus
  ``watchdog_tolerance_mib``. The grant is its recorded shards (``job_runs.shards``, from slurmctld's GRES) x
  1024 MiB, what its MPS fence is made of; 0 on a GPU it holds no shard of. NVML's per-process figure counts
  the CUDA context, as the fence does.
- **outside-mps**: a ``COLOC_SHARE=mps`` job has a process in the GPU's compute list that is not in its MPS
  list (a context beside the MPS server; measured on the H100: listed by
  ``nvmlDeviceGetComputeRunningProcesses``, not by ``nvmlDeviceGetMPSComputeRunningProcesses``). Not checked
  when the MPS list could not be read.

A finding must hold in two consecutive frames (a process exiting between NVML's two list calls is in one list
only for one frame). Then, with ``watchdog_action: stop``, every process of the job seen on any GPU gets
SIGKILL (each pid re-checked by /proc start time, never the MPS server binary), the event is written
(``watchdog_events``), and a background thread writes one line to the job's stderr (as its user) and runs
``scancel``. ``record`` only writes the event. A job is acted on once.

Pacing: ``watchdog_interval_s`` (0.5 s) while a tenant runs, ``watchdog_fast_interval_s`` (0.1 s) while one
is above ``watchdog_near_pct`` of its grant or a finding awaits confirmation: a job is stopped at most
interval + fast interval + the kill after its memory appears in NVML (18 ms after a 20 GiB MPS allocation on
the H100).
"""
from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Sequence, Set, Tuple

from slurm_coloc.config import Config
from slurm_coloc.node import jobenv
from slurm_coloc.node.attribution import JobAttributor
from slurm_coloc.node.violations import Finding, Tenant, find_violations, near_grant, user_message
from slurm_coloc.nvml.readings import Frame
from slurm_coloc.store import oom as store_oom
from slurm_coloc.store.db import open_node_db
from slurm_coloc.units import shards_to_mib

log = logging.getLogger("slurm_coloc.watchdog")

MPS_SERVER_BIN = "nvidia-cuda-mps-server"
REFRESH_S = 5.0


def is_mps_server(pid: int, control_bin: Optional[str], proc_root: str = "/proc") -> bool:
    """Whether ``pid`` runs the real ``nvidia-cuda-mps-server`` (the file beside ``control_bin``); False if
    unknown.

    Compared by the path of ``/proc/<pid>/exe``, so a user process renamed to look like the server is not
    exempt.
    """
    if not control_bin:
        return False
    try:
        exe = os.readlink(f"{proc_root}/{pid}/exe")
    except OSError:
        return False
    return exe == str(Path(os.path.realpath(control_bin)).parent / MPS_SERVER_BIN)


class Watchdog:
    """Per-node watchdog state, fed one frame per sampler tick (``tick``, which never raises).

    ``attributor`` is the sampler's pid -> job mapping, reused to re-check a pid before signalling it.
    """

    def __init__(self, cfg: Config, node: str, db_path: Path, attributor: JobAttributor,
                 proc_root: str = "/proc") -> None:
        self.cfg, self.node, self.db_path = cfg, node, Path(db_path)
        self.attr, self.proc_root = attributor, proc_root
        self._db: Any = None
        self.tenants: Dict[int, Tenant] = {}
        self._env_names: Optional[FrozenSet[int]] = None
        self._refreshed = 0.0
        self._pending: Set[Tuple[int, int, str]] = set()
        self.acted: Dict[int, float] = {}
        self.events: List[store_oom.WatchdogEvent] = []
        self.threads: List[threading.Thread] = []
        self._logged: Set[str] = set()
        from slurm_coloc.node.mps_daemon import resolve_binary
        self.control_bin = resolve_binary(cfg)

    def _once(self, kind: str, msg: str, *args: Any) -> None:
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning(msg, *args)

    def _open(self) -> Any:
        if self._db is None:
            self._db = open_node_db(self.db_path, self.cfg.db_busy_timeout_s)
        return self._db

    def refresh_tenants(self, force: bool = False) -> Dict[int, Tenant]:
        """job id -> ``Tenant`` (grant MiB = shards x 1024), reloaded when the env files change or every
        ``REFRESH_S``.

        A tenant is an env file (its share) and an open ``job_runs`` row (GPU, shards, uid); a job with
        several GPUs is not one (no MPS, no fence).

        Raises:
            StoreError, sqlite3.Error: the node database cannot be opened or read (``tick`` catches them).
        """
        names = jobenv.env_job_ids(self.cfg)
        now = time.monotonic()
        if not force and names == self._env_names and now - self._refreshed < REFRESH_S:
            return self.tenants
        self._env_names, self._refreshed = names, now
        if not names:
            self.tenants = {}
            return self.tenants
        runs = {r.job_id: r for r in store_oom.running_runs(self._open(), self.node)}
        tenants: Dict[int, Tenant] = {}
        for job in names:
            run = runs.get(job)
            if run is None or len(run.gpus) != 1 or not run.shards:
                continue
            share = dict(jobenv.read_env(self.cfg, job)).get("COLOC_SHARE")
            tenants[job] = Tenant(job, run.gpus[0], float(shards_to_mib(run.shards)),
                                  "mps" if share == "mps" else "timeslice", run.uid)
        self.tenants = tenants
        self.acted = {j: t for j, t in self.acted.items() if j in tenants}
        return tenants

    def tick(self, frame: Frame, job_of: Mapping[int, Optional[int]], interval_s: float) -> float:
        """Check one frame and act on confirmed findings (seen in two frames in a row); return the next period
        (s).

        The period is ``interval_s`` capped by ``watchdog_interval_s``, and by ``watchdog_fast_interval_s``
        while a finding is pending or a tenant is near its grant. Never raises: an error is logged once,
        ``interval_s`` returned.
        """
        if self.cfg.watchdog_action == "off":
            return interval_s
        try:
            return self._tick(frame, job_of, interval_s)
        except Exception as exc:  # the watchdog must never stop the sampler
            self._once(f"tick:{type(exc).__name__}", "watchdog tick failed (%s: %s); sampling goes on",
                       type(exc).__name__, exc)
            return interval_s

    def _tick(self, frame: Frame, job_of: Mapping[int, Optional[int]], interval_s: float) -> float:
        tenants = self.refresh_tenants()
        if not tenants:
            self._pending.clear()
            return interval_s
        unknown = [pid for gl in frame.lists for pid, _ in (gl.compute or ()) if pid not in job_of]
        if unknown:
            job_of = {**job_of, **{pid: self.attr.job_of(pid) for pid in unknown}}
        live = {j: t for j, t in tenants.items() if j not in self.acted}
        found = [f for f in find_violations(frame.lists, job_of, live, self.cfg.watchdog_tolerance_mib)
                 if not self._exempt(f)]
        confirmed = [f for f in found if f.key in self._pending]
        self._pending = {f.key for f in found if f.key not in self._pending}
        for f in confirmed:
            if f.job_id not in self.acted:
                self._act(f, frame, job_of)
        base = min(interval_s, self.cfg.watchdog_interval_s)
        if self._pending or near_grant(frame.lists, job_of, live, self.cfg.watchdog_near_pct):
            return min(base, self.cfg.watchdog_fast_interval_s)
        return base

    def _exempt(self, f: Finding) -> bool:
        """A finding made only of the real MPS server's process (never a job's, whatever /proc says)."""
        return all(is_mps_server(pid, self.control_bin, self.proc_root) for pid in f.pids)

    def _act(self, f: Finding, frame: Frame, job_of: Mapping[int, Optional[int]]) -> None:
        action = self.cfg.watchdog_action
        msg = user_message(f, self.cfg.watchdog_tolerance_mib, action)
        outcome: Dict[str, Any] = {"detect_ts": frame.ts}
        self.acted[f.job_id] = time.time()
        if action == "stop":
            pids = sorted({pid for gl in frame.lists for pid, _ in (gl.compute or ()) + (gl.mps or ())
                           if job_of.get(pid) == f.job_id})
            outcome["killed"], outcome["not_killed"] = self.kill(f.job_id, pids)
            outcome["kill_ts"] = time.time()
        log.warning("%s", msg)
        ev = store_oom.WatchdogEvent(ts=frame.ts, job_id=f.job_id, node=self.node, gpu_index=f.gpu_index,
                                    reason=f.reason, share=f.share, grant_mib=f.grant_mib,
                                    used_mib=f.used_mib,
                                    tolerance_mib=float(self.cfg.watchdog_tolerance_mib), pids=f.pids,
                                    action=action,
                                    message=msg, outcome=outcome)
        try:
            ev = dataclasses.replace(ev, id=store_oom.record_event(self._open(), ev))
        except Exception as exc:  # a locked database must not undo the stop
            self._once(f"record:{exc}", "cannot record a watchdog event in %s: %s", self.db_path, exc)
        self.events.append(ev)
        if action == "stop":
            th = threading.Thread(target=self._finish, args=(ev, self.tenants.get(f.job_id)), daemon=True,
                                  name=f"watchdog-{f.job_id}")
            th.start()
            self.threads.append(th)

    def kill(self, job_id: int, pids: Sequence[int]) -> Tuple[List[int], Dict[int, str]]:
        """SIGKILL each pid still ``job_id``'s (same /proc start time) that is not the MPS server.

        Returns (pids signalled, {pid: why not}); never raises: a failed kill is a reason.
        """
        done: List[int] = []
        skipped: Dict[int, str] = {}
        for pid in pids:
            if self.attr.job_of(pid) != job_id:
                skipped[pid] = "no longer a process of the job"
            elif is_mps_server(pid, self.control_bin, self.proc_root):
                skipped[pid] = "the MPS server"
            else:
                try:
                    os.kill(pid, signal.SIGKILL)
                    done.append(pid)
                except OSError as exc:
                    skipped[pid] = os.strerror(exc.errno or 0)
        return done, skipped

    def _finish(self, ev: store_oom.WatchdogEvent, tenant: Optional[Tenant]) -> None:
        """Background: the stderr line (as the job's user) and scancel, then the outcome row (own
        connection)."""
        from slurm_coloc.slurm import cancel
        from slurm_coloc.userfiles import append_line_as_user
        outcome = dict(ev.outcome)
        env = {"PATH": "/usr/bin:/bin", **({"SLURM_CONF": os.environ["SLURM_CONF"]}
                                           if os.environ.get("SLURM_CONF") else {})}
        try:
            target = cancel.stderr_target(ev.job_id, self.cfg.slurm_bin_dir, env, timeout_s=10.0)
            outcome["stderr"] = (append_line_as_user(target.path, target.uid, target.gid, ev.message)
                                 or "written")
        except Exception as exc:
            outcome["stderr"] = f"not written: {exc}"
        try:
            cancel.scancel(ev.job_id, self.cfg.slurm_bin_dir, env, timeout_s=15.0)
            outcome["scancel"] = "ok"
        except Exception as exc:
            outcome["scancel"] = f"failed: {exc}"
        outcome["done_ts"] = time.time()
        if ev.id is not None:
            try:
                store_oom.set_outcome(open_node_db(self.db_path, self.cfg.db_busy_timeout_s), ev.id, outcome)
            except Exception as exc:
                log.warning("cannot record the watchdog outcome of job %s: %s", ev.job_id, exc)
        log.warning("watchdog: job %s: %s", ev.job_id, outcome)

    def join(self, timeout_s: float = 20.0) -> None:
        """Wait up to ``timeout_s`` in all for background stops to finish (tests, sampler exit)."""
        end = time.monotonic() + timeout_s
        for th in self.threads:
            th.join(max(0.0, end - time.monotonic()))
