"""Candidate forms of the calibrated upper bound and how their margins are chosen (pure Python).

The analytic figure (``spec.py``) is ``context + libs + R`` with ``R`` the replayed peak
reserved memory of the caching allocator. Measured on H100 (``data/hopper``), its error has
two sources: ``R`` itself (cuDNN workspaces and fragmentation the trace cannot see; roughly
proportional to ``R``, 0.9x-1.6x) and the non-allocator memory (NVML minus torch reserved:
742-764 MiB for almost every row, but ~1146 MiB for AMP-fp16 depthwise convolutions on large
inputs, where cuDNN loads extra kernel code). The candidate forms (``FORMS``) model these:

``scalar``
    ``analytic * mult + add`` (the first shipped form): one margin for everything.
``per-component``
    ``context + libs + add + R * mult``: context and libraries are near-constant measured
    quantities, so they get only the pad ``add``; the multiplicative error stays on ``R``.
``per-component-sqrt``
    ``per-component + k * sqrt(R)``: the relative error of ``R`` shrinks as 1/sqrt(R) (many
    independent rounding/workspace effects add up like a random walk), so small jobs get a
    larger relative margin than a pure multiplier gives them.
``per-component-jit``
    ``per-component + jit`` where ``jit`` (MiB) is added only to AMP-fp16 jobs whose largest
    depthwise-conv input exceeds ``jit_min_hw`` pixels (``TraceResult.depthwise_max_hw``).
    ``jit`` = largest excess non-allocator memory among such rows of the fitting set;
    ``jit_min_hw`` = the largest such input size seen WITHOUT the excess (sizes beyond what is
    known to be safe are padded). With no such rows in the fitting set, ``jit`` = 0.
``per-precision-jit``
    ``per-component-jit`` with one multiplier for fp32 jobs (``analytic_mult``) and one for
    mixed-precision jobs (``amp_mult``, AMP fp16 and bf16), each the smallest leaving at most
    ``target`` of its own rows underestimated. The two traces differ: fp32 runs on the meta
    device, AMP on fake CPU tensors under CPU autocast, whose casts and caches are not CUDA's
    (validation fp32 rows need x1.16 at their 99th percentile, AMP rows x1.25 and more; with the
    cuDNN workspaces replayed, 2026-11-24).

The package ships only the chosen form (``per-precision-jit``, ``combine.calibrated_bound``);
:func:`bound_of_form` here computes every candidate and uses the package's function for that form.

Margins are fitted on one row set (validation families in ``train.py``): for each grid value
of the additive terms the multiplier is the smallest (to 0.005) that leaves at most ``target``
of the rows underestimated, and the combination with the least median over-reservation wins.
The form is then chosen the same way among the candidates. Deterministic for the same rows.
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Dict, List, Optional, Sequence, Tuple

from slurm_coloc.estimate.combine import BOUND_FORM, calibrated_bound

FORMS = ("scalar", "per-component", "per-component-sqrt", "per-component-jit", "per-precision-jit")
AMP_PRECISIONS = ("amp-fp16", "bf16")
ADD_GRID = (0.0, 16.0, 32.0, 48.0, 64.0, 96.0, 128.0, 192.0, 256.0, 384.0, 512.0)
SQRT_GRID = (0.0, 2.0, 4.0, 8.0, 16.0)
BASELINE_NONALLOC_Q = 0.5  # "normal" non-allocator memory: the median of the fitting rows


def bound_of_form(cal: Dict[str, Any], analytic_mib: float, context_mib: float, libs_mib: float,
                  precision: Optional[str] = None, depthwise_max_hw: int = 0) -> float:
    """The upper bound (MiB) of ``cal["form"]`` (see the module docstring) from the analytic figure.

    ``per-precision-jit`` is computed by the package's ``combine.calibrated_bound`` (the shipped
    code path); the other forms here. ``R = max(0, analytic - context - libs)``.

    Raises:
        ValueError: unknown form.
    """
    form = cal.get("form", "scalar")
    if form == BOUND_FORM:
        full = {"jit_mib": 0.0, "jit_min_hw": 0, **cal}
        return calibrated_bound(full, analytic_mib, context_mib, libs_mib, precision=precision or "fp32",
                                depthwise_max_hw=depthwise_max_hw)
    mult, add = float(cal["analytic_mult"]), float(cal["analytic_add_mib"])
    if form == "scalar":
        return analytic_mib * mult + add
    reserved = max(0.0, analytic_mib - context_mib - libs_mib)
    out = context_mib + libs_mib + add + reserved * mult
    if form == "per-component-sqrt":
        out += float(cal.get("sqrt_k", 0.0)) * math.sqrt(reserved)
    elif form == "per-component-jit":
        jit = float(cal.get("jit_mib", 0.0))
        if jit > 0 and precision == "amp-fp16" and int(depthwise_max_hw) > int(cal.get("jit_min_hw", 0)):
            out += jit
    elif form != "per-component":
        raise ValueError(f"unknown bound form {form!r}")
    return out


def _bound(cal: Dict[str, Any], row: Dict[str, Any], context: float) -> float:
    """Bound of one data row under ``cal`` (:func:`bound_of_form`)."""
    libs = float(cal["libs_mib"])
    return bound_of_form(cal, context + libs + row["sim_reserved_mib"], context, libs,
                         precision=row.get("precision"), depthwise_max_hw=row.get("depthwise_max_hw", 0))


def summary(rows: Sequence[Dict[str, Any]], est: Sequence[float]) -> Dict[str, float]:
    """``rows``, ``under`` (fraction est < actual), ``median_over`` and ``p90_over`` ((est-a)/a)."""
    over = sorted((e - r["actual_mib"]) / r["actual_mib"] for r, e in zip(rows, est))
    if not over:
        return {"rows": 0, "under": 0.0, "median_over": 0.0, "p90_over": 0.0}
    return {"rows": len(over), "under": sum(1 for o in over if o < 0) / len(over),
            "median_over": statistics.median(over),
            "p90_over": over[min(len(over) - 1, int(0.9 * (len(over) - 1) + 0.5))]}


def evaluate(cal: Dict[str, Any], rows: Sequence[Dict[str, Any]], context: float) -> Dict[str, float]:
    """:func:`summary` of the calibrated bound ``cal`` on ``rows``."""
    return summary(rows, [_bound(cal, r, context) for r in rows])


def _smallest_mult(rows: Sequence[Dict[str, Any]], fixed: Sequence[float], target: float) -> float:
    """Smallest multiplier (to 0.005, >= 1) on ``R`` with ``fixed + R*m < actual`` for <= ``target``."""
    ratios = sorted((r["actual_mib"] - f) / max(r["sim_reserved_mib"], 1e-6) for r, f in zip(rows, fixed))
    k = min(len(ratios) - 1, int(math.floor(len(ratios) * (1 - target))))
    return max(1.0, math.ceil(ratios[k] * 200 - 1e-9) / 200)


def jit_terms(rows: Sequence[Dict[str, Any]], nonalloc_base: float) -> Tuple[float, int]:
    """(``jit`` MiB, ``jit_min_hw``) from the fitting rows (see the module docstring)."""
    fp16 = [(r["depthwise_max_hw"], r["nonalloc_mib"] - nonalloc_base) for r in rows
            if r.get("precision") == "amp-fp16" and r.get("depthwise_max_hw", 0) > 0]
    hit = [(hw, e) for hw, e in fp16 if e > 64.0]  # 64 MiB: well above the 742-764 MiB spread
    if not hit:
        return 0.0, 0
    first_hit = min(hw for hw, _ in hit)
    safe = [hw for hw, e in fp16 if e <= 64.0 and hw < first_hit]
    jit = float(math.ceil(max(e for _, e in hit) / 16) * 16)
    return jit, (max(safe) if safe else 0)


def fit_form(form: str, rows: Sequence[Dict[str, Any]], libs: float, context: float,
             target: float) -> Dict[str, Any]:
    """Margins of ``form`` fitted on ``rows`` (least median over-reservation, <= ``target`` under)."""
    if form not in FORMS:
        raise ValueError(f"unknown bound form {form!r}")
    base: Dict[str, Any] = {"form": form, "libs_mib": round(libs, 1)}
    if form in ("per-component-jit", "per-precision-jit"):
        nonalloc = statistics.median(r["nonalloc_mib"] for r in rows) if rows else context + libs
        base["jit_mib"], base["jit_min_hw"] = jit_terms(rows, nonalloc)
    best: Optional[Tuple[float, Dict[str, Any]]] = None
    for add in ADD_GRID:
        for k in (SQRT_GRID if form == "per-component-sqrt" else (0.0,)):
            cal = dict(base, analytic_add_mib=add, analytic_mult=1.0)
            if form == "per-component-sqrt":
                cal["sqrt_k"] = k
            if form == "scalar":
                ana = [context + libs + r["sim_reserved_mib"] for r in rows]
                ratios = sorted((r["actual_mib"] - add) / a for r, a in zip(rows, ana))
                i = min(len(ratios) - 1, int(math.floor(len(ratios) * (1 - target))))
                cal["analytic_mult"] = max(1.0, math.ceil(ratios[i] * 200 - 1e-9) / 200)
            elif form == "per-precision-jit":  # one multiplier per precision class, each fitted alone
                groups = ([r for r in rows if r.get("precision") not in AMP_PRECISIONS],
                          [r for r in rows if r.get("precision") in AMP_PRECISIONS])
                mults = []
                for g in groups:
                    fixed = [_bound(dict(cal, analytic_mult=0.0, amp_mult=0.0), r, context) for r in g]
                    mults.append(_smallest_mult(g, fixed, target) if g else None)
                known = [m for m in mults if m is not None] or [1.0]
                cal["analytic_mult"] = mults[0] if mults[0] is not None else max(known)
                cal["amp_mult"] = mults[1] if mults[1] is not None else max(known)
            else:  # everything but R*mult is fixed for a row: bound with mult 0 minus nothing
                fixed = [_bound(dict(cal, analytic_mult=0.0), r, context) for r in rows]
                cal["analytic_mult"] = _smallest_mult(rows, fixed, target)
            med = evaluate(cal, rows, context)["median_over"]
            if best is None or med < best[0] - 1e-12:
                best = (med, cal)
    assert best is not None
    return best[1]


def choose_form(rows: Sequence[Dict[str, Any]], libs: float, context: float, target: float,
                forms: Sequence[str] = FORMS) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    """Fit every form on ``rows``; return (winner, [per-form fit + summary]).

    The winner has the least median over-reservation among forms with under <= ``target``
    on ``rows`` (ties: the earlier, simpler form in ``FORMS``).
    """
    table = []
    for form in forms:
        cal = fit_form(form, rows, libs, context, target)
        table.append({"cal": cal, **evaluate(cal, rows, context)})
    ok = [t for t in table if t["under"] <= target + 1e-12] or table
    win = min(ok, key=lambda t: t["median_over"])
    return dict(win["cal"]), table


def libs_of(rows: Sequence[Dict[str, Any]], context: float) -> float:
    """Library overhead (MiB): median non-allocator memory of ``rows`` minus the CUDA context."""
    return float(statistics.median(r["nonalloc_mib"] for r in rows)) - context


def leave_one_family_out(rows: Sequence[Dict[str, Any]], form: str, context: float,
                         target: float) -> Dict[str, Any]:
    """Refit ``form`` (libs and margins) without each family in turn and test on that family.

    Returns pooled ``under``/``median_over``/``p90_over`` over all left-out rows and per family.
    """
    fams = sorted({r["family"] for r in rows})
    pooled_rows: List[Dict[str, Any]] = []
    pooled_est: List[float] = []
    per: Dict[str, Dict[str, float]] = {}
    for fam in fams:
        fit = [r for r in rows if r["family"] != fam]
        out = [r for r in rows if r["family"] == fam]
        cal = fit_form(form, fit, libs_of(fit, context), context, target)
        est = [_bound(cal, r, context) for r in out]
        per[fam] = summary(out, est)
        pooled_rows += out
        pooled_est += est
    return {"form": form, "families": fams, "pooled": summary(pooled_rows, pooled_est), "per_family": per}
