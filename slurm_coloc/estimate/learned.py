"""Learned estimate (GPUMemNet-style MLP ensemble); filled in once weights are trained."""
from __future__ import annotations

import os

WEIGHTS = os.path.join(os.path.dirname(__file__), "weights", "ensemble.npz")


def available() -> bool:
    """True when trained weights are shipped."""
    return os.path.isfile(WEIGHTS)
