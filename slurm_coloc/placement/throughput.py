"""The ``throughput`` placement policy: pack each GPU while the sharing model's predicted slowdown of every
job on it stays within the bound (``share.choose_gpu_bounded``); a job with no signature and no FLOPs goes by
memory among the GPUs that a job of unknown activity leaves within the bound. Pure."""
from __future__ import annotations

from slurm_coloc.placement import share
from slurm_coloc.placement.evidence import Evidence, Policy
from slurm_coloc.placement.policy import Decision, Hold, memory_only


class ThroughputPolicy(Policy):
    """The slowdown bound of ``share.py``."""

    name = "throughput"
    sharing_model = True

    def decide(self, ev: Evidence) -> Decision:
        lim = ev.limits
        if not ev.has_data:
            room = share.within_bound(ev.gpus, ev.tenants, lim.capacity, lim.floor, lim.max_slowdown, ev.now)
            d = memory_only(room, ev.shards)
            # room, but not within the bound
            if not d.placed and any(g.shards_free >= ev.shards for g in ev.gpus):
                return Decision(None, None, f"every GPU with {ev.shards} free shards is at its bound for a "
                                            f"job of unknown activity (SMACT {lim.floor:.2f})",
                                hold=Hold.UNKNOWN_AT_BOUND)
            return d
        return share.choose_gpu_bounded(ev.gpus, ev.tenants, ev.shards, ev.profile, ev.counted, lim.capacity,
                                        lim.max_slowdown, ev.now, ev.uid, lim.floor)


THROUGHPUT = ThroughputPolicy()
