"""GPUMemNet-style feature vector of a training job (pure Python + math; no torch).

Features (issue 3, part 1): log2 of parameters, activations per sample, batch size and
activations per batch; depth (leaf modules); counts of Linear, Conv, BatchNorm, LayerNorm,
Dropout, attention and embedding layers; the dominant activation function encoded, as in
GPUMemNet, by sin/cos of its index; optimizer one-hot; precision one-hot; token input flag.
They need only the model's structure, so they also exist for the GPUMemNet CSVs, which record
no trace. The domain flag marks rows measured on GPUMemNet's A100 stack (0 for our Hopper rows
and for every prediction).
"""
from __future__ import annotations

import math
from typing import Dict, List, Sequence

from slurm_coloc.estimate.spec import OPTIMIZERS, PRECISIONS

ACT_INDEX = ("", "ReLU", "GELU", "SiLU", "Tanh", "Sigmoid", "LeakyReLU", "ELU", "Softplus",
             "Hardswish", "Mish", "ReLU6", "Hardsigmoid", "SELU", "PReLU")
COUNT_KEYS = ("linear", "conv", "batchnorm", "layernorm", "dropout", "attention", "embedding")

FEATURE_NAMES: List[str] = (
    ["log2_params", "log2_acts_per_sample", "log2_batch", "log2_acts_per_batch", "log2_depth"]
    + [f"log2_n_{k}" for k in COUNT_KEYS]
    + ["act_sin", "act_cos"]
    + [f"opt_{o}" for o in OPTIMIZERS]
    + [f"prec_{p}" for p in PRECISIONS]
    + ["token_input", "domain_a100"]
)


def act_encoding(name: str) -> Sequence[float]:
    """``(sin, cos)`` of the activation's index in ``ACT_INDEX`` over its length (GPUMemNet's encoding)."""
    i = ACT_INDEX.index(name) if name in ACT_INDEX else 0
    angle = 2 * math.pi * i / len(ACT_INDEX)
    return (math.sin(angle), math.cos(angle))


def feature_vector(params: float, acts_per_sample: float, batch_size: int, depth: int,
                   counts: Dict[str, int], activation: str, optimizer: str, precision: str,
                   token_input: bool, domain_a100: bool = False) -> List[float]:
    """The features in ``FEATURE_NAMES`` order (floats).

    Args:
        params: parameter count; acts_per_sample: leaf-module output elements per sample;
        batch_size: samples per step; depth: leaf modules; counts: layer counts by ``COUNT_KEYS``;
        activation: dominant activation class name; optimizer/precision: as in ``ModelSpec``;
        token_input: int64 token ids; domain_a100: row from GPUMemNet's A100 data.
    """
    def lg(x: float) -> float:
        return math.log2(1.0 + max(0.0, float(x)))

    vec = [lg(params), lg(acts_per_sample), lg(batch_size), lg(acts_per_sample * batch_size), lg(depth)]
    vec += [lg(counts.get(k, 0)) for k in COUNT_KEYS]
    vec += list(act_encoding(activation))
    vec += [1.0 if optimizer == o else 0.0 for o in OPTIMIZERS]
    vec += [1.0 if precision == p else 0.0 for p in PRECISIONS]
    vec += [1.0 if token_input else 0.0, 1.0 if domain_a100 else 0.0]
    return vec
