"""Code that runs inside the job's Python during a probe (stdlib + the job's torch only).

Loaded by the bootstrap ``runner.BOOTSTRAP`` from a scratch directory holding a link to the
``slurm_coloc`` package, so the job's interpreter needs no slurm-coloc installed.
"""
from __future__ import annotations
