"""Choosing a GPU for a shared job: memory first, then the saturation gate, then spread or consolidate. Pure.

The gate is CARMA's: a GPU is saturated when SMACT >= ``smact`` and (SMOCC >= ``smocc`` or DRAMA >= ``drama``)
(fractions 0..1; defaults 0.8 / 0.45 / 0.4 in ``Config``). Activity of jobs sharing a GPU through MPS is taken
as additive (each fraction capped at 1.0): the prediction for a GPU with a candidate is its measured live
activity plus the predicted activity of tenants placed too recently to show in the samples plus the
candidate's. A GPU with no tenant takes any job whose memory fits (nobody to slow down). A GPU whose live
state is missing or older than the configured age is judged by memory alone, so stale monitoring never blocks
the cluster.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import List, Optional, Sequence, Tuple

MODES = ("spread", "consolidate")


@dataclass(frozen=True)
class Activity:
    """GPU activity as fractions 0..1 (GPM SM activity, SM occupancy, DRAM bandwidth utilisation)."""

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
        """CARMA: SMACT >= smact and (SMOCC >= smocc or DRAMA >= drama); ``a``'s fields are fractions 0..1."""
        return a.smact >= self.smact and (a.smocc >= self.smocc or a.drama >= self.drama)


@dataclass(frozen=True)
class GpuState:
    """One GPU as the placer sees it.

    Attributes: node, index: Slurm node name and GPU index (gres.conf order = IDX = the sampler's
    ``gpu_index``). shards_used: shards held by running/steered jobs (Slurm's view). live: mean measured
    activity over the live window (None: missing); live_age_s: seconds since the last sample. recent: summed
    predicted activity of tenants placed after the live window began. model: the GPU's model as its sampler
    recorded it ("" unknown; picks the sharing capacity).
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
    """Why a policy keeps a job waiting, for code (``Decision.reason`` is for people): ``NO_ROOM`` no GPU has
    the job's free shards; ``SATURATED`` every GPU with room is saturated (the gate); ``AT_BOUND`` every GPU
    with room is at the slowdown bound (the sharing model); ``UNKNOWN_AT_BOUND`` the same for a job of unknown
    activity placed by memory."""

    NO_ROOM = "no-room"
    SATURATED = "saturated"
    AT_BOUND = "at-bound"
    UNKNOWN_AT_BOUND = "unknown-at-bound"


@dataclass(frozen=True)
class Decision:
    """A policy's verdict for one job: a GPU (``node``/``index``) or a wait (``hold``: why; None when placed),
    with a ``reason`` the user reads. ``basis``: ``utilization`` (gate applied), ``memory-only`` (live state
    stale or missing), ``empty-gpu`` (no tenant there); ``predicted``: the GPU's predicted activity with the
    job (None when memory-only).
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


def _fmt(a: Activity) -> str:
    return f"SMACT {a.smact:.2f} SMOCC {a.smocc:.2f} DRAMA {a.drama:.2f}"


def fresh(gpu: GpuState, max_age_s: float) -> bool:
    """Whether the GPU's live state exists and is at most ``max_age_s`` (s) old."""
    return gpu.live is not None and gpu.live_age_s is not None and 0 <= gpu.live_age_s <= max_age_s


# (sort key, GPU, basis, predicted activity): one GPU that qualifies, as choose_gpu ranks it
_Option = Tuple[Tuple, GpuState, str, Optional[Activity]]


def _option(g: GpuState, demand: Activity, gate: Gate, mode: str, max_age_s: float,
            blocked: List[str]) -> Optional[_Option]:
    """Rules (2)-(4) of :func:`choose_gpu` for one GPU with room: its ranking, or None (the reason appended to
    ``blocked``) when it would be saturated."""
    if g.tenants == 0 and g.shards_used == 0:
        pred = (g.live or Activity()) + demand if fresh(g, max_age_s) else demand
        basis = "empty-gpu"
    elif fresh(g, max_age_s):
        assert g.live is not None
        pred = g.live + g.recent + demand
        if gate.saturated(g.live) or gate.saturated(pred):
            why = "saturated now" if gate.saturated(g.live) else "would saturate"
            blocked.append(f"{g.node}/gpu{g.index} {why} ({_fmt(pred)})")
            return None
        basis = "utilization"
    else:
        pred, basis = None, "memory-only"
    load = pred.smact if pred is not None else 0.0
    rank_basis = 1 if basis == "memory-only" else 0
    if mode == "spread":
        key: Tuple = (rank_basis, round(load, 3), g.tenants, -g.shards_free, g.node, g.index)
    else:
        key = (rank_basis, -round(load, 3), -g.tenants, g.shards_free, g.node, g.index)
    return key, g, basis, pred


def choose_gpu(gpus: Sequence[GpuState], shards: int, demand: Activity, gate: Gate, mode: str = "spread",
               max_age_s: float = 60.0) -> Decision:
    """Pick a GPU for a job of ``shards`` shards and predicted activity alone ``demand``.

    Rules, in order: (1) the job's shards fit the GPU's free shards; (2) a GPU with no tenant qualifies; (3) a
    GPU with fresh live state qualifies if live + recent + demand is not saturated and live alone is not (the
    guard: a GPU that stays saturated takes no new tenant); (4) a GPU with stale or missing state qualifies on
    memory alone. ``spread`` takes the least loaded (lowest predicted SMACT, fewest tenants, most free shards,
    node/index) and prefers utilization-checked and empty GPUs to memory-only ones so stale nodes do not
    attract every job; ``consolidate`` the most loaded that qualifies (highest predicted SMACT, fewest free
    shards). Live state older than ``max_age_s`` (s) is stale.

    Raises:
        ValueError: unknown mode or shards < 1.
    """
    if mode not in MODES:
        raise ValueError(f"unknown placement mode {mode!r} (one of {', '.join(MODES)})")
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    fits = [g for g in gpus if g.shards_free >= shards]
    if not fits:
        return no_room(gpus, shards)
    options: List[_Option] = []
    blocked: List[str] = []
    for g in fits:
        option = _option(g, demand, gate, mode, max_age_s, blocked)
        if option is not None:
            options.append(option)
    if not options:
        return Decision(None, None, "every GPU with room is saturated: " + "; ".join(blocked[:4]),
                        hold=Hold.SATURATED)
    options.sort(key=lambda o: o[0])
    _, best, basis, pred = options[0]
    reason = f"{best.node}/gpu{best.index} ({basis}" + (f", {_fmt(pred)})" if pred is not None else ")")
    return Decision(best.node, best.index, reason, basis, pred)


def saturated_gpus(gpus: Sequence[GpuState], gate: Gate, max_age_s: float) -> List[Tuple[str, int]]:
    """``(node, index)`` of GPUs whose live state (<= ``max_age_s`` s old) is saturated: the guard's view."""
    return [g.key for g in gpus if fresh(g, max_age_s) and g.live is not None and gate.saturated(g.live)]


def memory_only(gpus: Sequence[GpuState], shards: int) -> Decision:
    """A GPU by memory alone (basis ``memory-only``): fewest tenants among those with ``shards`` free, then
    most free shards, node, index; not placed when none has room.
    """
    fits = sorted((g for g in gpus if g.shards_free >= shards),
                  key=lambda g: (g.tenants, -g.shards_free, g.node, g.index))
    if not fits:
        return no_room(gpus, shards)
    g = fits[0]
    return Decision(g.node, g.index, f"{g.node}/gpu{g.index} (memory-only)", "memory-only", None)


def silent_gpus(gpus: Sequence[GpuState], max_age_s: float) -> List[Tuple[str, int]]:
    """``(node, index)`` of GPUs whose sampler gave no state at most ``max_age_s`` (s) old."""
    return [g.key for g in gpus if not fresh(g, max_age_s)]
