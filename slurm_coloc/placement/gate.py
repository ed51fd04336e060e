"""The ``gate`` placement policy: CARMA's saturation gate over live + predicted activity for every job
(``policy.choose_gpu``). Pure."""
from __future__ import annotations

from slurm_coloc.placement.evidence import Evidence, Policy
from slurm_coloc.placement.policy import Decision, choose_gpu


class GatePolicy(Policy):
    """Memory first, then the saturation gate, then ``spread`` or ``consolidate`` (``policy.choose_gpu``)."""

    name = "gate"
    sharing_model = False

    def decide(self, ev: Evidence) -> Decision:
        lim = ev.limits
        return choose_gpu(ev.gpus, ev.shards, ev.demand, lim.gate, lim.mode, lim.max_age_s)


GATE = GatePolicy()
