"""Parameterised model families for the Hopper data set and tests (``benchmarks/estimator/zoo.py:mlp`` ...).

Each builder takes JSON keyword arguments and returns a ``torch.nn.Module`` whose forward
returns logits, so a ``ModelSpec`` can name it like any user model. Torch is imported inside.

The data sets (``data/hopper/*.csv``, ``benchmarks/device/fence_cfgs.json``) name these builders
by the module path they were measured under, ``slurm_coloc.estimate.zoo:<builder>`` (and
``slurm_coloc.estimate.zoo_paper:<builder>`` for ``zoo_paper.py``); :func:`model_ref` turns such a
name into this file's path, which ``ModelSpec.model`` accepts from any working directory.
"""
from __future__ import annotations

import os
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
DATA_MODULES = {"slurm_coloc.estimate.zoo": "benchmarks.estimator.zoo",
                "slurm_coloc.estimate.zoo_paper": "benchmarks.estimator.zoo_paper"}
DATA_NAMES = {name: os.path.join(HERE, mod.rpartition(".")[2] + ".py") for name, mod in DATA_MODULES.items()}


def model_ref(name: str) -> str:
    """``ModelSpec.model`` for a data set's model name: ``slurm_coloc.estimate.zoo:cnn`` becomes
    ``/abs/path/benchmarks/estimator/zoo.py:cnn``; any other name (``torchvision.models:resnet50``,
    a user file) is returned unchanged."""
    module, _, attr = name.rpartition(":")
    path = DATA_NAMES.get(module)
    return f"{path}:{attr}" if path else name


def builder(name: str) -> Any:
    """The callable a data set's model name names, imported by module name (``benchmarks.estimator.zoo``
    and ``benchmarks.estimator.zoo_paper`` for the data sets' names, run from the repository root; others as
    named).

    Raises:
        ImportError / AttributeError: no such module or callable.
    """
    import importlib

    module, _, attr = name.rpartition(":")
    return getattr(importlib.import_module(DATA_MODULES.get(module, module)), attr)

_ACTS = {"relu": "ReLU", "gelu": "GELU", "silu": "SiLU", "tanh": "Tanh", "sigmoid": "Sigmoid",
         "leakyrelu": "LeakyReLU", "elu": "ELU", "softplus": "Softplus", "mish": "Mish"}


def _act(name: str) -> Any:
    import torch

    return getattr(torch.nn, _ACTS[name])()


def mlp(in_features: int = 784, out_features: int = 10, depth: int = 3, width: int = 512,
        arch: str = "uniform", activation: str = "relu", batchnorm: bool = False,
        dropout: float = 0.0) -> Any:
    """GPUMemNet-style MLP: ``depth`` hidden Linear layers, ``uniform`` width or ``pyramid`` (halving).

    Input ``(in_features,)``; output ``(out_features,)`` logits.
    """
    import torch

    layers, prev = [], in_features
    for i in range(depth):
        w = width if arch == "uniform" else max(out_features, width >> i)
        layers.append(torch.nn.Linear(prev, w))
        if batchnorm:
            layers.append(torch.nn.BatchNorm1d(w))
        layers.append(_act(activation))
        if dropout > 0:
            layers.append(torch.nn.Dropout(dropout))
        prev = w
    layers.append(torch.nn.Linear(prev, out_features))
    return torch.nn.Sequential(*layers)


def cnn(in_channels: int = 3, num_classes: int = 10, stages: int = 3, blocks: int = 1,
        base_channels: int = 32, kernel: int = 3, activation: str = "relu",
        batchnorm: bool = True, dropout: float = 0.0) -> Any:
    """Plain VGG-like CNN: ``stages`` of ``blocks`` conv(+BN)+act, each stage doubling channels
    and halving resolution by max-pool; global average pool; Linear head. Input ``(C, H, W)``."""
    import torch

    layers, prev = [], in_channels
    for s in range(stages):
        ch = base_channels << s
        for _ in range(blocks):
            layers.append(torch.nn.Conv2d(prev, ch, kernel, padding=kernel // 2, bias=not batchnorm))
            if batchnorm:
                layers.append(torch.nn.BatchNorm2d(ch))
            layers.append(_act(activation))
            prev = ch
        layers.append(torch.nn.MaxPool2d(2, ceil_mode=True))
    layers += [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten()]
    if dropout > 0:
        layers.append(torch.nn.Dropout(dropout))
    layers.append(torch.nn.Linear(prev, num_classes))
    return torch.nn.Sequential(*layers)


def transformer_lm(vocab_size: int = 8192, d_model: int = 256, n_layers: int = 4, n_heads: int = 4,
                   ff_mult: int = 4, dropout: float = 0.1, activation: str = "gelu",
                   max_len: int = 4096) -> Any:
    """Decoder-style language model (token ids ``(T,)`` -> logits ``(T, vocab_size)``) built from
    ``nn.TransformerEncoderLayer`` with a causal mask, learned positions, pre-norm."""
    import torch

    class LM(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = torch.nn.Embedding(vocab_size, d_model)
            self.pos = torch.nn.Embedding(max_len, d_model)
            layer = torch.nn.TransformerEncoderLayer(
                d_model, n_heads, d_model * ff_mult, dropout, activation=activation,
                batch_first=True, norm_first=True)
            self.blocks = torch.nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
            self.norm = torch.nn.LayerNorm(d_model)
            self.head = torch.nn.Linear(d_model, vocab_size, bias=False)

        def forward(self, ids: Any) -> Any:
            t = ids.shape[1]
            pos = torch.arange(t, device=ids.device)
            h = self.tok(ids) + self.pos(pos)
            mask = torch.nn.Transformer.generate_square_subsequent_mask(t, device=ids.device)
            h = self.blocks(h, mask=mask, is_causal=True)
            return self.head(self.norm(h))

    return LM()


def seq_classifier(in_dim: int = 128, num_classes: int = 10, d_model: int = 256, n_layers: int = 2,
                   n_heads: int = 4, ff_mult: int = 4, dropout: float = 0.1,
                   activation: str = "relu") -> Any:
    """Transformer encoder over a sequence of vectors ``(T, in_dim)`` -> class logits (mean pool)."""
    import torch

    class Enc(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = torch.nn.Linear(in_dim, d_model)
            layer = torch.nn.TransformerEncoderLayer(
                d_model, n_heads, d_model * ff_mult, dropout, activation=activation, batch_first=True)
            self.enc = torch.nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
            self.head = torch.nn.Linear(d_model, num_classes)

        def forward(self, x: Any) -> Any:
            return self.head(self.enc(self.inp(x)).mean(dim=1))

    return Enc()
