"""One final figure from history, the analytical trace and the learned ensemble.

Order (issue 3, part 5):
1. history: measured NVML peaks of earlier runs of the same spec -> ``max * (1 + margin) + pad``;
2. otherwise the calibrated analytical bound (``calibrated_bound``); the learned ensemble's
   figures go into ``detail`` only, because on held-out families its bound over-reserved far
   more (docs/estimator.md). The calibration (``weights/calibration.json``, written by
   ``estimate.train``) holds the bound's form (``margins.py``) and its margins, chosen on
   validation families so that underestimates are rare (held-out rates in docs/estimator.md).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Dict, Optional, Sequence

from slurm_coloc.errors import EstimateError
from slurm_coloc.estimate.spec import Estimate, ModelSpec

WEIGHTS_DIR = os.path.join(os.path.dirname(__file__), "weights")
HISTORY_MARGIN = 0.05
HISTORY_PAD_MIB = 64
# Used only when no calibration file is shipped: deliberately generous.
_DEFAULT_CAL = {"analytic_mult": 1.25, "analytic_add_mib": 256.0, "learned_mult": 1.0}


def load_calibration() -> Dict[str, Any]:
    """The shipped calibration (``weights/calibration.json``) or the generous defaults."""
    path = os.path.join(WEIGHTS_DIR, "calibration.json")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as fh:
            cal = dict(_DEFAULT_CAL)
            cal.update(json.load(fh))
            return cal
    return dict(_DEFAULT_CAL)


def history_bound(history_mib: Sequence[int]) -> Optional[int]:
    """``max(history) * 1.05 + 64`` MiB, or None without usable history (non-positive values dropped)."""
    good = [int(h) for h in history_mib if h is not None and int(h) > 0]
    if not good:
        return None
    return int(math.ceil(max(good) * (1 + HISTORY_MARGIN) + HISTORY_PAD_MIB))


def combined_estimate(spec: ModelSpec, gpu_name: str, history_mib: Sequence[int] = ()) -> Estimate:
    """See :func:`slurm_coloc.estimate.estimate_peak` (this is its body).

    The trace-derived estimate comes from the per-user cache (``cache.py``) when the same spec,
    model code, torch and estimator were estimated before (then torch is not imported);
    otherwise the spec is traced and the result stored. History is applied on top.

    Raises:
        EstimateError: unknown GPU, a malformed spec or an untraceable model.
    """
    from slurm_coloc.estimate import cache
    from slurm_coloc.estimate.gpus import gpu_model
    from slurm_coloc.estimate.loader import validate_spec

    gpu = gpu_model(gpu_name)
    validate_spec(spec)
    key = cache.cache_key(spec, gpu.name) if cache.enabled() else None
    base = cache.lookup(key) if key else None
    if base is None:
        base = traced_estimate(spec, gpu.name)
        if key:
            cache.store(key, base)
    hist = history_bound(history_mib)
    if hist is not None:
        detail = dict(base.detail)
        detail["history_mib"] = max(int(h) for h in history_mib if h and int(h) > 0)
        return Estimate(mem_mib=hist, method="history", detail=detail, gpu_model=base.gpu_model)
    return base


def calibrated_bound(cal: Dict[str, Any], analytic_mib: float, context_mib: float, libs_mib: float,
                     precision: Optional[str] = None, depthwise_max_hw: int = 0) -> float:
    """The calibrated upper bound (MiB) on NVML's per-process peak from the analytic figure.

    ``cal["form"]`` (written by ``estimate.train``; forms and their rationale in ``margins.py``),
    with ``R = analytic - context - libs`` the replayed peak reserved memory:

    - absent or ``"scalar"`` (old calibration files): ``analytic * mult + add``;
    - ``"per-component"``: ``context + libs + add + R * mult``;
    - ``"per-component-sqrt"``: the same ``+ sqrt_k * sqrt(R)``;
    - ``"per-component-jit"``: the same ``+ jit_mib`` when ``precision == "amp-fp16"`` and
      ``depthwise_max_hw > jit_min_hw`` (extra cuDNN kernel memory, docs/estimator.md);
    - ``"per-precision-jit"``: ``per-component-jit`` with ``amp_mult`` instead of ``analytic_mult``
      for ``amp-fp16`` and ``bf16`` jobs.
    """
    mult, add = float(cal["analytic_mult"]), float(cal["analytic_add_mib"])
    form = cal.get("form", "scalar")
    if form == "scalar":
        return analytic_mib * mult + add
    if form == "per-precision-jit" and precision in ("amp-fp16", "bf16"):
        mult = float(cal["amp_mult"])
    reserved = max(0.0, analytic_mib - context_mib - libs_mib)
    out = context_mib + libs_mib + add + reserved * mult
    if form == "per-component-sqrt":
        out += float(cal.get("sqrt_k", 0.0)) * math.sqrt(reserved)
    elif form in ("per-component-jit", "per-precision-jit"):
        jit = float(cal.get("jit_mib", 0.0))
        if jit > 0 and precision == "amp-fp16" and int(depthwise_max_hw) > int(cal.get("jit_min_hw", 0)):
            out += jit
    elif form != "per-component":
        raise EstimateError(f"calibration.json: unknown bound form {form!r}")
    return out


def traced_estimate(spec: ModelSpec, gpu_name: str, workspace_exclude: Sequence[str] = ()) -> Estimate:
    """Trace ``spec`` (with each convolution's cuDNN workspace, ``workspace.py``) and give the
    calibrated analytic bound (no history, no cache).

    Args:
        spec: the training job.
        gpu_name: a GPU model ``gpus.gpu_model`` knows.
        workspace_exclude: table sources to leave out (evaluations of unseen models only).

    Raises:
        EstimateError: unknown GPU, an untraceable model or an unreadable workspace table.
    """
    from slurm_coloc.estimate import workspace
    from slurm_coloc.estimate.analytic import analytic_detail, analytic_mib
    from slurm_coloc.estimate.gpus import gpu_model
    from slurm_coloc.estimate.trace import trace_spec

    gpu = gpu_model(gpu_name)
    ws_model = workspace.load(workspace_exclude)
    trace = trace_spec(spec, workspace=ws_model.bytes_for if ws_model is not None else None)
    cal = load_calibration()
    if "libs_mib" in cal:  # measured on Hopper (data/hopper): cuBLAS/cuDNN memory beyond the context
        gpu = dataclasses.replace(gpu, libs_mib=int(round(float(cal["libs_mib"]))))
    if gpu.arch != workspace.TABLE_ARCH and cal.get("form") == "per-precision-jit":
        # The workspace table is a proxy on this GPU (cuDNN picks per architecture), so the fp32 trace
        # is no more faithful than the AMP one: every job gets the larger, AMP multiplier.
        cal = dict(cal, analytic_mult=max(float(cal["analytic_mult"]), float(cal["amp_mult"])))
    detail: Dict[str, Any] = analytic_detail(trace, gpu)
    ana = analytic_mib(trace, gpu)
    ana_bound = calibrated_bound(cal, ana, gpu.context_mib, gpu.libs_mib, precision=spec.precision,
                                 depthwise_max_hw=int(getattr(trace, "depthwise_max_hw", 0) or 0))
    detail["bound_form"] = str(cal.get("form", "scalar"))
    detail["conv_workspace_max_mib"] = round(int(getattr(trace, "conv_workspace_max_b", 0) or 0) / 2**20, 1)
    proxy = f"proxy ({workspace.TABLE_ARCH})"
    detail["workspace_table"] = "measured" if gpu.arch == workspace.TABLE_ARCH else proxy
    detail["analytic_bound_mib"] = round(ana_bound, 1)
    learned = _learned(spec, trace, gpu.name)
    if learned is not None:
        # Reported, not used for the figure: on held-out families the learned bound
        # over-reserved far more than the calibrated analytic bound (docs/estimator.md).
        detail["learned_mib"] = round(learned["mean_mib"], 1)
        detail["learned_bound_mib"] = round(learned["bound_mib"] * float(cal["learned_mult"]), 1)
    mem = int(math.ceil(ana_bound))
    detail["chosen"] = "analytic"
    assumed = dict(getattr(trace, "assumed_values", None) or {})
    if assumed:  # the trace read values it does not have (datadep.py): say so
        from slurm_coloc.estimate.datadep import NOTE

        detail["assumed_values"] = sum(assumed.values())
        detail["assumed_values_by_kind"] = assumed
        detail["notes"] = NOTE
    if mem > gpu.mem_mib:
        detail["exceeds_gpu"] = True
    return Estimate(mem_mib=mem, method="analytic", detail=detail, gpu_model=gpu.name)


def _learned(spec: ModelSpec, trace: Any, gpu: str) -> Optional[Dict[str, float]]:
    """The learned ensemble's mean and upper bound (MiB), or None when no weights are shipped."""
    try:
        from slurm_coloc.estimate import learned
    except ImportError:  # pragma: no cover - learned.py is part of the package
        return None
    if not learned.available():
        return None
    try:
        return learned.predict(spec, trace, gpu)
    except (OSError, ValueError) as exc:
        raise EstimateError(f"model {spec.model}: learned estimator weights unusable: {exc}") from exc
