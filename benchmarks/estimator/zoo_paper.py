"""The 12 real models of the GPUMemNet paper's table, as ``ModelSpec`` builders, and its 18 configs.

GPUMemNet (Yousefzadeh-Asl-Miandoab et al., IT University of Copenhagen; github.com/itu-rad/GPUMemNet,
``Results_plotter_for_paper/data.csv``, copied to ``shared/data/gpumemnet/`` under CC BY 4.0) lists
the measured peak GPU memory of 18 (model, batch size) training runs on an A100 40GB. The runs'
scripts are the same group's CARMA workloads (github.com/itu-rad/CARMA @ 58779f8, ``workloads/*.py``);
the settings below follow them:

* CNNs (``vgg.py``, ``resnet50.py``, ``mobilenet.py``, ``efficientNet.py``, ``Inception.py``,
  ``Xception.py``): ImageNet, 1000 classes, ``Adam(lr=1e-3)``, fp32; 224x224 crops except Inception
  v3 (299x299, ``aux_logits=False``). Xception is ``timm.create_model('xception')`` (the legacy
  Chollet-2017 port) at 224x224; :func:`xception` rebuilds that architecture without timm.
* BERT base/large (``BERT_*_on_wiki.py``): ``BertForMaskedLM`` from config, vocab of
  ``bert-large-cased`` (28996), sequences padded to 512, ``AdamW(lr=1e-4)``.
* GPT-2 large/xl (``gpt2_*_on_wiki.py``): ``GPT2LMHeadModel`` from config (36x1280/20 heads,
  48x1600/25 heads), vocab 50257, sequences padded to **512** (not 1024), ``AdamW``.
* XLNet base/large (``xlnet_*_cased.py``): ``XLNetForSequenceClassification`` (pretrained
  weights there, random init here: same memory), HF ``Trainer`` (AdamW, fp32), truncation at 512
  with dynamic padding (so the paper's batches were often shorter than 512; 512 is the bound).

Hugging Face models are built from config (no download) with the library's default attention
(``sdpa`` for BERT and GPT-2; XLNet has only its own eager attention) and wrapped so that
``forward(ids)`` returns the logits tensor, as the estimator's training step expects.
Torch / torchvision / transformers are imported inside the builders.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

TV = "torchvision.models:"
HERE = "slurm_coloc.estimate.zoo_paper:"  # the configs' data-set name; zoo.model_ref gives the file
BERT_VOCAB = 28996  # bert-large-cased tokenizer (CARMA BERT_*_on_wiki.py: vocab_size=tokenizer.vocab_size)
GPT2_VOCAB = 50257
XLNET_VOCAB = 32000


def _sep_conv(torch: Any, cin: int, cout: int) -> Any:
    """Depthwise 3x3 then pointwise 1x1, no bias (Xception's SeparableConv2d)."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(cin, cin, 3, 1, 1, groups=cin, bias=False),
        torch.nn.Conv2d(cin, cout, 1, bias=False))


def xception(num_classes: int = 1000, in_channels: int = 3) -> Any:
    """Xception (Chollet, CVPR 2017) as in timm's legacy ``xception``: entry flow (two convs and
    three residual blocks of separable convs, 128/256/728 channels, stride 2 each), middle flow
    (8 blocks of three 728-channel separable convs), exit flow (728->1024 block, separable convs
    to 1536 and 2048), global average pool, Linear head. ReLU before each separable conv, BN after;
    1x1 strided conv + BN shortcuts. Input ``(3, H, W)`` (299 in the paper, 224 in CARMA's run)."""
    import torch

    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, reps: int, stride: int = 1,
                     start_with_relu: bool = True, grow_first: bool = True) -> None:
            super().__init__()
            self.skip: Optional[Any] = None
            if cout != cin or stride != 1:
                self.skip = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(cout))
            layers: List[Any] = []
            for i in range(reps):
                if grow_first:
                    a, b = (cin if i == 0 else cout), cout
                else:
                    a, b = cin, (cin if i < reps - 1 else cout)
                layers += [nn.ReLU(inplace=i > 0), _sep_conv(torch, a, b), nn.BatchNorm2d(b)]
            if not start_with_relu:
                layers = layers[1:]
            if stride != 1:
                layers.append(nn.MaxPool2d(3, stride, 1))
            self.rep = nn.Sequential(*layers)

        def forward(self, x: Any) -> Any:
            skip = self.skip(x) if self.skip is not None else x
            return self.rep(x) + skip

    blocks = [Block(64, 128, 2, 2, start_with_relu=False), Block(128, 256, 2, 2), Block(256, 728, 2, 2)]
    blocks += [Block(728, 728, 3, 1) for _ in range(8)]
    blocks.append(Block(728, 1024, 2, 2, grow_first=False))
    return nn.Sequential(
        nn.Conv2d(in_channels, 32, 3, 2, 0, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
        nn.Conv2d(32, 64, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
        *blocks,
        _sep_conv(torch, 1024, 1536), nn.BatchNorm2d(1536), nn.ReLU(inplace=True),
        _sep_conv(torch, 1536, 2048), nn.BatchNorm2d(2048), nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, num_classes))


def _logits_module(inner: Any) -> Any:
    """Wrap a Hugging Face model: ``forward(ids)`` -> ``inner(input_ids=ids).logits``.

    On the meta device transformers' causal-mask code asks whether the position ids hold packed
    sequences (a data-dependent ``.all()``); the estimator's trace answers such reads itself
    (``gpulike.py``: ``all()`` -> True, "not packed"), which is what the GPU computes for the
    ``arange`` position ids the model builds (no mask, ``is_causal=True``).
    """
    import torch

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.hf = inner

        def forward(self, ids: Any) -> Any:
            return self.hf(input_ids=ids).logits

    return Logits()


def bert_mlm(size: str = "base", vocab_size: int = BERT_VOCAB, max_len: int = 512,
             attn_implementation: str = "sdpa") -> Any:
    """``BertForMaskedLM`` from config (``base`` 12x768/12, ``large`` 24x1024/16); ids ``(T,)`` ->
    logits ``(T, vocab_size)``."""
    from transformers import BertConfig, BertForMaskedLM

    h, n, heads = (768, 12, 12) if size == "base" else (1024, 24, 16)
    cfg = BertConfig(vocab_size=vocab_size, hidden_size=h, num_hidden_layers=n, num_attention_heads=heads,
                     intermediate_size=4 * h, max_position_embeddings=max_len, type_vocab_size=2,
                     hidden_act="gelu", layer_norm_eps=1e-12)
    cfg._attn_implementation = attn_implementation
    return _logits_module(BertForMaskedLM(cfg))


def gpt2_lm(size: str = "large", vocab_size: int = GPT2_VOCAB, n_positions: int = 1024,
            attn_implementation: str = "sdpa") -> Any:
    """``GPT2LMHeadModel`` from config (``large`` 36x1280/20, ``xl`` 48x1600/25), ``gelu_new``,
    dropout 0.1, no KV cache; ids ``(T,)`` -> logits ``(T, vocab_size)``."""
    from transformers import GPT2Config, GPT2LMHeadModel

    d, n, heads = (1280, 36, 20) if size == "large" else (1600, 48, 25)
    cfg = GPT2Config(vocab_size=vocab_size, n_positions=n_positions, n_embd=d, n_layer=n, n_head=heads,
                     activation_function="gelu_new", resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1,
                     use_cache=False, bos_token_id=50256, eos_token_id=50256)
    cfg._attn_implementation = attn_implementation
    return _logits_module(GPT2LMHeadModel(cfg))


def xlnet_cls(size: str = "base", vocab_size: int = XLNET_VOCAB, num_labels: int = 2) -> Any:
    """``XLNetForSequenceClassification`` from config (``base`` 12x768/12 d_inner 3072, ``large``
    24x1024/16 d_inner 4096; bi-directional attention, no memory, ``summary_type='last'``); ids
    ``(T,)`` -> logits ``(num_labels,)``."""
    from transformers import XLNetConfig, XLNetForSequenceClassification

    d, n, heads = (768, 12, 12) if size == "base" else (1024, 24, 16)
    cfg = XLNetConfig(vocab_size=vocab_size, d_model=d, n_layer=n, n_head=heads, d_inner=4 * d,
                      ff_activation="gelu", untie_r=True, attn_type="bi", mem_len=None, use_mems_train=False,
                      num_labels=num_labels, dropout=0.1)
    return _logits_module(XLNetForSequenceClassification(cfg))


def _cfg(name: str, model: str, kwargs: Dict[str, Any], shape: List[int], bs: int, dtype: str = "float32",
         optimizer: str = "adam") -> Dict[str, Any]:
    return {"name": name, "model": model, "kwargs": kwargs, "shape": shape, "batch_size": bs,
            "input_dtype": dtype, "optimizer": optimizer, "precision": "fp32"}


def paper18() -> List[Dict[str, Any]]:
    """The 18 (model, batch size) rows of the paper's table, in its order, with the CARMA settings.

    Each dict: ``name`` (the paper's model label), ``model``/``kwargs`` (a ``ModelSpec`` callable),
    ``shape`` (one sample), ``batch_size``, ``input_dtype``, ``optimizer``, ``precision``.
    Optimizer ``adam`` for the CNNs, ``adamw`` for the transformers (same state memory).
    """
    img = [3, 224, 224]
    out: List[Dict[str, Any]] = []
    for name, model, kw, shape in (
            ("vgg16", TV + "vgg16", {"num_classes": 1000}, img),
            ("resnet50", TV + "resnet50", {"num_classes": 1000}, img),
            ("Xception", HERE + "xception", {"num_classes": 1000}, img),
            ("mobilenetV2", TV + "mobilenet_v2", {"num_classes": 1000}, img),
            ("efficientnet", TV + "efficientnet_b0", {"num_classes": 1000}, img),
            ("inception", TV + "inception_v3",
             {"num_classes": 1000, "aux_logits": False, "init_weights": False}, [3, 299, 299])):
        out += [_cfg(name, model, kw, shape, bs) for bs in (32, 128)]
    for name, model, kw, seq, bs in (
            ("BERT_base", "bert_mlm", {"size": "base", "vocab_size": BERT_VOCAB}, 512, 32),
            ("BERT_large", "bert_mlm", {"size": "large", "vocab_size": BERT_VOCAB}, 512, 8),
            ("xlnet_base", "xlnet_cls", {"size": "base", "vocab_size": XLNET_VOCAB}, 512, 8),
            ("xlnet_large", "xlnet_cls", {"size": "large", "vocab_size": XLNET_VOCAB}, 512, 4),
            ("gpt2_large", "gpt2_lm", {"size": "large", "vocab_size": GPT2_VOCAB}, 512, 8),
            ("gpt2_xl", "gpt2_lm", {"size": "xl", "vocab_size": GPT2_VOCAB}, 512, 2)):
        out.append(_cfg(name, HERE + model, kw, [seq], bs, "int64", "adamw"))
    return out
