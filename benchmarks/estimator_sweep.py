#!/usr/bin/env python3
"""Robustness sweep: does the estimator give a finite figure on many real models?

Sets (``--sets``, comma-separated; default all):

* ``tv``: every torchvision classification model (``torchvision.models.list_models(module=
  torchvision.models)``), batch 16, SGD, fp32, 3x224x224 (inception_v3/googlenet: 3x299x299,
  ``aux_logits=False, init_weights=False``);
* ``tv-amp``: a handful of those with ``--amp`` (fp16 autocast);
* ``hf``: Hugging Face models built from config by the user file ``examples/hf_models.py``
  (token ids, sequence 128 and 512; ViT on 3x224x224), AdamW;
* ``timm``: timm models via ``timm:create_model`` (skipped when timm is not installed).

Each spec goes through ``combine.traced_estimate`` (the trace and the calibrated bound, no cache)
in this process. A row is ``ok`` with the figure, ``error`` with the one-line ``EstimateError``
(what ``coloc-estimate`` prints, exit 2), or ``CRASH`` for any other exception (an estimator bug:
the CLI would print a traceback).

    .venv/bin/python -W ignore benchmarks/estimator_sweep.py [--sets tv,hf] [--limit N]
"""
from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from slurm_coloc.errors import EstimateError  # noqa: E402
from slurm_coloc.estimate.spec import ModelSpec  # noqa: E402

HF_FILE = "examples/hf_models.py:"
HF_TOKEN_MODELS = ("gpt2", "gpt_neox", "llama", "mistral", "qwen2", "bert", "roberta", "distilbert",
                   "albert", "electra", "t5_encoder")
TV_AMP = ("resnet50", "mobilenet_v3_large", "efficientnet_b0", "convnext_tiny", "swin_t", "vit_b_16",
          "densenet121", "regnet_y_400mf")
TIMM = ("resnet50", "efficientnet_b0", "convnext_tiny", "vit_small_patch16_224", "xception41")


def _spec(model: str, shape: Tuple[int, ...], bs: int, opt: str, kwargs: Dict[str, Any] | None = None,
          dtype: str = "float32", precision: str = "fp32") -> ModelSpec:
    return ModelSpec(model=model, input_shape=shape, batch_size=bs, kwargs=dict(kwargs or {}),
                     input_dtype=dtype, optimizer=opt, precision=precision, base_dir=str(REPO))


def tv_specs(amp: bool) -> List[Tuple[str, ModelSpec]]:
    """torchvision classification models (all, or the ``TV_AMP`` handful with AMP)."""
    import torchvision

    names = list(TV_AMP) if amp else torchvision.models.list_models(module=torchvision.models)
    out = []
    for name in names:
        kw: Dict[str, Any] = {}
        shape = (3, 224, 224)
        if name in ("inception_v3", "googlenet"):
            kw, shape = {"aux_logits": False, "init_weights": False}, (3, 299, 299)
        out.append((name + (" amp" if amp else ""),
                    _spec("torchvision.models:" + name, shape, 16, "sgd", kw,
                          precision="amp-fp16" if amp else "fp32")))
    return out


def hf_specs() -> List[Tuple[str, ModelSpec]]:
    """The Hugging Face builders of ``examples/hf_models.py`` at sequence 128 and 512, and ViT."""
    out = []
    for seq in (128, 512):
        for name in HF_TOKEN_MODELS:
            out.append((f"hf {name} seq{seq}", _spec(HF_FILE + name, (seq,), 8, "adamw", dtype="int64")))
    out.append(("hf gpt2 seq512 amp", _spec(HF_FILE + "gpt2", (512,), 8, "adamw", dtype="int64",
                                             precision="amp-fp16")))
    out.append(("hf llama seq512 bf16", _spec(HF_FILE + "llama", (512,), 8, "adamw", dtype="int64",
                                               precision="bf16")))
    out.append(("hf vit", _spec(HF_FILE + "vit", (3, 224, 224), 16, "adamw")))
    return out


def timm_specs() -> List[Tuple[str, ModelSpec]]:
    """timm models through ``timm:create_model`` (none when timm is missing)."""
    try:
        import timm  # noqa: F401
    except ImportError:
        return []
    return [(f"timm {n}", _spec("timm:create_model", (3, 224, 224), 16, "sgd", {"model_name": n})) for n in TIMM]


def run_one(spec: ModelSpec) -> Tuple[str, str, float]:
    """``(status, figure or one-line error, wall s)`` of one traced estimate."""
    from slurm_coloc.estimate.combine import traced_estimate

    t0 = time.time()
    try:
        est = traced_estimate(spec, "H100")
        ok = isinstance(est.mem_mib, int) and math.isfinite(est.mem_mib) and est.mem_mib > 0
        note = f" assumed={est.detail['assumed_values']}" if est.detail.get("assumed_values") else ""
        status, text = ("ok" if ok else "BAD"), f"{est.mem_mib}{note}"
    except EstimateError as exc:
        status, text = "error", exc.one_line()
    except Exception as exc:  # noqa: BLE001 - an estimator bug; the sweep reports it
        status, text = "CRASH", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:160]
    return status, text, time.time() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", default="tv,tv-amp,hf,timm", help="comma-separated: tv, tv-amp, hf, timm")
    ap.add_argument("--limit", type=int, default=0, help="at most this many specs per set (0: all)")
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # transformers' config warnings
    builders = {"tv": lambda: tv_specs(False), "tv-amp": lambda: tv_specs(True), "hf": hf_specs,
                "timm": timm_specs}
    counts: Dict[str, int] = {}
    t_all = time.time()
    print(f"{'model':34} {'status':6} {'estimate_mib / error':>20}  wall_s")
    for name in args.sets.split(","):
        specs = builders[name]()
        if args.limit:
            specs = specs[:args.limit]
        for label, spec in specs:
            status, text, wall = run_one(spec)
            counts[status] = counts.get(status, 0) + 1
            print(f"{label:34} {status:6} {text:>20}  {wall:6.2f}", flush=True)
    total = sum(counts.values())
    print(f"\n{total} specs: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
          + f"; {time.time() - t_all:.0f} s")
    return 0 if counts.get("CRASH", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
