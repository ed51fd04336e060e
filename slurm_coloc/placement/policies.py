"""The placement-policy seam (pure): what a policy decides from (``Evidence``, ``Limits``) and says
(``Decision``, ``Hold``), what a policy is (``Policy``), and the registry (``POLICIES``). A new policy is one
module and one ``register`` line in ``placement/__init__.py``, which registers the built-ins (``gate.GATE``,
``share.THROUGHPUT``); a site or a test may ``register`` its own. Every list of policies reads the registry
(the config's ``placement_policy`` choices, ``config.sections.PLACEMENT_POLICIES``, are kept in step here: the
config layer may not import this one). Activities are fractions 0..1."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Dict, Optional, Sequence, Tuple

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
    """One GPU as the placer sees it: ``index`` in gres.conf order (= the sampler's ``gpu_index``);
    ``shards_used`` by running/steered jobs (Slurm's view); ``live``: mean measured activity over the live
    window (None: missing), ``live_age_s`` (s) since its last sample; ``recent``: summed predicted activity of
    tenants placed after the live window began; ``model`` as its sampler recorded it ("": unknown)."""

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
    """Why a job waits, for code (``Decision.reason`` is for people)."""

    NO_ROOM = "no-room"
    SATURATED = "saturated"
    AT_BOUND = "at-bound"
    UNKNOWN_AT_BOUND = "unknown-at-bound"


@dataclass(frozen=True)
class Decision:
    """A GPU (``node``/``index``) or a wait (``hold``), with a ``reason`` the user reads; ``basis``:
    ``utilization``, ``memory-only``, ``empty-gpu``, ...; ``predicted``: the GPU's activity with the job
    (None: memory-only)."""

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
    """By memory alone: fewest tenants among GPUs with ``shards`` free, most free shards, node, index."""
    fits = sorted((g for g in gpus if g.shards_free >= shards),
                  key=lambda g: (g.tenants, -g.shards_free, g.node, g.index))
    if not fits:
        return no_room(gpus, shards)
    g = fits[0]
    return Decision(g.node, g.index, f"{g.node}/gpu{g.index} (memory-only)", "memory-only", None)


@dataclass(frozen=True)
class Profile:
    """A job signature's behaviour alone: ``smact`` (None: never measured), run and start-up (s, Slurm start
    to first busy sample; None: unknown); ``learned`` from shared runs (``coruns.py``): trusted for its own
    user only."""

    smact: Optional[float]
    run_s: Optional[float] = None
    startup_s: Optional[float] = None
    learned: bool = False

    @property
    def work_s(self) -> Optional[float]:
        """Computing time alone (s): run minus start-up (None without a run time)."""
        return None if self.run_s is None else max(0.0, self.run_s - (self.startup_s or 0.0))


@dataclass(frozen=True)
class Tenant:
    """A job on a GPU for the sharing model: ``predicted`` SM activity alone (where none measured), ``end_ts``
    once it left (None: still there; replayed as load until then, never counted at a new job's start). Times
    Unix s."""

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
    """The site's settings: ``max_age_s`` (s) before live state is stale; ``max_slowdown`` >= 1; ``capacity``
    of a GPU model name; ``floor``: the least SM activity a job never measured alone counts with."""

    gate: Gate
    mode: str = "spread"
    max_age_s: float = 60.0
    max_slowdown: float = 2.0
    capacity: Callable[[str], float] = lambda _model: 1.0
    floor: float = 0.0


@dataclass(frozen=True)
class Evidence:
    """One held job and the round's GPUs (with the jobs steered earlier in the round). ``tenants``: per GPU,
    the jobs present and departed (only for a ``sharing_model`` policy); ``demand``: predicted activity alone,
    ``counted`` as the sharing model counts it (floored when never measured alone); ``profile`` on a GPU model
    name ("": any); ``has_data``: a signature or FLOPs predicts its activity; ``uid`` None: unknown; ``now``:
    Unix s."""

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
    """``name``: the ``placement_policy`` value. ``sharing_model``: the round fills ``Evidence.tenants``,
    counts a steered job with ``Evidence.counted`` and offers GPUs least GPU work first, not oldest first."""

    name: str = ""
    sharing_model: bool = False

    @abstractmethod
    def decide(self, ev: Evidence) -> Decision:
        """Pure: a GPU, or a wait (``Decision.hold``) with a reason; ValueError: bad shards or setting."""


POLICIES: Dict[str, Policy] = {}


def register(policy: Policy) -> Policy:
    """Add ``policy`` under its ``name`` (replacing one) as a ``placement_policy``; ValueError: no name."""
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
