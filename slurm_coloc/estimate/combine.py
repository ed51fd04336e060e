"""The calibrated analytical bound of a replayed run, and ``estimate_peak``'s figure (that bound of the
traced spec, history applied by ``decision.decide``). The margins (``weights/calibration.json``) make
underestimates rare on validation families (``benchmarks/estimator/train.py``; rates: docs/estimator.md).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import TYPE_CHECKING, Any, Dict, Sequence

from slurm_coloc.errors import EstimateError
from slurm_coloc.estimate.spec import Estimate, ModelSpec

if TYPE_CHECKING:
    from slurm_coloc.estimate.trace import ReplayedPeaks

WEIGHTS_DIR = os.path.join(os.path.dirname(__file__), "weights")
BOUND_FORM = "per-precision-jit"
_CAL_KEYS = ("analytic_mult", "amp_mult", "analytic_add_mib", "jit_mib", "jit_min_hw", "libs_mib")


def load_calibration() -> Dict[str, Any]:
    """The shipped ``weights/calibration.json``. Raises ``EstimateError``: missing, not JSON, of another form
    than ``BOUND_FORM`` or without a margin :func:`calibrated_bound` reads."""
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


def combined_estimate(spec: ModelSpec, gpu_name: str, history_mib: Sequence[int] = ()) -> Estimate:
    """``estimate_peak``'s body: :func:`traced_estimate`, from the per-user cache (``cache.py``) when
    unchanged, with history (MiB peaks) applied by ``decision.decide``. Raises ``EstimateError``: unknown GPU,
    a malformed spec or an untraceable model."""
    from slurm_coloc.estimate import cache
    from slurm_coloc.estimate.decision import Candidate, EstimateEvidence, decide
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
    verdict = decide(EstimateEvidence(directives=Candidate.of(base, gpu.name, ""),
                                      history_mib=tuple(history_mib)))
    if verdict.mem_mib is None or verdict.history_peak_mib is None:
        return base
    detail = dict(base.detail, history_mib=verdict.history_peak_mib)
    if verdict.history_below_floor_mib is not None:
        detail["history_below_trace_floor"] = verdict.history_below_floor_mib
    return Estimate(mem_mib=verdict.mem_mib, method="history", detail=detail, gpu_model=base.gpu_model,
                    flops_per_step=base.flops_per_step)


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
    """:func:`bound_from_trace` of ``spec``'s trace with cuDNN workspaces, but for the table sources in
    ``workspace_exclude`` (evaluations of unseen models). Raises ``EstimateError``: unknown GPU, an
    untraceable model or an unreadable workspace table."""
    from slurm_coloc.estimate import workspace
    from slurm_coloc.estimate.spec import gpu_model
    from slurm_coloc.estimate.trace import trace_spec

    gpu_model(gpu_name)  # an unknown GPU fails before the trace
    ws_model = workspace.load(workspace_exclude)
    trace = trace_spec(spec, workspace=ws_model.bytes_for if ws_model is not None else None)
    return bound_from_trace(trace, gpu_name, spec.precision)


def bound_from_trace(peaks: ReplayedPeaks, gpu_name: str, precision: str) -> Estimate:
    """:func:`calibrated_bound` of ``analytic.analytic_mib`` (method ``analytic``), ``libs_mib`` the
    calibration's (Hopper); off the workspace table's architecture every precision gets the AMP multiplier.
    ``detail["trace_floor_mib"]``: the lower of both figures, history's floor (``decision.py``). Raises
    ``EstimateError``: unknown GPU or unusable shipped calibration."""
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
    detail: Dict[str, Any] = analytic_detail(peaks, gpu)
    ana = analytic_mib(peaks, gpu)
    ana_bound = calibrated_bound(cal, ana, gpu.context_mib, gpu.libs_mib, precision=precision,
                                 depthwise_max_hw=peaks.depthwise_max_hw)
    detail["bound_form"] = BOUND_FORM
    detail["conv_workspace_max_mib"] = round(peaks.conv_workspace_max_b / 2**20, 1)
    proxy = f"proxy ({workspace.TABLE_ARCH})"
    detail["workspace_table"] = "measured" if gpu.arch == workspace.TABLE_ARCH else proxy
    detail["analytic_bound_mib"] = round(ana_bound, 1)
    detail["trace_floor_mib"] = int(math.ceil(min(ana, ana_bound)))
    mem = int(math.ceil(ana_bound))
    detail["chosen"] = "analytic"
    if peaks.assumed_values:  # the trace read values it does not have (gpulike.py): say so
        from slurm_coloc.estimate.gpulike import NOTE

        detail["assumed_values"] = sum(peaks.assumed_values.values())
        detail["assumed_values_by_kind"] = dict(peaks.assumed_values)
        detail["notes"] = NOTE
    if mem > gpu.mem_mib:
        detail["exceeds_gpu"] = True
    flops = peaks.flops_per_step
    return Estimate(mem_mib=mem, method="analytic", detail=detail, gpu_model=gpu.name,
                    flops_per_step=flops if flops is not None and flops >= 0 else None)
