"""Utilization-aware placement (coloc-placer); the built-in policies, registered here one line each."""
from slurm_coloc.placement import gate, share
from slurm_coloc.placement.policies import register

register(gate.GATE)
register(share.THROUGHPUT)
