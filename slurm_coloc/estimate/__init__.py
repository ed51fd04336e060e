"""GPU memory estimation (owned by the estimator work, issue 3). See spec.py for the contract."""
from slurm_coloc.estimate.spec import Estimate, ModelSpec

__all__ = ["Estimate", "ModelSpec"]
