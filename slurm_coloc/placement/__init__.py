"""Utilization-aware placement of shared GPU jobs (coloc-placer). The built-in policies are registered here,
one line each (a new policy: one module and one line; the seam is ``policies.py``)."""
from slurm_coloc.placement import gate, share
from slurm_coloc.placement.policies import register

register(gate.GATE)
register(share.THROUGHPUT)
