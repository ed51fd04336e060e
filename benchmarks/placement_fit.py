"""Fit coloc-placer's intensity predictor (``slurm_coloc/placement/intensity.py``) to measured runs alone.

Usage:
  python3 -m benchmarks.placement_fit EXCLUSIVE.json... [--profile PROFILE.json] [--out calibration.json]
                                     [--by-model] [--feature proxy|flops]
Input: the exclusive pass files of ``benchmarks/device/placement_bench.py`` (``pile-exclusive-part1.json``,
``stream-exclusive.json``, ...; other passes are skipped), or the single ``placement_bench.json`` of the first run:
every exclusive job with its workload and its measured activity alone (``alone_activity``: SMACT/SMOCC/DRAMA
fractions, means over the samples of its run that show work, from the sampler), and a profile of the models
(``--profile``, default the one the plan was made from, ``placement_plan.json``'s ``source``): ``gflop_per_step``
(FLOPs of one training step, ``torch.utils.flop_counter``), batch and input shape; precision fp32.
``--feature`` picks x: ``proxy`` (default) = batch x input elements x 3e-6, what ``intensity.features`` computes
from a job's spec today (coloc-sbatch's comment carries no FLOPs yet), or ``flops`` = the measured GFLOP per step,
for comments that carry ``flops_per_step``. Fit (least squares):
  SMACT = smact_min + (smact_max - smact_min) * x / (x + x_half_gflop), x = GFLOP per step x precision factor:
          for each x_half on a log grid (0.1 .. 10^5 GFLOP) the model is linear in (smact_min, smact_max -
          smact_min); the x_half of least squared error wins; both ends clamped to 0..1 (smact_min <= smact_max).
  SMOCC = SMACT x smocc_per_smact, DRAMA = SMACT x drama_per_smact (least squares through the origin).
  unknown = mean measured activity (the prediction for a job without features).
  ``--by-model``: also the measured mean per workload (used before the curve when a job's spec names the model).
Prints measurement vs prediction per job (fitted and the current packaged calibration) and the mean absolute
errors; writes a calibration file that ``intensity.load_calibration`` reads (``placement_calibration_path``; the
packaged one is ``slurm_coloc/placement/calibration.json``).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from slurm_coloc.placement import intensity
from slurm_coloc.placement.policies import Activity


def proxy_gflop(row: Dict[str, Any]) -> Optional[float]:
    """``intensity.features``' proxy for a profile row: batch x input elements x 3e-6 (None without both)."""
    shape, batch = row.get("input_shape"), row.get("batch")
    if not isinstance(shape, list) or not isinstance(batch, int):
        return None
    return batch * math.prod(int(d) for d in shape) * 3e-6


PLAN = Path(__file__).resolve().parent / "device" / "placement_plan.json"


def exclusive_jobs(files: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Every job of the exclusive passes in ``files``: pass files (``policy`` exclusive) and the first run's
    ``placement_bench.json`` (``scenarios.<s>.exclusive.jobs``); other passes contribute nothing."""
    out: List[Dict[str, Any]] = []
    for f in files:
        if f.get("policy") == "exclusive":
            out += f.get("jobs") or []
        for scen in (f.get("scenarios") or {}).values():
            if isinstance(scen, dict) and isinstance(scen.get("exclusive"), dict):
                out += scen["exclusive"].get("jobs") or []
    return out


def samples(bench: Dict[str, Any], feature: str = "flops", files: Optional[Sequence[Dict[str, Any]]] = None
            ) -> List[Dict[str, Any]]:
    """``[{"workload", "gflop", "smact", "smocc", "drama"}]`` of every exclusive job with measured activity;
    ``gflop`` is x of the fit (``feature``: ``flops`` measured, ``proxy`` as ``proxy_gflop``). ``bench["profile"]``
    holds the profile rows; the jobs come from ``files`` (default ``[bench]``)."""
    prof = bench.get("profile") or {}
    out = []
    for scen in [{"exclusive": {"jobs": exclusive_jobs(files if files is not None else [bench])}}]:
        for j in (scen.get("exclusive") or {}).get("jobs", []):
            act = j.get("alone_activity") or {}
            row = prof.get(j["workload"]) or {}
            gflop = row.get("gflop_per_step") if feature == "flops" else proxy_gflop(row)
            if act.get("smact") is None or gflop is None or j.get("state", "COMPLETED") != "COMPLETED":
                continue  # a cancelled run's activity is not the job's
            out.append({"workload": j["workload"], "gflop": float(gflop), "smact": act["smact"],
                        "smocc": act.get("smocc") or 0.0, "drama": act.get("drama") or 0.0,
                        "proxy": proxy_gflop(row), "feature": feature})
    return out


def profile_rows(path: Optional[str], files: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Profile rows by workload: ``path`` (a ``placement_bench.json`` with ``profile`` or a ``profile.json`` with
    ``rows``); else the first input file that has a ``profile``; else the plan's source profile."""
    if path is None:
        own = next((f["profile"] for f in files if isinstance(f.get("profile"), dict) and f["profile"]), None)
        if own is not None:
            return own
        src = json.loads(PLAN.read_text()).get("source", "").removeprefix("profile: ")
        path = str(Path(__file__).resolve().parent.parent / src)
    data = json.loads(Path(path).read_text())
    rows = data.get("profile") or data.get("rows")
    if not isinstance(rows, dict):
        raise ValueError(f"{path}: no profile rows")
    return rows


def fit_curve(xs: Sequence[float], ys: Sequence[float]) -> Tuple[float, float, float, float]:
    """Least-squares ``(smact_min, smact_max, x_half, sse)`` of the saturating curve (module docstring).

    Raises:
        ValueError: fewer than 2 points.
    """
    if len(xs) < 2:
        raise ValueError("need at least 2 measured jobs to fit")
    best: Optional[Tuple[float, float, float, float]] = None
    for k in range(0, 121):
        xh = 10 ** (-1 + k * 6 / 120)
        us = [x / (x + xh) for x in xs]
        mu, my = statistics.fmean(us), statistics.fmean(ys)
        var = sum((u - mu) ** 2 for u in us)
        slope = sum((u - mu) * (y - my) for u, y in zip(us, ys)) / var if var > 1e-12 else 0.0
        lo = min(1.0, max(0.0, my - slope * mu))
        hi = min(1.0, max(lo, lo + slope))
        sse = sum((lo + (hi - lo) * u - y) ** 2 for u, y in zip(us, ys))
        if best is None or sse < best[3] - 1e-12:
            best = (lo, hi, xh, sse)
    assert best is not None
    return best


def ratio(num: Sequence[float], den: Sequence[float]) -> float:
    """Least squares ``num ~ r * den`` through the origin (0 when every ``den`` is 0)."""
    d = sum(v * v for v in den)
    return sum(a * b for a, b in zip(num, den)) / d if d > 0 else 0.0


def fit(rows: Sequence[Dict[str, Any]], by_model: bool = False, source: str = "") -> Dict[str, Any]:
    # x is whichever feature ``samples`` put in ``gflop``; the calibration's x_half is in the same unit
    """The calibration dict (``intensity.load_calibration``'s format) fitted to ``rows`` (``samples``)."""
    lo, hi, xh, _ = fit_curve([r["gflop"] for r in rows], [r["smact"] for r in rows])
    smact = [r["smact"] for r in rows]
    cal: Dict[str, Any] = {
        "source": source or f"benchmarks/placement_fit.py over {len(rows)} jobs alone",
        "smact_min": round(lo, 4), "smact_max": round(hi, 4), "x_half_gflop": round(xh, 3),
        "precision_factor": {"fp32": 1.0, "amp": 0.6, "fp16": 0.6, "bf16": 0.6},
        "smocc_per_smact": round(ratio([r["smocc"] for r in rows], smact), 4),
        "drama_per_smact": round(ratio([r["drama"] for r in rows], smact), 4),
        "unknown": {k: round(statistics.fmean(r[k] for r in rows), 4) for k in ("smact", "smocc", "drama")},
        "by_model": {},
    }
    if rows and rows[0].get("feature") == "flops":
        # a job whose comment carries no FLOPs is predicted from the proxy scaled to FLOPs
        # (intensity.Calibration.proxy_to_flops): the median measured/proxy ratio over the workloads
        ratios = sorted({r["workload"]: r["gflop"] / r["proxy"] for r in rows if r.get("proxy")}.values())
        cal["feature"] = "flops"
        cal["proxy_to_flops"] = round(statistics.median(ratios), 3) if ratios else 1.0
    if by_model:
        names = sorted({r["workload"] for r in rows})
        cal["by_model"] = {n: {k: round(statistics.fmean(r[k] for r in rows if r["workload"] == n), 4)
                               for k in ("smact", "smocc", "drama")} for n in names}
    return cal


def predict(cal: intensity.Calibration, gflop: float) -> Activity:
    return intensity.predict(intensity.Features(gflop, None, None, "fp32", None), cal)


def report(rows: Sequence[Dict[str, Any]], fitted: intensity.Calibration, current: intensity.Calibration) -> str:
    """Per job: measured and predicted SMACT/SMOCC/DRAMA (%), fitted and current; then the mean absolute errors."""
    lines = [f"{'workload':<26}{'x (GFLOP)':>11}{'SMACT meas':>11}{'fit':>7}{'current':>8}"
             f"{'SMOCC meas':>11}{'fit':>7}{'DRAMA meas':>11}{'fit':>7}"]
    err: Dict[str, List[float]] = {"smact_fit": [], "smact_current": [], "smocc_fit": [], "drama_fit": []}
    for r in rows:
        f, c = predict(fitted, r["gflop"]), predict(current, r["gflop"])
        err["smact_fit"].append(abs(f.smact - r["smact"]))
        err["smact_current"].append(abs(c.smact - r["smact"]))
        err["smocc_fit"].append(abs(f.smocc - r["smocc"]))
        err["drama_fit"].append(abs(f.drama - r["drama"]))
        lines.append(f"{r['workload']:<26}{r['gflop']:>11.1f}{100 * r['smact']:>11.1f}{100 * f.smact:>7.1f}"
                     f"{100 * c.smact:>8.1f}{100 * r['smocc']:>11.1f}{100 * f.smocc:>7.1f}{100 * r['drama']:>11.1f}"
                     f"{100 * f.drama:>7.1f}")
    lines.append("mean absolute error (percentage points): " + ", ".join(
        f"{k} {100 * statistics.fmean(v):.1f}" for k, v in err.items() if v))
    if fitted.feature == "flops":
        # what a job without flops_per_step in its comment gets: the proxy x proxy_to_flops on the same curve
        proxy = [abs(intensity.predict(intensity.Features(r["proxy"], None, None, "fp32", None, True),
                                       fitted).smact - r["smact"]) for r in rows if r.get("proxy") is not None]
        if proxy:
            lines.append(f"jobs without FLOPs in the comment (proxy x {fitted.proxy_to_flops:g}): smact_fit "
                         f"{100 * statistics.fmean(proxy):.1f} pp over {len(proxy)} jobs")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench_json", nargs="+", help="exclusive pass files (or the first run's placement_bench.json)")
    ap.add_argument("--profile", default=None, help="profile rows (default: the plan's source, else the input's)")
    ap.add_argument("--out", default="calibration.json")
    ap.add_argument("--by-model", action="store_true", help="also write the measured mean per workload")
    ap.add_argument("--feature", choices=("proxy", "flops"), default="proxy",
                    help="x of the curve: the spec proxy coloc-placer uses today, or measured FLOPs")
    a = ap.parse_args(argv)
    try:
        files = [json.loads(Path(p).read_text()) for p in a.bench_json]
        bench = {"profile": profile_rows(a.profile, files), "fake": any(f.get("fake") for f in files)}
        rows = samples(bench, a.feature, files)
        if bench.get("fake"):
            print("placement_fit: note: the input comes from a fake-GPU run (no real activity)", file=sys.stderr)
        cal = fit(rows, a.by_model, f"benchmarks/placement_fit.py over {len(rows)} jobs alone, x = {a.feature}")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        print(f"placement_fit: error: {exc}", file=sys.stderr)
        return 1
    current = intensity.load_calibration(None)  # before writing: --out may be the packaged file itself
    try:  # the sharing model's fit (placement_share_fit.py) lives in the same file: keep it
        old = json.loads(Path(a.out).read_text())
        cal.update({k: v for k, v in old.items() if k.startswith("share_")})  # share_* and share_by_gpu_*
    except (OSError, ValueError, AttributeError):
        pass
    Path(a.out).write_text(json.dumps(cal, indent=1) + "\n")
    fitted = intensity.load_calibration(a.out)
    print(report(rows, fitted, current))
    print(f"wrote {a.out}: SMACT {100 * cal['smact_min']:.1f}..{100 * cal['smact_max']:.1f} %, "
          f"x_half {cal['x_half_gflop']} GFLOP, SMOCC/SMACT {cal['smocc_per_smact']}, "
          f"DRAMA/SMACT {cal['drama_per_smact']}")
    return 0 if all(math.isfinite(v) for v in (cal["smact_min"], cal["smact_max"])) else 1


if __name__ == "__main__":
    sys.exit(main())
