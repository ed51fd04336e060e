"""The ``gate`` placement policy (pure): memory first, then CARMA's saturation gate (``Gate``: SMACT >=
``smact`` and (SMOCC >= ``smocc`` or DRAMA >= ``drama``), defaults 0.8 / 0.45 / 0.4 in ``Config``), then
spread or consolidate. Activity of jobs sharing a GPU through MPS is taken as additive (each fraction capped
at 1.0): measured live activity plus the predicted activity of tenants placed too recently to show in the
samples plus the candidate's. A GPU whose live state is missing or stale is judged by memory alone, so stale
monitoring never blocks the cluster."""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from slurm_coloc.placement.policies import Activity, Decision, Evidence, Gate, GpuState, Hold, Policy, no_room

MODES = ("spread", "consolidate")


def _fmt(a: Activity) -> str:
    return f"SMACT {a.smact:.2f} SMOCC {a.smocc:.2f} DRAMA {a.drama:.2f}"


def fresh(gpu: GpuState, max_age_s: float) -> bool:
    """Whether the GPU's live state exists and is at most ``max_age_s`` (s) old."""
    return gpu.live is not None and gpu.live_age_s is not None and 0 <= gpu.live_age_s <= max_age_s


# (sort key, GPU, basis, predicted activity): one GPU that qualifies, as choose_gpu ranks it
_Option = Tuple[Tuple, GpuState, str, Optional[Activity]]


def _option(g: GpuState, demand: Activity, gate: Gate, mode: str, max_age_s: float,
            blocked: List[str]) -> Optional[_Option]:
    """Rules (2)-(4) of ``choose_gpu`` for one GPU with room: its ranking, or None (why in ``blocked``)."""
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
    """A GPU for a job of ``shards`` shards and predicted activity alone ``demand``. Rules: (1) the shards
    fit; (2) a GPU with no tenant qualifies; (3) one with fresh live state if live + recent + demand is not
    saturated and live alone is not (the guard); (4) one with stale or missing state (older than
    ``max_age_s``, s) on memory alone. ``spread``: least loaded (lowest predicted SMACT, fewest tenants, most
    free shards, node/index), utilization-checked and empty GPUs before memory-only ones so stale nodes do not
    attract every job; ``consolidate``: most loaded (highest SMACT, fewest free shards). ValueError: unknown
    mode or shards < 1."""
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


def silent_gpus(gpus: Sequence[GpuState], max_age_s: float) -> List[Tuple[str, int]]:
    """``(node, index)`` of GPUs whose sampler gave no state at most ``max_age_s`` (s) old."""
    return [g.key for g in gpus if not fresh(g, max_age_s)]


class GatePolicy(Policy):
    name = "gate"
    sharing_model = False

    def decide(self, ev: Evidence) -> Decision:
        lim = ev.limits
        return choose_gpu(ev.gpus, ev.shards, ev.demand, lim.gate, lim.mode, lim.max_age_s)


GATE = GatePolicy()
