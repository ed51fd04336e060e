"""The placement-policy seam: what a policy decides from (``Evidence``, ``Limits``), what it says
(``Decision``, ``Hold``), what a policy is (``Policy``) and the registry (``POLICIES``). Pure.

A policy is one object with a ``name`` and a pure ``decide(Evidence) -> Decision``. A new policy is one module
and one ``register`` line in ``placement/__init__.py``, which registers the built-ins (``gate.GATE``,
``share.THROUGHPUT``) so that importing any placement module knows them; a site or a test may ``register``
its own. Every list of policies reads the registry: the config's ``placement_policy`` choices
(``config.sections.PLACEMENT_POLICIES``, kept in step here: the config layer may not import this one),
``rounds.Round.policy``, ``replay.runner.modes`` and the benchmarks. Activities are fractions 0..1.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from slurm_coloc.config import sections
from slurm_coloc.errors import ConfigError


@dataclass(frozen=True)
class Activity:
    """GPM SM activity, SM occupancy, DRAM bandwidth utilisation (fractions 0..1)."""

    smact: float = 0.0
    smocc: float = 0.0
    drama: float = 0.0

    def __add__(self, other: "Activity") -> "Activity":
        return Activity(min(1.0, self.smact + other.smact), min(1.0, self.smocc + other.smocc),
                        min(1.0, self.drama + other.drama))


@dataclass(frozen=True)
class Gate:
    """Saturation thresholds (fractions)."""

    smact: float = 0.8
    smocc: float = 0.45
    drama: float = 0.4

    def saturated(self, a: Activity) -> bool:
        """CARMA: SMACT >= smact and (SMOCC >= smocc or DRAMA >= drama)."""
        return a.smact >= self.smact and (a.smocc >= self.smocc or a.drama >= self.drama)


@dataclass(frozen=True)
class GpuState:
    """One GPU as the placer sees it: ``node``, ``index`` (gres.conf order = the sampler's ``gpu_index``);
    ``shards_used`` by running/steered jobs (Slurm's view); ``live``: mean measured activity over the live
    window (None: missing), ``live_age_s`` (s) since its last sample; ``recent``: summed predicted activity of
    tenants placed after the live window began; ``model`` as its sampler recorded it ("": unknown).
    """

    node: str
    index: int
    shards_total: int
    shards_used: int = 0
    tenants: int = 0
    live: Optional[Activity] = None
    live_age_s: Optional[float] = None
    recent: Activity = field(default_factory=Activity)
    model: str = ""

    @property
    def shards_free(self) -> int:
        return self.shards_total - self.shards_used

    @property
    def key(self) -> Tuple[str, int]:
        return (self.node, self.index)


class Hold(Enum):
    """Why a job waits, for code (``Decision.reason`` is for people): no GPU has its free shards; every GPU
    with room is saturated (the gate), at the slowdown bound (the sharing model), or at the bound for a job of
    unknown activity placed by memory."""

    NO_ROOM = "no-room"
    SATURATED = "saturated"
    AT_BOUND = "at-bound"
    UNKNOWN_AT_BOUND = "unknown-at-bound"


@dataclass(frozen=True)
class Decision:
    """A GPU (``node``/``index``) or a wait (``hold``; None when placed), with a ``reason`` the user reads.
    ``basis``: ``utilization`` (gate applied), ``memory-only``, ``empty-gpu``, ...; ``predicted``: the GPU's
    predicted activity with the job (None when memory-only).
    """

    node: Optional[str]
    index: Optional[int]
    reason: str
    basis: str = ""
    predicted: Optional[Activity] = None
    hold: Optional[Hold] = None

    @property
    def placed(self) -> bool:
        return self.node is not None


def no_room(gpus: Sequence[GpuState], shards: int) -> Decision:
    """The wait (``Hold.NO_ROOM``) of a job of ``shards`` shards that no GPU has room for."""
    most = max((g.shards_free for g in gpus), default=0)
    return Decision(None, None, f"no GPU has {shards} free shards (most free: {most})", hold=Hold.NO_ROOM)


def memory_only(gpus: Sequence[GpuState], shards: int) -> Decision:
    """A GPU by memory alone: fewest tenants among those with ``shards`` free, then most free shards, node,
    index; not placed when none has room."""
    fits = sorted((g for g in gpus if g.shards_free >= shards),
                  key=lambda g: (g.tenants, -g.shards_free, g.node, g.index))
    if not fits:
        return no_room(gpus, shards)
    g = fits[0]
    return Decision(g.node, g.index, f"{g.node}/gpu{g.index} (memory-only)", "memory-only", None)


@dataclass(frozen=True)
class Profile:
    """A job signature's measured behaviour alone: ``smact`` (None: never measured), whole run and start-up
    (s, Slurm start to the first busy sample; None: not known); ``learned``: learned from shared runs
    (``coruns.py``), not measured alone, so trusted for its own user only."""

    smact: Optional[float]
    run_s: Optional[float] = None
    startup_s: Optional[float] = None
    learned: bool = False

    @property
    def work_s(self) -> Optional[float]:
        """Computing time alone (s): run minus start-up (None without a run time)."""
        if self.run_s is None:
            return None
        return max(0.0, self.run_s - (self.startup_s or 0.0))


@dataclass(frozen=True)
class Tenant:
    """A job on a GPU as the sharing model sees it: ``start_ts`` (Slurm start or steering), predicted SM
    activity alone (used where the profile has none measured), ``end_ts`` once it left the GPU (None: still
    there; a job that left is replayed as load until then, never counted at a new job's start). Times Unix s.
    """

    profile: Profile
    start_ts: float
    predicted: float = 0.5
    job_id: Optional[int] = None
    end_ts: Optional[float] = None
    uid: Optional[int] = None

    @property
    def smact(self) -> float:
        """Measured SM activity alone, else the predicted one."""
        return self.profile.smact if self.profile.smact is not None else self.predicted


@dataclass(frozen=True)
class Limits:
    """The site's settings (config, calibration): ``max_age_s``: live state older than this (s) is stale;
    ``max_slowdown``: the bound on a job's predicted slowdown (>= 1); ``capacity``: the sharing capacity of a
    GPU model name; ``floor``: the least SM activity a job never measured alone counts with."""

    gate: Gate
    mode: str = "spread"
    max_age_s: float = 60.0
    max_slowdown: float = 2.0
    capacity: Callable[[str], float] = lambda _model: 1.0
    floor: float = 0.0


@dataclass(frozen=True)
class Evidence:
    """One held job and the round's GPUs (updated with the jobs steered earlier in the round).

    ``tenants``: index for index with ``gpus``, the jobs on each, present and departed (filled only for a
    ``sharing_model`` policy); ``shards`` >= 1; ``demand``: predicted activity alone; ``counted``: ``demand``
    as the sharing model counts it (raised to the floor when never measured alone); ``profile``: the job's on
    a GPU model name ("": any); ``has_data``: a signature or a FLOPs count predicts its activity; ``uid``:
    None when not known; ``now``: Unix s.
    """

    gpus: Sequence[GpuState]
    tenants: Sequence[Sequence[Tenant]]
    shards: int
    demand: Activity
    counted: Activity
    profile: Callable[[str], Profile]
    has_data: bool
    uid: Optional[int]
    now: float
    limits: Limits


class Policy(ABC):
    """``name``: the ``placement_policy`` value. ``sharing_model``: the policy judges by the sharing model, so
    the round fills ``Evidence.tenants``, counts a steered job with ``Evidence.counted`` and offers held jobs
    GPUs least GPU work first (``share.order_candidates``); otherwise oldest first."""

    name: str = ""
    sharing_model: bool = False

    @abstractmethod
    def decide(self, ev: Evidence) -> Decision:
        """Pure: a GPU, or a wait (``Decision.hold``) with a reason; ValueError: bad shards or setting."""


POLICIES: Dict[str, Policy] = {}


def register(policy: Policy) -> Policy:
    """Add ``policy`` under its ``name`` (replacing one of that name), a valid ``placement_policy`` from now;
    ValueError: no name."""
    if not policy.name:
        raise ValueError(f"placement policy {policy!r} has no name")
    POLICIES[policy.name] = policy
    if policy.name not in sections.PLACEMENT_POLICIES:
        sections.PLACEMENT_POLICIES.append(policy.name)
    return policy


def unregister(name: str) -> None:
    """Remove the policy ``name`` (a test's own); no change when it is not registered."""
    POLICIES.pop(name, None)
    if name in sections.PLACEMENT_POLICIES:
        sections.PLACEMENT_POLICIES.remove(name)


def names() -> Tuple[str, ...]:
    """In registration order."""
    return tuple(POLICIES)


def get(name: str) -> Policy:
    """ConfigError: no such policy (one line listing the registered names)."""
    try:
        return POLICIES[name]
    except KeyError:
        raise ConfigError(f"config key 'placement_policy': {name!r} is not one of "
                          f"{', '.join(POLICIES)}") from None


def sharing_policies() -> List[str]:
    """The names of the policies with ``sharing_model``."""
    return [n for n, p in POLICIES.items() if p.sharing_model]
