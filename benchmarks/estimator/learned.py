"""Learned estimate (research comparison, not used by the package): an ensemble of small MLPs over
GPUMemNet-style features (numpy inference).

GPUMemNet (Yousefzadeh-Asl-Miandoab et al., EuroMLSys '26) classifies jobs into memory bins
with an ensemble of MLPs over structural features. Here each member regresses
``log2(peak NVML MiB)`` (finer than bins; bin accuracy is reported in docs/estimator.md), the
mean of the members is the point estimate and the largest member's prediction, scaled by a
factor chosen on held-out families (``learned_mult`` in the shipped calibration.json), the upper bound.

Weights: ``weights/ensemble.npz`` written by ``benchmarks/estimator/train.py``; arrays
``mean``, ``scale`` (feature standardisation), ``n_members``, and per member ``m{i}_W{j}``,
``m{i}_b{j}`` (ReLU hidden layers, linear output). Inference is a few small matmuls (< 1 ms).
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from benchmarks.estimator.features import feature_vector

WEIGHTS = os.path.join(os.path.dirname(__file__), "weights", "ensemble.npz")
_CACHE: Dict[str, Any] = {}


def available() -> bool:
    """True when trained weights are shipped."""
    return os.path.isfile(WEIGHTS)


def _load(path: str = WEIGHTS) -> Dict[str, Any]:
    if path not in _CACHE:
        import numpy as np

        with np.load(path) as z:
            arrs = {k: z[k] for k in z.files}
        n = int(arrs["n_members"])
        members: List[List[Any]] = []
        for i in range(n):
            layers, j = [], 0
            while f"m{i}_W{j}" in arrs:
                layers.append((arrs[f"m{i}_W{j}"], arrs[f"m{i}_b{j}"]))
                j += 1
            members.append(layers)
        _CACHE[path] = {"mean": arrs["mean"], "scale": arrs["scale"], "members": members}
    return _CACHE[path]


def predict_features(vec: List[float], path: str = WEIGHTS) -> Dict[str, float]:
    """Members' predictions for one feature vector: ``mean_mib`` and ``max_mib`` (MiB).

    Raises:
        OSError / ValueError: missing or malformed weights file.
    """
    import numpy as np

    w = _load(path)
    x = (np.asarray(vec, dtype=np.float64) - w["mean"]) / w["scale"]
    if x.shape != w["mean"].shape:
        raise ValueError(f"feature vector has {x.shape[0]} values, weights expect {w['mean'].shape[0]}")
    outs = []
    for layers in w["members"]:
        h = x
        for k, (W, b) in enumerate(layers):
            h = h @ W + b
            if k < len(layers) - 1:
                h = np.maximum(h, 0.0)
        outs.append(float(h.reshape(-1)[0]))
    logs = np.asarray(outs)
    return {"mean_mib": float(2 ** logs.mean()), "max_mib": float(2 ** logs.max())}


def spec_features(spec: Any, trace: Any) -> List[float]:
    """Feature vector of a traced spec (see ``features.FEATURE_NAMES``)."""
    return feature_vector(
        params=trace.params, acts_per_sample=trace.activations_per_sample,
        batch_size=spec.batch_size, depth=trace.layer_counts.get("leaf", 0),
        counts=trace.layer_counts, activation=trace.activation_fn, optimizer=spec.optimizer,
        precision=spec.precision, token_input=spec.input_dtype == "int64")


def predict(spec: Any, trace: Any, gpu: str, path: Optional[str] = None) -> Dict[str, float]:
    """Learned estimate for a traced spec on ``gpu``: ``mean_mib`` and ``bound_mib`` (MiB).

    The ensemble is trained on H100 measurements (plus A100 rows flagged as such); other GPUs
    get the H100 figure, which holds where the CUDA stack is the same (H200).
    """
    out = predict_features(spec_features(spec, trace), path or WEIGHTS)
    return {"mean_mib": out["mean_mib"], "bound_mib": out["max_mib"]}
