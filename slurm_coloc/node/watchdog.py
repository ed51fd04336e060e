"""The GPU watchdog, in the node sampler's tick: stops a shard job that takes more than its grant.

Every frame (``Frame.lists``: NVML's compute and MPS process lists with per-process memory, pids attributed by
node/attribution.py) is checked for every tenant (a shard job with a ``<run_dir>/jobs/<id>.env`` file and an
open ``job_runs`` row naming its GPU):

- **over-grant**: the job's summed NVML memory on a GPU exceeds its grant there plus
  ``watchdog_tolerance_mib``. The grant is its recorded shards (``job_runs.shards``, from slurmctld's GRES) x
  1024 MiB, what its MPS fence is made of; 0 on a GPU it holds no shard of. NVML's per-process figure counts
  the CUDA context, as the fence does.
- **outside-mps**: a ``COLOC_SHARE=mps`` job has a process in the GPU's compute list that is not in its MPS
  list (a context beside the MPS server; measured on the H100: listed by
  ``nvmlDeviceGetComputeRunningProcesses``, not by ``nvmlDeviceGetMPSComputeRunningProcesses``). Not checked
  when the MPS list could not be read.

A finding must hold in two consecutive frames (a process exiting between NVML's two list calls is in one list
only for one frame); one made only of the real MPS server's processes is exempt. Then, with
``watchdog_action: stop``, every process of the job seen on any GPU gets SIGKILL (each pid re-checked by /proc
start time, never the MPS server binary), the event is written (``watchdog_events``), and a background thread
writes one line to the job's stderr (as its user) and runs ``scancel``; ``record`` only writes the event. Once
per job.

Pacing: ``watchdog_interval_s`` (0.5 s) while a tenant runs, ``watchdog_fast_interval_s`` (0.1 s) while one
is above ``watchdog_near_pct`` of its grant or a finding awaits confirmation: a job is stopped at most
interval + fast interval + the kill after its memory appears in NVML (18 ms after a 20 GiB MPS allocation on
the H100). ``verdict`` decides (pure: ``WatchdogEvidence`` -> ``WatchdogVerdict``); ``Watchdog`` gathers the
evidence (NVML lists, env files and ``job_runs``, /proc) and carries the verdict out.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import AbstractSet, Any, Dict, FrozenSet, List, Mapping, Optional, Sequence, Set, Tuple

from sqlite_utils import Database

from slurm_coloc.config import Config
from slurm_coloc.node import lifecycle
from slurm_coloc.node.attribution import JobAttributor
from slurm_coloc.nvml.readings import Frame, ProcLists
from slurm_coloc.store import oom as store_oom
from slurm_coloc.store.db import open_node_db
from slurm_coloc.units import shards_to_mib

log = logging.getLogger("slurm_coloc.watchdog")

MPS_SERVER_BIN = "nvidia-cuda-mps-server"
REFRESH_S = 5.0
FindingKey = Tuple[int, int, str]  # (job id, GPU index, reason)


@dataclass(frozen=True)
class Tenant:
    """A shard job on this node: its GPU (NVML index), its grant (MiB), ``mps``/``timeslice``."""

    job_id: int
    gpu_index: int
    grant_mib: float
    share: str
    uid: Optional[int] = None


@dataclass(frozen=True)
class Finding:
    """A tenant ``over-grant`` or ``outside-mps`` on GPU ``gpu_index`` in one frame. ``used_mib``: the job's
    summed NVML memory there; ``pids``: its processes there (outside-mps: those outside MPS)."""

    job_id: int
    gpu_index: int
    reason: str
    share: str
    grant_mib: float
    used_mib: float
    pids: Tuple[int, ...]

    @property
    def key(self) -> FindingKey:
        return (self.job_id, self.gpu_index, self.reason)


def find_violations(lists: Sequence[ProcLists], job_of: Mapping[int, Optional[int]],
                    tenants: Mapping[int, Tenant], tolerance_mib: float) -> List[Finding]:
    """Tenants over grant + ``tolerance_mib`` on a GPU, and MPS tenants with a process outside MPS;
    ``job_of`` gives None for a pid of no Slurm job (e.g. the MPS server)."""
    out: List[Finding] = []
    for gl in lists:
        if gl.compute is None and gl.mps is None:
            continue
        mem: Dict[int, float] = {}
        pids: Dict[int, List[int]] = {}
        for pid, mib in _per_pid(gl).items():
            job = job_of.get(pid)
            if job is None or job not in tenants:
                continue
            mem[job] = mem.get(job, 0.0) + (mib or 0.0)
            pids.setdefault(job, []).append(pid)
        mps_pids = None if gl.mps is None else {pid for pid, _ in gl.mps}
        for job, used in sorted(mem.items()):
            t = tenants[job]
            grant = t.grant_mib if t.gpu_index == gl.gpu_index else 0.0
            if used > grant + tolerance_mib:
                out.append(Finding(job, gl.gpu_index, "over-grant", t.share, grant, round(used, 1),
                                   tuple(sorted(pids[job]))))
            if t.share == "mps" and t.gpu_index == gl.gpu_index and mps_pids is not None \
                    and gl.compute is not None:
                outside = tuple(sorted(pid for pid, _ in gl.compute if job_of.get(pid) == job
                                       and pid not in mps_pids))
                if outside:
                    out.append(Finding(job, gl.gpu_index, "outside-mps", t.share, grant, round(used, 1),
                                       outside))
    return out


def _per_pid(gl: ProcLists) -> Dict[int, Optional[float]]:
    """pid -> MiB: the compute list's figure, else the MPS list's (as nvml/reader.py)."""
    out: Dict[int, Optional[float]] = {pid: mib for pid, mib in gl.compute or ()}
    for pid, mib in gl.mps or ():
        if out.get(pid) is None:
            out[pid] = mib
    return out


def near_grant(lists: Sequence[ProcLists], job_of: Mapping[int, Optional[int]], tenants: Mapping[int, Tenant],
               near_pct: float) -> bool:
    """Whether a tenant's memory on its GPU is above ``near_pct`` % of its grant."""
    for gl in lists:
        used: Dict[int, float] = {}
        for pid, mib in _per_pid(gl).items():
            job = job_of.get(pid)
            if job is not None and job in tenants and tenants[job].gpu_index == gl.gpu_index:
                used[job] = used.get(job, 0.0) + (mib or 0.0)
        if any(u > tenants[j].grant_mib * near_pct / 100.0 for j, u in used.items()):
            return True
    return False


def user_message(f: Finding, tolerance_mib: float, action: str) -> str:
    did = "stopped" if action == "stop" else "recorded"
    if f.reason == "outside-mps":
        what = (f"process(es) {', '.join(map(str, f.pids))} ran on shared GPU {f.gpu_index} outside the "
                "job's MPS server (CUDA_MPS_PIPE_DIRECTORY changed or unset)")
    else:
        what = (f"its processes used {f.used_mib:,.0f} MiB of shared GPU {f.gpu_index}, over its grant of "
                f"{f.grant_mib:,.0f} MiB (+{tolerance_mib:,.0f} MiB tolerance)")
    return (f"slurm-coloc: job {f.job_id} {did} by the GPU watchdog: {what}; a job on a shared GPU must stay "
            "within its memory request (#COLOC mem / --gres=shard). It is not rerun.")


@dataclass(frozen=True)
class WatchdogEvidence:
    """One frame as the watchdog sees it: ``job_of`` covers every pid of ``lists`` (None: no Slurm job);
    ``pending``: the previous frame's unconfirmed findings; periods in s, memory in MiB."""

    lists: Sequence[ProcLists]
    job_of: Mapping[int, Optional[int]]
    tenants: Mapping[int, Tenant]
    acted: AbstractSet[int]
    pending: AbstractSet[FindingKey]
    mps_server_pids: AbstractSet[int]
    action: str
    tolerance_mib: float
    near_pct: float
    interval_s: float
    watchdog_interval_s: float
    fast_interval_s: float


@dataclass(frozen=True)
class WatchdogAct:
    """A confirmed finding, its stderr line and, under ``stop``, the job's pids on any GPU (to SIGKILL)."""

    finding: Finding
    message: str
    kill_pids: Tuple[int, ...]


@dataclass(frozen=True)
class WatchdogVerdict:
    acts: Tuple[WatchdogAct, ...]
    pending: FrozenSet[FindingKey]
    next_interval_s: float


def verdict(ev: WatchdogEvidence) -> WatchdogVerdict:
    """What to do about one frame (module rules): at most one act per job, the findings left to confirm and
    the next period (module pacing; ``interval_s`` itself without tenants)."""
    if not ev.tenants:
        return WatchdogVerdict((), frozenset(), ev.interval_s)
    live = {j: t for j, t in ev.tenants.items() if j not in ev.acted}
    found = [f for f in find_violations(ev.lists, ev.job_of, live, ev.tolerance_mib)
             if not all(pid in ev.mps_server_pids for pid in f.pids)]
    acts: Dict[int, WatchdogAct] = {}
    for f in found:
        if f.key in ev.pending and f.job_id not in acts:
            pids = tuple(sorted({pid for gl in ev.lists for pid, _ in (gl.compute or ()) + (gl.mps or ())
                                 if ev.job_of.get(pid) == f.job_id})) if ev.action == "stop" else ()
            acts[f.job_id] = WatchdogAct(f, user_message(f, ev.tolerance_mib, ev.action), pids)
    pending = frozenset(f.key for f in found if f.key not in ev.pending)
    period = min(ev.interval_s, ev.watchdog_interval_s)
    if pending or near_grant(ev.lists, ev.job_of, live, ev.near_pct):
        period = min(period, ev.fast_interval_s)
    return WatchdogVerdict(tuple(acts.values()), pending, period)


def is_mps_server(pid: int, control_bin: Optional[str], proc_root: str = "/proc") -> bool:
    """Whether ``pid`` runs the real ``nvidia-cuda-mps-server`` (the file beside ``control_bin``); False if
    unknown. Compared by the path of ``/proc/<pid>/exe``: a user process renamed like the server is not."""
    if not control_bin:
        return False
    try:
        exe = os.readlink(f"{proc_root}/{pid}/exe")
    except OSError:
        return False
    return exe == str(Path(os.path.realpath(control_bin)).parent / MPS_SERVER_BIN)


class Watchdog:
    """Per-node watchdog state, fed one frame per sampler tick. ``attributor``: the sampler's pid -> job
    mapping, reused to re-check a pid before signalling it."""

    def __init__(self, cfg: Config, node: str, db_path: Path, attributor: JobAttributor,
                 proc_root: str = "/proc") -> None:
        self.cfg, self.node, self.db_path = cfg, node, Path(db_path)
        self.attr, self.proc_root = attributor, proc_root
        self._db: Optional[Database] = None
        self.tenants: Dict[int, Tenant] = {}
        self._env_names: Optional[FrozenSet[int]] = None
        self._refreshed = 0.0
        self._pending: FrozenSet[FindingKey] = frozenset()
        self.acted: Dict[int, float] = {}
        self.events: List[store_oom.WatchdogEvent] = []
        self.threads: List[threading.Thread] = []
        self._logged: Set[str] = set()
        from slurm_coloc.node.mps_daemon import resolve_binary
        self.control_bin = resolve_binary(cfg)

    def _once(self, kind: str, msg: str, *args: object) -> None:
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning(msg, *args)

    def _open(self) -> Database:
        if self._db is None:
            self._db = open_node_db(self.db_path, self.cfg.db_busy_timeout_s)
        return self._db

    def refresh_tenants(self, force: bool = False) -> Dict[int, Tenant]:
        """job id -> ``Tenant``: an env file (its share) and an open ``job_runs`` row (one GPU, shards x 1024
        MiB, uid), reloaded when the env files change or every ``REFRESH_S``. Raises StoreError, sqlite3.Error
        (``tick`` catches them)."""
        names = lifecycle.env_job_ids(self.cfg)
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
            share = dict(lifecycle.read_env(self.cfg, job)).get("COLOC_SHARE")
            tenants[job] = Tenant(job, run.gpus[0], float(shards_to_mib(run.shards)),
                                  "mps" if share == "mps" else "timeslice", run.uid)
        self.tenants = tenants
        self.acted = {j: t for j, t in self.acted.items() if j in tenants}
        return tenants

    def tick(self, frame: Frame, job_of: Mapping[int, Optional[int]], interval_s: float) -> float:
        """Check one frame, act on its verdict and return the next period (s); never raises (an error is
        logged once, ``interval_s`` returned)."""
        if self.cfg.watchdog_action == "off":
            return interval_s
        try:
            v = verdict(self.evidence(frame, job_of, interval_s))
            self._pending = v.pending
            for act in v.acts:
                self._act(act, frame.ts)
            return v.next_interval_s
        except Exception as exc:  # the watchdog must never stop the sampler
            self._once(f"tick:{type(exc).__name__}", "watchdog tick failed (%s: %s); sampling goes on",
                       type(exc).__name__, exc)
            return interval_s

    def evidence(self, frame: Frame, job_of: Mapping[int, Optional[int]],
                 interval_s: float) -> WatchdogEvidence:
        """The frame with its tenants, pids the sampler left unattributed, MPS servers among tenants' pids."""
        tenants = self.refresh_tenants()
        servers: Set[int] = set()
        if tenants:
            unknown = [pid for gl in frame.lists for pid, _ in (gl.compute or ()) if pid not in job_of]
            if unknown:
                job_of = {**job_of, **{pid: self.attr.job_of(pid) for pid in unknown}}
            servers = {pid for gl in frame.lists for pid, _ in (gl.compute or ()) + (gl.mps or ())
                       if job_of.get(pid) in tenants and is_mps_server(pid, self.control_bin, self.proc_root)}
        c = self.cfg
        return WatchdogEvidence(frame.lists, job_of, tenants, frozenset(self.acted), self._pending,
                                frozenset(servers), c.watchdog_action, c.watchdog_tolerance_mib,
                                c.watchdog_near_pct, interval_s, c.watchdog_interval_s,
                                c.watchdog_fast_interval_s)

    def _act(self, act: WatchdogAct, detect_ts: float) -> None:
        f, action = act.finding, self.cfg.watchdog_action
        outcome: Dict[str, Any] = {"detect_ts": detect_ts}
        self.acted[f.job_id] = time.time()
        if action == "stop":
            outcome["killed"], outcome["not_killed"] = self.kill(f.job_id, act.kill_pids)
            outcome["kill_ts"] = time.time()
        log.warning("%s", act.message)
        ev = store_oom.WatchdogEvent(ts=detect_ts, job_id=f.job_id, node=self.node, gpu_index=f.gpu_index,
                                    reason=f.reason, share=f.share, grant_mib=f.grant_mib,
                                    used_mib=f.used_mib, tolerance_mib=float(self.cfg.watchdog_tolerance_mib),
                                    pids=f.pids, action=action, message=act.message, outcome=outcome)
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
        """SIGKILL each pid still ``job_id``'s (same /proc start time) that is not the MPS server; (pids
        signalled, {pid: why not}). Never raises: a failed kill is a reason."""
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
        """Background: the stderr line (as the job's user), scancel, the outcome row (own connection)."""
        from slurm_coloc.slurm import jobs
        from slurm_coloc.userfiles import append_line_as_user
        outcome = dict(ev.outcome)
        env = {"PATH": "/usr/bin:/bin", **({"SLURM_CONF": os.environ["SLURM_CONF"]}
                                           if os.environ.get("SLURM_CONF") else {})}
        try:
            target = jobs.stderr_target(ev.job_id, self.cfg.slurm_bin_dir, env, timeout_s=10.0)
            outcome["stderr"] = (append_line_as_user(target.path, target.uid, target.gid, ev.message)
                                 or "written")
        except Exception as exc:
            outcome["stderr"] = f"not written: {exc}"
        try:
            jobs.scancel(ev.job_id, self.cfg.slurm_bin_dir, env, timeout_s=15.0)
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
