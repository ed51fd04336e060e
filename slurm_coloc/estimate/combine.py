"""One final figure from history and the calibrated analytical trace.

1. history: measured NVML peaks of the same user's same script -> ``max * (1 + margin) + pad``, which may
   raise the traced figure and lower it only down to the trace's floor (``trace_floor_mib``: the
   uncalibrated ``analytic.analytic_mib``; the calibrated bound multiplies it up, never down);
2. otherwise the calibrated analytical bound (:func:`calibrated_bound`) of the traced spec. Its margins
   (``weights/calibration.json``) were chosen on validation families so that underestimates are rare
   (``benchmarks/estimator/train.py``; held-out rates in docs/estimator.md).
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
BOUND_FORM = "per-precision-jit"
_CAL_KEYS = ("analytic_mult", "amp_mult", "analytic_add_mib", "jit_mib", "jit_min_hw", "libs_mib")


def load_calibration() -> Dict[str, Any]:
    """The shipped calibration (``weights/calibration.json``).

    Raises:
        EstimateError: the file is missing, not JSON, of another bound form than ``BOUND_FORM`` or lacks one
            of the margins :func:`calibrated_bound` reads.
    """
    path = os.path.join(WEIGHTS_DIR, "calibration.json")
    try:
        with open(path, encoding="utf-8") as fh:
            cal = json.load(fh)
    except (OSError, ValueError) as exc:
        raise EstimateError(f"shipped calibration {path} unusable: {exc}") from exc
    if not isinstance(cal, dict) or cal.get("form") != BOUND_FORM:
        form = cal.get("form") if isinstance(cal, dict) else None
        raise EstimateError(f"shipped calibration {path}: bound form {form!r}, expected {BOUND_FORM!r}")
    missing = [k for k in _CAL_KEYS if k not in cal]
    if missing:
        raise EstimateError(f"shipped calibration {path}: missing {', '.join(missing)}")
    return cal


def history_bound(history_mib: Sequence[int]) -> Optional[int]:
    """``max(history) * HISTORY_MARGIN + HISTORY_PAD_MIB`` MiB rounded up; None entries and values <= 0
    skipped.

    None without usable history.
    """
    good = [int(h) for h in history_mib if h is not None and int(h) > 0]
    if not good:
        return None
    return int(math.ceil(max(good) * (1 + HISTORY_MARGIN) + HISTORY_PAD_MIB))


def combined_estimate(spec: ModelSpec, gpu_name: str, history_mib: Sequence[int] = ()) -> Estimate:
    """:func:`slurm_coloc.estimate.estimate_peak`'s body.

    The trace-derived estimate comes from the per-user cache (``cache.py``) when the same spec, model code,
    torch and estimator were estimated before (torch then not imported); otherwise the spec is traced and
    stored. History (MiB peaks) is applied on top: it may raise the figure or lower it, never below the trace
    floor (``detail["trace_floor_mib"]``); method ``history`` then.

    Raises:
        EstimateError: unknown GPU, a malformed spec or an untraceable model.
    """
    from slurm_coloc.estimate import cache
    from slurm_coloc.estimate.loader import validate_spec
    from slurm_coloc.estimate.spec import gpu_model

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
        floor = int(detail.get("trace_floor_mib") or base.mem_mib)  # estimates without a floor: only raise
        if hist < floor:
            detail["history_below_trace_floor"] = hist
        return Estimate(mem_mib=max(hist, floor), method="history", detail=detail, gpu_model=base.gpu_model,
                        flops_per_step=base.flops_per_step)
    return base


def calibrated_bound(cal: Dict[str, Any], analytic_mib: float, context_mib: float, libs_mib: float,
                     precision: str = "fp32", depthwise_max_hw: int = 0) -> float:
    """The calibrated upper bound (MiB) on NVML's per-process peak from the analytic figure (all inputs MiB).

    With ``R = max(0, analytic - context - libs)`` the replayed peak reserved memory: ``context + libs +
    analytic_add_mib + R * m`` where ``m`` is ``amp_mult`` for ``amp-fp16`` and ``bf16`` and ``analytic_mult``
    otherwise, plus ``jit_mib`` for an ``amp-fp16`` job whose largest depthwise-convolution input (H*W)
    exceeds ``jit_min_hw`` (extra cuDNN kernel memory measured on H100, docs/estimator.md). The margins are
    ``cal``'s; the fitting of this form and of the rejected ones is ``benchmarks/estimator/margins.py``.
    """
    mult = float(cal["amp_mult"] if precision in ("amp-fp16", "bf16") else cal["analytic_mult"])
    reserved = max(0.0, analytic_mib - context_mib - libs_mib)
    out = context_mib + libs_mib + float(cal["analytic_add_mib"]) + reserved * mult
    jit = float(cal["jit_mib"])
    if jit > 0 and precision == "amp-fp16" and int(depthwise_max_hw) > int(cal["jit_min_hw"]):
        out += jit
    return out


def traced_estimate(spec: ModelSpec, gpu_name: str, workspace_exclude: Sequence[str] = ()) -> Estimate:
    """Trace ``spec`` (with each convolution's cuDNN workspace) and give :func:`bound_from_trace` (no
    history/cache).

    ``workspace_exclude``: table sources to leave out (evaluations of unseen models only).

    Raises:
        EstimateError: unknown GPU, an untraceable model or an unreadable workspace table.
    """
    from slurm_coloc.estimate import workspace
    from slurm_coloc.estimate.spec import gpu_model
    from slurm_coloc.estimate.trace import trace_spec

    gpu_model(gpu_name)  # an unknown GPU fails before the trace
    ws_model = workspace.load(workspace_exclude)
    trace = trace_spec(spec, workspace=ws_model.bytes_for if ws_model is not None else None)
    return bound_from_trace(trace, gpu_name, spec.precision)


def bound_from_trace(trace: Any, gpu_name: str, precision: str) -> Estimate:
    """The calibrated analytic bound (method ``analytic``) of one traced run (a ``trace.TraceResult`` or
    alike).

    ``analytic.analytic_mib`` goes through :func:`calibrated_bound` with the shipped calibration; ``libs_mib``
    is the calibration's (measured on Hopper), and on a GPU of another architecture than the cuDNN workspace
    table's every precision gets the larger AMP multiplier.

    Raises:
        EstimateError: unknown GPU or unusable shipped calibration.
    """
    from slurm_coloc.estimate import workspace
    from slurm_coloc.estimate.spec import analytic_detail, analytic_mib, gpu_model

    gpu = gpu_model(gpu_name)
    cal = load_calibration()
    # measured on Hopper (data/hopper): cuBLAS/cuDNN memory beyond the context
    gpu = dataclasses.replace(gpu, libs_mib=int(round(float(cal["libs_mib"]))))
    if gpu.arch != workspace.TABLE_ARCH:
        # The workspace table is a proxy on this GPU (cuDNN picks per architecture), so the fp32 trace
        # is no more faithful than the AMP one: every job gets the larger, AMP multiplier.
        cal = dict(cal, analytic_mult=max(float(cal["analytic_mult"]), float(cal["amp_mult"])))
    detail: Dict[str, Any] = analytic_detail(trace, gpu)
    ana = analytic_mib(trace, gpu)
    ana_bound = calibrated_bound(cal, ana, gpu.context_mib, gpu.libs_mib, precision=precision,
                                 depthwise_max_hw=int(getattr(trace, "depthwise_max_hw", 0) or 0))
    detail["bound_form"] = BOUND_FORM
    detail["conv_workspace_max_mib"] = round(int(getattr(trace, "conv_workspace_max_b", 0) or 0) / 2**20, 1)
    proxy = f"proxy ({workspace.TABLE_ARCH})"
    detail["workspace_table"] = "measured" if gpu.arch == workspace.TABLE_ARCH else proxy
    detail["analytic_bound_mib"] = round(ana_bound, 1)
    detail["trace_floor_mib"] = int(math.ceil(min(ana, ana_bound)))  # history never lowers below this
    mem = int(math.ceil(ana_bound))
    detail["chosen"] = "analytic"
    assumed = dict(getattr(trace, "assumed_values", None) or {})
    if assumed:  # the trace read values it does not have (datadep.py): say so
        from slurm_coloc.estimate.gpulike import NOTE

        detail["assumed_values"] = sum(assumed.values())
        detail["assumed_values_by_kind"] = assumed
        detail["notes"] = NOTE
    if mem > gpu.mem_mib:
        detail["exceeds_gpu"] = True
    flops = getattr(trace, "flops_per_step", None)
    return Estimate(mem_mib=mem, method="analytic", detail=detail, gpu_model=gpu.name,
                    flops_per_step=int(flops) if isinstance(flops, int) and flops >= 0 else None)
