"""``coloc-report plot``: PNG timelines per GPU and an estimate-vs-measured scatter (matplotlib, Agg
backend)."""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

from slurm_coloc.errors import ColocError
from slurm_coloc.report.summarize import JobView, Report
from slurm_coloc.report.views import Filters, Viewer
from slurm_coloc.store import report_queries as rq

MAX_POINTS = 1500  # buckets per timeline; the SQL folds samples to this many
MAX_LABELS = 80  # job bars are labelled (job id, user) up to this many jobs per GPU
LANES = 6
# width of one 7-pt label character as a share of the 12-inch time axis (DejaVu Sans)
LABEL_CHAR_FRAC = 0.0065
FIT_PAD_FRAC = 0.03  # the fitted time axis extends this share of the data's span on each side


def _plt():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _dt(ts: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ts)


def timeline(node: str, gpu: int, series: Sequence[Tuple[float, object, object]], jobs: Sequence[JobView],
             viewer: Viewer, t0: float, t1: float, total_mib: object, path: Path) -> Path:
    """Write ``timeline_figure`` to ``path`` (PNG) and return ``path``."""
    plt = _plt()
    fig = timeline_figure(node, gpu, series, jobs, viewer, t0, t1, total_mib)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _plot_usage(ax_mem: Any, ax_sm: Any, series: Sequence[Tuple[float, object, object]],
                total_mib: object) -> None:
    """The memory (GiB, with the GPU's total as a dashed line) and SM activity (%) panels of
    ``timeline_figure``; ``series``: ``(t, used MiB, SM activity %)``, None where not recorded."""
    xs = [_dt(t) for t, _, _ in series]
    mem = [None if m is None else float(m) / 1024 for _, m, _ in series]  # type: ignore[arg-type]
    sm = [None if s is None else float(s) for _, _, s in series]  # type: ignore[arg-type]
    ax_mem.plot(xs, [m if m is not None else float("nan") for m in mem], color="tab:blue", lw=1)
    if total_mib:
        ax_mem.axhline(float(total_mib) / 1024,  # type: ignore
                       color="grey", ls="--", lw=0.8, label="GPU memory")
        ax_mem.legend(loc="upper right", fontsize=8)
    ax_mem.set_ylabel("memory used (GiB)")
    ax_sm.plot(xs, [s if s is not None else float("nan") for s in sm], color="tab:green", lw=1)
    ax_sm.set_ylim(0, 100)
    ax_sm.set_ylabel("SM activity (%)")
    if not series:
        for ax in (ax_mem, ax_sm):
            ax.text(0.5, 0.5, "no samples recorded in this window", transform=ax.transAxes, ha="center",
                    va="center", color="grey")
    elif all(s is None for s in sm):
        ax_sm.text(0.5, 0.5, "SM activity not recorded (GPM needs Hopper or newer)",
                   transform=ax_sm.transAxes,
                   ha="center", va="center", color="grey")


def _plot_job_lanes(ax_jobs: Any, node: str, gpu: int, jobs: Sequence[JobView], viewer: Viewer, t0: float,
                    t1: float) -> None:
    """The job panel of ``timeline_figure``: each job on GPU ``gpu`` of ``node`` as a bar over its span within
    [t0, t1] (epoch s), in the first free lane, labelled when the panel has room (``timeline_figure``)."""
    mine = [j for j in jobs if (node, gpu) in j.gpu_list and j.start_ts is not None]
    label_jobs = len(mine) <= MAX_LABELS
    bars: Dict[str, Tuple[List[float], List[object], List[object]]] = {}
    lane_free = [t0] * LANES  # per lane: the time up to which its bar or label reaches
    hidden = 0
    span_s = max(t1 - t0, 1e-6)
    for j in sorted(mine, key=lambda j: j.start_ts or 0):
        s = max(j.start_ts or t0, t0)
        e = min(j.end_ts if j.end_ts is not None else t1, t1)
        if e <= s:
            continue
        label = ""
        if label_jobs:
            label = f" {j.job_id} {j.user or ''}" if viewer.sees_all or j.user == viewer.name else " other"
        reach = max(e, s + len(label) * LABEL_CHAR_FRAC * span_s) if label else e
        free = [k for k in range(LANES) if lane_free[k] <= s]
        if free:
            lane = free[0]
        else:  # every lane busy: the bar goes where it overlaps least, without a label
            lane = min(range(LANES), key=lambda k: lane_free[k])
            if label:
                hidden += 1
            label, reach = "", e
        lane_free[lane] = max(lane_free[lane], reach)
        color = "tab:red" if j.oom else ("tab:orange" if j.waste else "tab:purple")
        ys, widths, lefts = bars.setdefault(color, ([], [], []))
        ys.append(lane)
        widths.append(_dt(e) - _dt(s))
        lefts.append(_dt(s))
        if label:
            ax_jobs.text(_dt(s), lane, label, va="center", fontsize=7, clip_on=True)
    for color, (ys, widths, lefts) in bars.items():
        ax_jobs.barh(ys, widths, left=lefts, height=0.7, color=color, alpha=0.7)
    ax_jobs.set_ylim(-0.6, LANES - 0.4)
    if mine and not label_jobs:
        ax_jobs.set_title(f"{len(mine)} jobs (too many to label; narrow the window with --since/--until)",
                          fontsize=8)
    elif hidden:
        ax_jobs.set_title(f"{hidden} of {len(mine)} job labels left out where bars overlap (narrow the "
                          "window)", fontsize=8)
    ax_jobs.set_yticks([])
    ax_jobs.set_ylabel("jobs")
    if not mine:
        ax_jobs.text(0.5, 0.5, "no job on this GPU in this window", transform=ax_jobs.transAxes, ha="center",
                     va="center", color="grey")


def timeline_figure(node: str, gpu: int, series: Sequence[Tuple[float, object, object]],
                    jobs: Sequence[JobView],
                    viewer: Viewer, t0: float, t1: float, total_mib: object) -> Any:
    """One GPU (NVML index): memory used (GiB) and SM activity (%) over [t0, t1] (epoch s), job spans as bars
    below, each labelled (job id, user) in the first of ``LANES`` lanes where neither its bar nor its label
    meets another's; a job with no free lane gets an unlabelled bar, counted in the panel's title.

    ``series``: ``(epoch s, memory used MiB, SM activity %)``, None where not recorded. Other users' jobs are
    labelled ``other`` unless ``viewer.sees_all``. ``total_mib`` (MiB) is a dashed line; falsy: not drawn. The
    caller saves and closes the figure.
    """
    plt = _plt()
    fig, (ax_mem, ax_sm, ax_jobs) = plt.subplots(3, 1, figsize=(12, 7), sharex=True,
                                                 gridspec_kw={"height_ratios": [3, 3, 2]})
    _plot_usage(ax_mem, ax_sm, series, total_mib)
    _plot_job_lanes(ax_jobs, node, gpu, jobs, viewer, t0, t1)
    ax_jobs.set_xlim(_dt(t0), _dt(t1))
    fig.suptitle(f"{node} GPU {gpu}: memory and SM activity, {_dt(t0):%Y-%m-%d %H:%M} to "
                 f"{_dt(t1):%Y-%m-%d %H:%M}"
                 f"  (bars: jobs; red = OOM, orange = wasteful)")
    fig.autofmt_xdate()
    fig.tight_layout()
    return fig


def scatter(jobs: Sequence[JobView], path: Path) -> Path:
    """Estimate (x) vs measured peak (y) in GiB per job with both, the y = x line, OOM deaths in red; PNG to
    ``path``, returned.
    """
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 7))
    pts = [(j.estimate_mib / 1024, j.peak_mem_mib / 1024, j.oom) for j in jobs
           if j.estimate_mib is not None and j.peak_mem_mib is not None]
    if pts:
        top = max(max(x, y) for x, y, _ in pts) * 1.1 or 1.0
        ax.plot([0, top], [0, top], color="grey", ls="--", lw=1, label="estimate = peak")
        ok = [(x, y) for x, y, o in pts if not o]
        bad = [(x, y) for x, y, o in pts if o]
        if ok:
            ax.scatter(*zip(*ok), s=18, color="tab:blue", label="job")
        if bad:
            ax.scatter(*zip(*bad), s=30, color="tab:red", marker="x", label="OOM death")
        ax.set_xlim(0, top)
        ax.set_ylim(0, top)
        ax.text(0.03, 0.97, "above the line: under-estimated\nbelow: over-estimated (memory left unused)",
                transform=ax.transAxes, va="top", fontsize=8, color="dimgrey")
        ax.legend(loc="lower right")
    else:
        ax.text(0.5, 0.5, "no job has both an estimate and a measured peak", transform=ax.transAxes,
                ha="center")
    ax.set_xlabel("estimated peak GPU memory (GiB)")
    ax.set_ylabel("measured peak GPU memory (GiB)")
    ax.set_title(f"estimate vs measured peak ({len(pts)} jobs)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def fit_window(w0: float, w1: float, sample_ts: Sequence[float], spans: Sequence[Tuple[float, float]]
               ) -> Tuple[float, float]:
    """``(t0, t1)`` (Unix s) within ``[w0, w1]``: the extent of the samples and job spans inside the window,
    padded by ``FIT_PAD_FRAC`` of that extent (at least 30 s); the window itself without data.
    """
    pts = [t for t in sample_ts if w0 <= t <= w1]
    pts += [min(max(x, w0), w1) for s, e in spans if e >= w0 and s <= w1 for x in (s, e)]
    if not pts:
        return w0, w1
    lo, hi = min(pts), max(pts)
    pad = max((hi - lo) * FIT_PAD_FRAC, 30.0)
    return max(w0, lo - pad), min(w1, hi + pad)


_Series = Dict[Tuple[str, int], List[Tuple[float, object, object]]]


@dataclass(frozen=True)
class PlotWindow:
    """The timelines' axis ``t0``..``t1`` (Unix s), and per (node, GPU index) the series ``[(ts, mem MiB, SM
    activity %)]`` and the memory total (MiB)."""

    t0: float
    t1: float
    per_gpu: _Series
    totals: Dict[Tuple[str, int], float]


def plot_window(report: Report, jobs: Sequence[JobView], flt: Filters, now: float) -> PlotWindow:
    """The axis (``fit_window``) and series, fetched again at the finer resolution when the fitted axis is
    under half the window. Open window ends (Unix s): the first job's start, or a day before ``now``, and
    ``now``."""
    w0 = flt.since if flt.since is not None else min((j.start_ts for j in jobs if j.start_ts),
                                                     default=now - 86400)
    w1 = flt.until if flt.until is not None else now
    per_gpu, totals = _series(report, flt, w0, w1)
    spans = [(j.start_ts, j.end_ts if j.end_ts is not None else now) for j in jobs if j.start_ts is not None]
    t0, t1 = fit_window(w0, w1, [t for pts in per_gpu.values() for t in (pts[0][0], pts[-1][0])], spans)
    if (t1 - t0) < 0.5 * (w1 - w0):  # coarse buckets start early: fit again on the finer series
        per_gpu, totals = _series(report, flt, t0, t1)
        t0, t1 = fit_window(t0, t1, [t for pts in per_gpu.values() for t in (pts[0][0], pts[-1][0])], spans)
    return PlotWindow(t0, t1, per_gpu, totals)


def _series(report: Report, flt: Filters, t0: float,
            t1: float) -> Tuple[_Series, Dict[Tuple[str, int], float]]:
    bucket_s = max((t1 - t0) / MAX_POINTS, 1.0)
    per_gpu: _Series = {}
    totals: Dict[Tuple[str, int], float] = {}
    for node, db in sorted(report.node_dbs.items()):
        if flt.nodes and node not in flt.nodes:
            continue
        for g, t, m, s in rq.gpu_series(db, t0, t1, bucket_s):
            per_gpu.setdefault((node, g), []).append((t, m, s))
        totals.update({(node, g): m for g, m in rq.gpu_totals_mib(db).items()})
    return per_gpu, totals


def draw_all(report: Report, jobs: Sequence[JobView], flt: Filters, viewer: Viewer, out_dir: str,
             now: float) -> List[Path]:
    """Write ``timeline-<node>-gpu<i>.png`` for every GPU with samples or jobs, and ``estimate-vs-peak.png``,
    into ``out_dir`` (created if missing); the paths written. ``now`` (epoch s) ends an open window and
    running jobs.

    Raises:
        ColocError: the output directory cannot be created or written.
    """
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        if not os.access(out, os.W_OK):
            raise OSError("not writable")
    except OSError as exc:
        raise ColocError(f"cannot write plots to {out_dir!r}: {exc}") from None
    w = plot_window(report, jobs, flt, now)
    keys = set(w.per_gpu) | {k for j in jobs for k in j.gpu_list if not flt.nodes or k[0] in flt.nodes}
    files = [timeline(n, g, w.per_gpu.get((n, g), []), jobs, viewer, w.t0, w.t1, w.totals.get((n, g)),
                      out / f"timeline-{n}-gpu{g}.png") for n, g in sorted(keys)]
    files.append(scatter(jobs, out / "estimate-vs-peak.png"))
    return files


def advise_timeline(job: JobView, series: Sequence[Dict[str, object]], path: Path) -> Path:
    """One job over its span: SM activity and occupancy, tensor and DRAM activity (%), the job's GPU memory
    against its grant (GiB), its findings above the panels (``coloc-report advise``); several GPUs of a job
    are one series per metric each. PNG to ``path``, returned.
    """
    plt = _plt()
    fig, (ax_sm, ax_tc, ax_mem) = plt.subplots(3, 1, figsize=(12, 8), sharex=True,
                                               gridspec_kw={"height_ratios": [3, 2, 2]})
    keys = sorted({(str(r["node"]), int(r["gpu"])) for r in series})  # type: ignore[call-overload]

    def line(ax, key, metric, color, label, scale=1.0):  # type: ignore[no-untyped-def]
        rows = [r for r in series if (r["node"], r["gpu"]) == key]
        xs = [_dt(float(r["ts"])) for r in rows]  # type: ignore[arg-type]
        ys = [float("nan") if r.get(metric) is None else float(r[metric]) * scale
              for r in rows]  # type: ignore
        ax.plot(xs, ys, color=color, lw=1, label=label if key == keys[0] else None)

    for key in keys:
        line(ax_sm, key, "smact_pct", "tab:green", "SM activity")
        line(ax_sm, key, "smocc_pct", "tab:olive", "SM occupancy")
        line(ax_tc, key, "tensor_pct", "tab:purple", "tensor-core activity")
        line(ax_tc, key, "dram_bw_pct", "tab:brown", "DRAM bandwidth")
        line(ax_mem, key, "job_mem_mib", "tab:blue", "job's GPU memory", 1 / 1024)
    for ax, label in ((ax_sm, "SM (%)"), (ax_tc, "tensor / DRAM (%)")):
        ax.set_ylim(0, 100)
        ax.set_ylabel(label)
    if job.requested_mib:
        ax_mem.axhline(job.requested_mib / 1024, color="grey", ls="--", lw=1, label="grant (request)")
    ax_mem.set_ylabel("memory (GiB)")
    ax_mem.set_ylim(bottom=0)
    for ax in (ax_sm, ax_tc, ax_mem):
        if series:
            ax.legend(loc="upper right", fontsize=8)
        else:
            ax.text(0.5, 0.5, "no samples recorded for this job", transform=ax.transAxes, ha="center",
                    va="center", color="grey")
    if job.start_ts is not None:
        end = job.end_ts if job.end_ts is not None else max((float(r["ts"]) for r in series),  # type: ignore
                                                            default=job.start_ts + 60)
        ax_mem.set_xlim(_dt(job.start_ts), _dt(max(end, job.start_ts + 1)))
    lines = [x for i, f in enumerate(job.findings, 1)
             for x in (f"{i}. {f['name']}: {f['evidence']}", f"    try: {f['suggestion']}")] \
        or ["no finding: nothing in the recorded figures points at a problem"]
    text = "\n".join(lines)
    fig.suptitle(f"job {job.job_id} ({job.user or '?'}, {job.name or '-'}): what its GPU did", fontsize=11)
    fig.text(0.01, 0.955, text, fontsize=8, va="top", ha="left", wrap=True,
             color="tab:red" if job.findings else "dimgrey")
    fig.autofmt_xdate()
    fig.tight_layout(rect=(0, 0, 1, 0.94 - 0.022 * len(lines)))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
