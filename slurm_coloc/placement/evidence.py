"""What a placement policy decides from (``Evidence``, ``Limits``) and what a policy is (``Policy``). Pure.

A policy is one object with a ``name`` and one pure function ``decide(Evidence) -> policy.Decision``: the
chosen GPU, or a wait with its ``Hold`` and a reason the user reads. ``placement/policies.py`` holds the
registry (``POLICIES``, ``register``); coloc-placer's round (``rounds.Round``) builds the evidence, the
policy named by ``placement_policy`` decides, and the round acts.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from slurm_coloc.placement.policy import Activity, Decision, Gate, GpuState
from slurm_coloc.placement.share import Profile, Tenant


@dataclass(frozen=True)
class Limits:
    """The site's settings a policy applies (from the config and the calibration).

    Attributes: gate: the saturation thresholds (fractions); max_age_s: live state older than this (s) is
    stale. max_slowdown: the bound on a job's predicted slowdown (ratio >= 1). capacity: the sharing capacity
    (summed SM activity alone, fraction) of a GPU model name. floor: the least SM activity (fraction) a job
    never measured alone counts with.
    """

    gate: Gate
    mode: str = "spread"
    max_age_s: float = 60.0
    max_slowdown: float = 2.0
    capacity: Callable[[str], float] = lambda _model: 1.0
    floor: float = 0.0


@dataclass(frozen=True)
class Evidence:
    """One held job and the round's GPUs, as a policy sees them.

    Attributes: gpus: every GPU the job may use (updated with the jobs steered earlier in the round). tenants:
    index for index with ``gpus``, the jobs on each as the sharing model sees them (present and departed;
    filled only for a policy with ``sharing_model``). shards: the job's shard request (>= 1); demand: its
    predicted activity alone (fractions). counted: ``demand`` as the sharing model counts it (SM activity
    raised to the floor when never measured alone). profile: the job's profile on a GPU of a model name
    (``""``: any model). has_data: the job has a signature or a FLOPs count (else nothing predicts its
    activity). uid: the job's user (None: not known); now: the round's time (Unix s).
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
    """A placement policy: ``name`` (the ``placement_policy`` value) and ``decide``.

    ``sharing_model``: the policy judges GPUs with the sharing model (``share.py``), so the round builds each
    GPU's tenants (``Evidence.tenants``), counts a steered job with ``Evidence.counted`` and offers held jobs
    GPUs least GPU work first (``share.order_candidates``); otherwise oldest first, ``tenants`` empty.
    """

    name: str = ""
    sharing_model: bool = False

    @abstractmethod
    def decide(self, ev: Evidence) -> Decision:
        """Pure: a GPU, or a wait (``Decision.hold``) with a reason; ValueError: bad shards or setting."""
