"""One coloc-placer round, job by job: ``PlacerState`` (kept between rounds) and ``Round``, which orders the
held jobs, has the configured policy (``policies.POLICIES``) decide a GPU for each and steers it, notes its
wait, or releases it by memory once ``placement_max_wait_s`` has passed; ``live_corrected`` corrects never
measured tenants' predictions from their GPU's live reading. The loop around it is ``daemon.py``.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Dict, List, Mapping, Optional, Sequence, Set, Tuple

from slurm_coloc.comment import JobComment
from slurm_coloc.config import Config
from slurm_coloc.placement import intensity, policies, share
from slurm_coloc.placement.gate import saturated_gpus, silent_gpus
from slurm_coloc.placement.history import ModelRuns, Timing, log_once, profile
from slurm_coloc.placement.policies import (
    Activity,
    Decision,
    Evidence,
    Gate,
    GpuState,
    Limits,
    Policy,
    Profile,
    Tenant,
)
from slurm_coloc.slurm import placement as sp
from slurm_coloc.slurm.jobinfo import JobInfo

log = logging.getLogger("slurm_coloc.placer")


SETTLE_S = 30.0
"""A tenant counts as computing this long after it started (s): from Slurm start to the first training step
took 11-26 s on the 2x H200 fresh pile (Python start, set-up, warm-up; ``h200x2-placement-learn``), so a live
reading taken later shows its work, not its start-up."""


def live_corrected(tenants: Sequence[Tenant], live_smact: float, since_ts: float,
                   unsaturated: float) -> List[Tenant]:
    """``tenants`` (in order) with the prediction of those never measured and settled (present, started
    ``SETTLE_S`` before the live window began at ``since_ts``, Unix s) replaced by their share of what the
    GPU's live SM activity leaves: ``r = live_smact`` less the activity of measured tenants computing now,
    spread in proportion to their predictions.

    Tenants still starting are not subtracted, so ``r`` can only overstate the settled ones (the correction
    errs on the side of caution). No change when the reading is saturated (``>= unsaturated``,
    ``learn.UNSATURATED``: activities no longer add) or nobody settled. The first shared minutes correct a
    cold prediction both ways (Gandiva and Lucid learn from what runs;
    ``../shared/reference/placement-anchors.md``). Pure.
    """
    present = [t for t in tenants if t.end_ts is None]
    settled = [t for t in present if t.profile.smact is None and since_ts - t.start_ts >= SETTLE_S]
    if not settled or live_smact >= unsaturated:
        return list(tenants)
    measured = sum(t.profile.smact or 0.0 for t in present if t.profile.smact is not None
                   and since_ts - t.start_ts >= (t.profile.startup_s or SETTLE_S))
    residual = max(0.02 * len(settled), live_smact - measured)
    total = sum(t.predicted for t in settled) or 1.0
    fix = {id(t): replace(t, predicted=t.predicted * residual / total) for t in settled}
    return [fix.get(id(t), t) for t in tenants]


@dataclass
class Steered:
    """A job this placer sent to a GPU, remembered until Slurm shows it holding the GPU (or it is gone)."""

    node: str
    index: int
    shards: int
    demand: Activity
    ts: float
    profile: Profile = field(default_factory=lambda: Profile(None))
    uid: Optional[int] = None


@dataclass
class PlacerState:
    """What the placer keeps between rounds: steered jobs, each GPU's tenants last round (``present``) and
    those that left it while others ran (``departed``, ``share.track_departures``), history (activity and
    timing alone by ``(uid, signature)``, and per GPU model: ``placement/history.py``), wait notes shown to
    users, and the bad-input lines already logged (each is logged once)."""

    steered: Dict[int, Steered] = field(default_factory=dict)
    present: Dict[Tuple[str, int], List[Tenant]] = field(default_factory=dict)
    departed: Dict[Tuple[str, int], List[Tenant]] = field(default_factory=dict)
    history: Dict[intensity.HistoryKey, List[Activity]] = field(default_factory=dict)
    timing: Dict[intensity.HistoryKey, List[Timing]] = field(default_factory=dict)
    by_model: ModelRuns = field(default_factory=ModelRuns)
    history_ts: float = 0.0
    notes: Dict[int, str] = field(default_factory=dict)
    logged: Set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Choice:
    """``Round.decide``'s answer: the policy's ``decision``, the job's predicted ``demand`` (fractions), its
    ``source`` in words, and its ``profile`` (on the chosen GPU's model when placed by the sharing model)."""

    decision: Decision
    demand: Activity
    source: str
    profile: Profile


@dataclass
class Round:
    """One round's view: the GPUs (updated as jobs are steered), their tenants for the sharing model (a
    policy with ``sharing_model`` only, index for index with ``gpus``), and whether any typed GPU exists."""

    cfg: Config
    state: PlacerState
    cal: intensity.Calibration
    gate: Gate
    gpus: List[GpuState]
    tenants: List[List[Tenant]]
    has_gpus: bool
    now: float
    env: Optional[Mapping[str, str]] = None

    @property
    def policy(self) -> Policy:
        """The policy named by ``placement_policy`` (``policies.get``; ConfigError when not registered)."""
        return policies.get(self.cfg.placement_policy)

    def limits(self) -> Limits:
        """The settings the policies apply, from the config and the calibration."""
        cfg = self.cfg
        return Limits(self.gate, cfg.placement_mode, cfg.placement_state_max_age_s,
                      cfg.placement_max_slowdown, self.cal.capacity_for, self.cal.smact_floor)

    def log_gpus(self) -> None:
        """Log saturated GPUs (every round) and silent samplers (once per set of GPUs)."""
        max_age = self.cfg.placement_state_max_age_s
        sat = saturated_gpus(self.gpus, self.gate, max_age)
        if sat:
            log.info("saturated, no new tenants: %s", ", ".join(f"{n}/gpu{i}" for n, i in sat))
        silent = silent_gpus(self.gpus, max_age)
        if silent:
            log_once(self.state.logged, "silent:" + ",".join(f"{n}/{i}" for n, i in silent),
                     "sampler silent (no state within %g s) on %s: its jobs count with their history or "
                     "predicted activity, under the bound", max_age,
                     ", ".join(f"{n}/gpu{i}" for n, i in silent))

    def tenant_data(self, j: JobInfo, gpu_model: str = "") -> Tuple[Profile, float]:
        """A running job's profile on its GPU's model ("": any) and predicted SM activity alone (fraction;
        unknown on a bad comment, with a warning).
        """
        try:
            c = JobComment.read(j.comment, j.job_id)
            prof = profile(c, self.state.history, self.state.timing, j.uid, gpu_model, self.state.by_model)
            return prof, self.counted(intensity.demand(c, self.state.history, self.cal, j.uid)[0], prof).smact
        except Exception as exc:  # one running job's data never stops a round
            log.warning("job %d: no profile (%s): counted as unknown", j.job_id, exc)
            return Profile(None), self.cal.smact_floor

    def counted(self, demand: Activity, prof: Profile) -> Activity:
        """The activity the sharing model counts for a job: its demand as is when measured alone (``prof``),
        else the prediction raised to ``Calibration.smact_floor``."""
        if prof.smact is not None:
            return demand
        return replace(demand, smact=max(demand.smact, self.cal.smact_floor))

    def ordered(self, candidates: Sequence[JobInfo]) -> List[JobInfo]:
        """``candidates`` in ``share.order_candidates`` order; a job whose comment cannot be read counts as of
        unknown work.
        """
        rows = []
        for j in candidates:
            try:
                prof = (profile(JobComment.read(j.comment, j.job_id), self.state.history, self.state.timing,
                                j.uid))
            except Exception:  # its own decision reports the comment; here it is only unknown
                prof = Profile(None)
            rows.append((j.job_id, j.submit_ts if isinstance(j.submit_ts, (int, float)) else 0.0, prof))
        by_id = {j.job_id: j for j in candidates}
        return [by_id[i] for i in share.order_candidates(rows, self.now, self.cfg.placement_max_wait_s / 2)]

    def decide(self, job: JobInfo, shards: int) -> Choice:
        """ValueError: a bad shard request or placement mode (the policy's); ConfigError: ``placement_policy``
        names no registered policy (``handle`` catches both)."""
        coloc = JobComment.read(job.comment, job.job_id)
        demand, source = intensity.demand(coloc, self.state.history, self.cal, job.uid)
        profiles: Dict[str, Profile] = {}

        def on(model: str) -> Profile:  # the job's profile on a GPU of this model
            if model not in profiles:
                profiles[model] = profile(coloc, self.state.history, self.state.timing, job.uid, model,
                                          self.state.by_model)
            return profiles[model]

        prof = on("")
        policy = self.policy
        has_data = bool(coloc.signature()) or coloc.flops_per_step is not None
        d = policy.decide(Evidence(self.gpus, self.tenants, shards, demand, self.counted(demand, prof), on,
                                   has_data, job.uid, self.now, self.limits()))
        if not policy.sharing_model:
            return Choice(d, demand, source, prof)
        if not has_data:
            log_once(self.state.logged, f"nodata:{job.job_id}",
                     "job %d has no signature and no FLOPs: placed by memory", job.job_id)
            return Choice(d, demand, "no signature or FLOPs", prof)
        chosen = next((g for g in self.gpus if d.placed and (g.node, g.index) == (d.node, d.index)), None)
        return Choice(d, demand, source, on(chosen.model) if chosen is not None else prof)

    def handle(self, job: JobInfo, shards: int, counts: Dict[str, int]) -> None:
        """Decide for one held job and act: steer it, release it by memory (no typed GPU, or waited past
        ``placement_max_wait_s``), or note why it waits. Never raises: an error is one warning and one
        ``errors`` count in ``counts``.
        """
        cfg, bin_dir, env = self.cfg, self.cfg.slurm_bin_dir, self.env
        try:
            choice = self.decide(job, shards)
            decision, demand, prof = choice.decision, choice.demand, choice.profile
            waited = self.now - job.submit_ts if job.submit_ts else 0.0
            if decision.placed:
                assert decision.node is not None and decision.index is not None
                sp.steer(job.job_id, decision.node, decision.index, shards, job.comment, bin_dir, env)
                counted = self.counted(demand, prof) if self.policy.sharing_model else demand
                self.state.steered[job.job_id] = Steered(decision.node, decision.index, shards, counted,
                                                         self.now, prof, job.uid)
                self._add(decision, shards, demand, prof, job.job_id, job.uid)
                counts["placed"] += 1
                log.info("job %d (%d shards, %s SMACT %.2f) -> %s", job.job_id, shards, choice.source,
                         demand.smact, decision.reason)
            elif not self.has_gpus or waited > cfg.placement_max_wait_s:
                sp.release_memory_only(job.job_id, shards, job.comment, bin_dir, env)
                counts["memory_only"] += 1
                log.info("job %d released memory-only after %.0f s (%s)", job.job_id, waited,
                         "no typed GPUs" if not self.has_gpus else decision.reason)
            else:
                counts["waiting"] += 1
                if self.state.notes.get(job.job_id) != decision.reason:
                    # tried once per reason, even if Slurm refuses
                    self.state.notes[job.job_id] = decision.reason
                    log.info("job %d waits: %s", job.job_id, decision.reason)
                    sp.note_wait(job.job_id, decision.reason, job.comment, bin_dir, env)
        except Exception as exc:  # one job's error never stops the round (N3)
            counts["errors"] += 1
            log.warning("job %d: %s", job.job_id, exc)

    def _add(self, d: Decision, shards: int, demand: Activity, prof: Profile, job_id: int,
             uid: Optional[int]) -> None:
        """Count a steered job on its GPU for the rest of the round."""
        key = (d.node, d.index)
        for i, g in enumerate(self.gpus):
            if g.key == key:
                self.gpus[i] = replace(g, shards_used=g.shards_used + shards, tenants=g.tenants + 1,
                                       recent=g.recent + demand)
                if self.policy.sharing_model:
                    self.tenants[i].append(Tenant(prof, self.now, self.counted(demand, prof).smact,
                                                  job_id, uid=uid))
