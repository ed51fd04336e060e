"""The placement benchmark's models (``placement_bench.py``): the 14-job pile and the mixed stream, on synthetic
data, built from configs only (no weights are downloaded).

Names are ``workloads.py`` arguments ``pile:<name>``. Torchvision models take 3x224x224 images; the language
models (transformers configs: BERT-base, GPT-2, DistilBERT) take token ids made from the synthetic float input
(``|x| * 1000 mod vocab``) and train a sequence-classification head; the MLP and the transformer encoder are plain
torch. Batch sizes put each peak near 3-8 GiB on an H100 (fp32, SGD with momentum); the benchmark measures the
real peak (``profile``) and asks for it plus the CUDA context.

``workload_profile.py`` times each model alone; ``workloads.py`` trains one (it imports this catalogue,
never the reverse).
"""
from __future__ import annotations

from typing import Callable, Dict, Tuple

import torch
from torch import nn

SEQ = 256


class TokenClassifier(nn.Module):
    """A transformers sequence classifier fed from a float tensor ``(batch, SEQ)``: token ids = |x|*1000 mod
    (vocab - 1), so the synthetic-data loop of ``workloads.py`` drives it unchanged."""

    def __init__(self, model: nn.Module, vocab: int) -> None:
        super().__init__()
        self.model = model
        self.vocab = vocab

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = (x.abs() * 1000).long() % (self.vocab - 1)
        return self.model(input_ids=ids).logits


class EncoderClassifier(nn.Module):
    """``nn.TransformerEncoder`` (6 layers, d_model 512, 8 heads) over ``(batch, SEQ, 512)`` inputs, mean-pooled."""

    def __init__(self, classes: int, d: int = 512, layers: int = 6) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(d, 8, 4 * d, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(x).mean(dim=1))


def _tv(name: str) -> Callable[[int], nn.Module]:
    def build(classes: int) -> nn.Module:
        import torchvision

        return getattr(torchvision.models, name)(num_classes=classes)
    return build


def _hf(kind: str) -> Callable[[int], nn.Module]:
    def build(classes: int) -> nn.Module:
        import transformers as tf

        if kind == "bert":
            cfg = tf.BertConfig(num_labels=classes)
            model = tf.BertForSequenceClassification(cfg)
        elif kind == "gpt2":
            cfg = tf.GPT2Config(num_labels=classes, n_positions=SEQ * 2)
            cfg.pad_token_id = cfg.vocab_size - 1  # never produced by TokenClassifier: the last token is pooled
            model = tf.GPT2ForSequenceClassification(cfg)
        elif kind == "distilbert":
            cfg = tf.DistilBertConfig(num_labels=classes)
            model = tf.DistilBertForSequenceClassification(cfg)
        else:
            raise ValueError(kind)
        return TokenClassifier(model, cfg.vocab_size)
    return build


def _mlp(classes: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 64 * 64, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                         nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, classes))


IMG = (3, 224, 224)
# name -> (builder, input shape, batch, classes)
PILE: Dict[str, Tuple[Callable[[int], nn.Module], Tuple[int, ...], int, int]] = {
    "resnet50": (_tv("resnet50"), IMG, 32, 1000),
    "resnet101": (_tv("resnet101"), IMG, 32, 1000),
    "vit_b_16": (_tv("vit_b_16"), IMG, 32, 1000),
    "swin_t": (_tv("swin_t"), IMG, 32, 1000),
    "convnext_tiny": (_tv("convnext_tiny"), IMG, 32, 1000),
    "efficientnet_b0": (_tv("efficientnet_b0"), IMG, 48, 1000),
    "densenet121": (_tv("densenet121"), IMG, 32, 1000),
    "regnet_y_1_6gf": (_tv("regnet_y_1_6gf"), IMG, 48, 1000),
    "bert_base": (_hf("bert"), (SEQ,), 16, 2),
    "gpt2": (_hf("gpt2"), (SEQ,), 8, 2),
    "distilbert": (_hf("distilbert"), (SEQ,), 16, 2),
    "mlp": (_mlp, (3, 64, 64), 1024, 1000),
    "transformer_encoder": (lambda classes: EncoderClassifier(classes), (SEQ, 512), 64, 10),
}


def build_pile(name: str) -> Tuple[nn.Module, Tuple[int, ...], int, int]:
    """Model, input shape, batch and classes of pile model ``name``.

    Raises:
        SystemExit: unknown name.
    """
    if name not in PILE:
        raise SystemExit(f"pile_workloads.py: unknown model {name!r} (known: {', '.join(PILE)})")
    builder, shape, batch, classes = PILE[name]
    return builder(classes), shape, batch, classes
