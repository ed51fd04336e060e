"""coloc-placer's loop: each round reads Slurm's queue and the node samplers' live state, then steers every
held shard job to a GPU (or notes why it waits). Bounded, never fatal: a failed round is logged and the next
starts after ``placement_interval_s``; a job held over ``placement_max_wait_s`` is released by memory alone.
Live state comes from the node databases (``<state_dir>/nodes/<node>.db``, read-only, as coloc-report reads
them); who holds which GPU from ``squeue --json`` ``gres_detail``."""
from __future__ import annotations

import logging
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from slurm_coloc import coruns as learn
from slurm_coloc.config import Config
from slurm_coloc.placement import intensity, rounds, share
from slurm_coloc.placement.gate import fresh
from slurm_coloc.placement.heartbeat import placer_alive, write_heartbeat
from slurm_coloc.placement.history import (  # noqa: F401
    ModelRuns,
    Timing,
    log_once,
    profile,
    read_history,
    read_history_file,
)
from slurm_coloc.placement.policies import Activity, Gate, GpuState, Profile, Tenant
from slurm_coloc.placement.rounds import PlacerState, Steered  # re-exported
from slurm_coloc.slurm import placement as sp
from slurm_coloc.slurm.jobinfo import JobInfo
from slurm_coloc.store import placement as store_placement
from slurm_coloc.store.db import open_readonly

log = logging.getLogger("slurm_coloc.placer")
ACTIVE_STATES = ("RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED")
HISTORY_REFRESH_S = 30.0


def live_activity(row: store_placement.LiveGpu) -> Optional[Activity]:
    """The row's activity (fractions; missing SMOCC or DRAMA counts as 0), None without GPM metrics."""
    return None if row.smact is None else Activity(row.smact, row.smocc or 0.0, row.drama or 0.0)


def gpu_states(nodes: Sequence[sp.NodeGpus], jobs: Sequence[JobInfo],
               live: Mapping[str, Sequence[store_placement.LiveGpu]], steered: Mapping[int, Steered],
               now: float, window_s: float) -> List[GpuState]:
    """Every typed GPU (nodes in order, indices ascending) with its shards in use, tenants, live state and
    recently placed load. Pure.

    Shards in use: running jobs' ``gres_detail`` plus steered jobs Slurm does not yet show on a GPU; a whole
    ``gpu`` holding uses every shard. ``recent``: demand of steered jobs placed after ``now - window_s`` (Unix
    s, s; the caller passes ``placement_recent_s``, or ``placement_window_s`` when that is 0).
    """
    used: Dict[Tuple[str, int], int] = {}
    tenants: Dict[Tuple[str, int], int] = {}
    shown = set()
    totals = {(n.node, i): s for n in nodes for i, s in n.shards.items()}
    for job in jobs:
        if job.state not in ACTIVE_STATES and not job.completing:  # 24.11+: COMPLETED + the COMPLETING flag
            continue
        for node, idx, name, count in sp.gpu_holdings(job):
            key = (node, idx)
            used[key] = used.get(key, 0) + (totals.get(key, count) if name == "gpu" else count)
            tenants[key] = tenants.get(key, 0) + 1
            shown.add(job.job_id)
    recent: Dict[Tuple[str, int], Activity] = {}
    for job_id, s in steered.items():
        key = (s.node, s.index)
        if job_id not in shown:
            used[key] = used.get(key, 0) + s.shards
            tenants[key] = tenants.get(key, 0) + 1
        if s.ts >= now - window_s:
            recent[key] = recent.get(key, Activity()) + s.demand
    out = []
    for n in nodes:
        rows = {r.gpu_index: r for r in live.get(n.node, ())}
        for idx, total in sorted(n.shards.items()):
            r = rows.get(idx)
            key = (n.node, idx)
            out.append(GpuState(n.node, idx, total, used.get(key, 0), tenants.get(key, 0),
                                live_activity(r) if r else None, (now - r.last_ts) if r else None,
                                recent.get(key, Activity()), r.name if r else ""))
    return out


def read_live(cfg: Config, nodes: Sequence[str]) -> Dict[str, List[store_placement.LiveGpu]]:
    """Node -> its GPUs' live rows within ``placement_window_s`` (s); none for an unreadable database
    (logged)."""
    out: Dict[str, List[store_placement.LiveGpu]] = {}
    for node in nodes:
        path = cfg.node_db_path(node)
        if not path.exists():
            continue
        try:
            db = open_readonly(path, busy_timeout_s=1.0)
            try:
                out[node] = store_placement.live_gpus(db, cfg.placement_window_s)
            finally:
                db.conn.close()
        except Exception as exc:  # a bad node database means memory-only there, never a stop
            log.warning("live state of %s unreadable (%s): memory-only there", node, exc)
    return out


def gpu_tenants(gpus: Sequence[GpuState], jobs: Sequence[JobInfo], steered: Mapping[int, Steered],
                known: Callable[[JobInfo, str], Tuple[Profile, float]],
                now: float) -> List[List[Tenant]]:
    """Per GPU of ``gpus`` (same order), the jobs holding it as ``Tenant`` (``gpu_states``' accounting),
    less ``COMPLETING`` jobs (epilogs run, they compute no more, so their room is free for the model in the
    same round). ``known(job, gpu_model)``: its profile and predicted SM activity alone (fraction); steered
    jobs keep what the placer knew when it sent them; ``now`` (Unix s) starts a tenant of unknown start.
    Raises only what ``known`` raises.
    """
    where = {g.key: i for i, g in enumerate(gpus)}
    out: List[List[Tenant]] = [[] for _ in gpus]
    shown = set()
    for job in jobs:
        if job.state not in ACTIVE_STATES and not job.completing:
            continue
        for node, idx, _name, _count in sp.gpu_holdings(job):
            shown.add(job.job_id)
            if (node, idx) in where and not job.completing:
                s = steered.get(job.job_id)
                prof, pred = ((s.profile, s.demand.smact) if s is not None
                              else known(job, gpus[where[(node, idx)]].model))
                out[where[(node, idx)]].append(Tenant(prof, job.start_ts or (s.ts if s else now), pred,
                                                      job.job_id, uid=job.uid))
    for job_id, s in steered.items():
        if job_id not in shown and (s.node, s.index) in where:
            out[where[(s.node, s.index)]].append(Tenant(s.profile, s.ts, s.demand.smact, job_id,
                                                        uid=s.uid))
    return out


def release_if_stale(cfg: Config, env: Optional[Mapping[str, str]] = None,
                     max_age_s: Optional[float] = None) -> Optional[List[int]]:
    """The fallback that needs no placer: when none finished a round within ``max_age_s`` (s;
    ``placer_alive``), release every held placer job by memory only (``Gres=shard:N``); reads only the
    heartbeat while one is alive. None when alive, else the job ids released. ColocError: Slurm could not be
    asked (nothing released)."""
    if placer_alive(cfg, max_age_s):
        return None
    released = []
    for job in sp.queue(cfg.slurm_bin_dir, env):
        shards = sp.placer_shards(job)
        if shards is None:
            continue
        try:
            sp.release_memory_only(job.job_id, shards, job.comment, cfg.slurm_bin_dir, env)
            released.append(job.job_id)
            log.info("job %d released memory-only: no placer heartbeat", job.job_id)
        except Exception as exc:  # one job's failure never stops the others' release
            log.warning("job %d: memory-only release failed (%s)", job.job_id, exc)
    return released


def place_round(cfg: Config, state: PlacerState, env: Optional[Mapping[str, str]] = None,
                now: Optional[float] = None, cal: Optional[intensity.Calibration] = None) -> Dict[str, int]:
    """One round: steer every held candidate (oldest first; with ``sharing_model``,
    ``share.order_candidates``); returns counts (``placed``, ``waiting``, ``memory_only``, ``errors``, ...).
    One job's error is one warning and one ``errors`` count; a job whose comment breaks the protocol is no
    candidate. ``now``: Unix s (None: now); ``cal`` None: ``placement_calibration_path`` or the packaged one.
    ColocError: Slurm could not be asked (the caller retries next round)."""
    now = time.time() if now is None else now
    cal = cal or intensity.load_calibration(cfg.placement_calibration_path or None)
    jobs = sp.queue(cfg.slurm_bin_dir, env)
    _forget(state, jobs, now)
    shards_of = _candidate_shards(jobs)
    candidates = sorted((j for j in jobs if j.job_id in shards_of),
                        key=lambda j: (j.submit_ts if isinstance(j.submit_ts, (int, float)) else 0.0,
                                       j.job_id))
    counts = {"candidates": len(candidates), "placed": 0, "waiting": 0, "memory_only": 0, "errors": 0,
              "admin_held": 0}
    if not candidates:
        return counts
    counts["admin_held"] = _admin_hold(candidates, cfg.slurm_bin_dir, env)
    nodes = sp.typed_nodes(cfg.slurm_bin_dir, env)
    _refresh_history(cfg, state, now, cal)
    gpus = gpu_states(nodes, jobs, read_live(cfg, [n.node for n in nodes]), state.steered, now,
                      cfg.placement_recent_s or cfg.placement_window_s)
    rnd = rounds.Round(cfg, state, cal, Gate(cfg.placement_smact_gate, cfg.placement_smocc_gate,
                                             cfg.placement_drama_gate), gpus, [], bool(nodes), now, env)
    rnd.log_gpus()
    if rnd.policy.sharing_model:
        present = gpu_tenants(gpus, jobs, state.steered, rnd.tenant_data, now)
        current = {g.key: ts for g, ts in zip(gpus, present)}
        state.departed = share.track_departures(state.present, current, state.departed, now)
        state.present = current
        rnd.tenants = [ts + state.departed.get(g.key, []) for g, ts in zip(gpus, present)]
        window_s = cfg.placement_window_s  # a GPU's live reading began this long before its last sample
        rnd.tenants = [rounds.live_corrected(ts, g.live.smact, now - (g.live_age_s or 0.0) - window_s,
                                             learn.UNSATURATED)
                       if g.live is not None and fresh(g, cfg.placement_state_max_age_s) else ts
                       for g, ts in zip(gpus, rnd.tenants)]
        candidates = rnd.ordered(candidates)
    for job in candidates:
        rnd.handle(job, shards_of[job.job_id], counts)
    return counts


def _forget(state: PlacerState, jobs: Sequence[JobInfo], now: float) -> None:
    """Drop steered jobs Slurm no longer shows pending or active (or steered over 600 s ago) and gone jobs'
    notes."""
    known = {j.job_id: j for j in jobs}
    for job_id in [k for k, s in state.steered.items()
                   if k not in known
                   or (known[k].state not in ("PENDING", *ACTIVE_STATES) and not known[k].completing)
                   or now - s.ts > 600]:
        state.steered.pop(job_id, None)
    state.notes = {k: v for k, v in state.notes.items() if k in known}


def _candidate_shards(jobs: Sequence[JobInfo]) -> Dict[int, int]:
    """Job id -> shard request of every held placer candidate (one breaking the protocol: none, warned)."""
    out: Dict[int, int] = {}
    for j in jobs:
        try:
            n = sp.placer_shards(j)
        except Exception as exc:  # one job never stops a round
            log.warning("job %s: not a candidate (%s)", j.job_id, exc)
            n = None
        if n is not None:
            out[j.job_id] = n
    return out


def _admin_hold(candidates: Sequence[JobInfo], bin_dir: str, env: Optional[Mapping[str, str]]) -> int:
    """Hold as admin every candidate its user holds (the user may not release it unplaced); how many."""
    held = 0
    for job in candidates:
        if job.raw.get("state_reason") == "JobHeldUser":
            try:
                sp.admin_hold(job.job_id, bin_dir, env)
                held += 1
            except Exception as exc:  # one job never stops a round
                log.warning("job %d: admin hold failed (%s)", job.job_id, exc)
    return held


def _refresh_history(cfg: Config, state: PlacerState, now: float, cal: intensity.Calibration) -> None:
    """Re-read history when the last read is older than ``HISTORY_REFRESH_S``; never raises."""
    if now - state.history_ts <= HISTORY_REFRESH_S:
        return
    timing: Dict[intensity.HistoryKey, List[Timing]] = {}
    by_model = ModelRuns()
    try:
        state.history = read_history(cfg, timing, now, state.logged, by_model, cal)
        state.timing = timing
        state.by_model = by_model
    except Exception as exc:  # unreadable history means predictions only, never a stopped round
        log_once(state.logged, f"history:{exc}", "history unreadable (%s): predictions only", exc)
    state.history_ts = now
    if not state.history:
        log_once(state.logged, "no-history", "no history yet (no finished runs, no history file): jobs go by "
                 "their predicted activity under the bound")


def run_loop(cfg: Config, rounds: Optional[int] = None, env: Optional[Mapping[str, str]] = None,
             sleep: Callable[[float], None] = time.sleep) -> None:
    """Rounds every ``placement_interval_s`` (``rounds`` times; None: forever); round errors are logged.
    ConfigError: a bad calibration file."""
    cal = intensity.load_calibration(cfg.placement_calibration_path or None)
    state = PlacerState()
    done = 0
    while rounds is None or done < rounds:
        t0 = time.monotonic()
        try:
            counts = place_round(cfg, state, env, cal=cal)
            write_heartbeat(cfg, {**counts, "policy": cfg.placement_policy})
            if counts["candidates"]:
                log.info("round: %s", counts)
        except Exception as exc:  # the loop must outlive any one round
            log.error("round failed: %s", exc)
        done += 1
        if rounds is None or done < rounds:
            sleep(max(0.0, cfg.placement_interval_s - (time.monotonic() - t0)))
