"""coloc-report's views (pure): filters, who may see what, and the user/GPU/node/cluster tables (a job's waste
flags and findings: ``report/diagnose.py``; its sample series: ``report/usage.py``).

Every view is a list of flat dicts (column -> value) so the same rows go to rich tables, JSON and CSV.

Definitions (docs/report.md):
- GPU-hours: GPUs held x runtime; a shard job holds ``shards / gpu_mem_gib`` of its GPU.
- Busy time of a GPU: the union of the spans of the jobs that held it (clipped to the window).
- Collocation factor: job-seconds on a GPU / its busy seconds = average number of jobs on a busy GPU.
- Saturated time of a GPU: sampled time meeting the placement gate (CARMA), per ``report/usage.py``; a job's
  rate vs alone: its runtime alone from history over this runtime (``report/usage.py``).
- Energy: kWh = J / 3.6e6; per job from the Epilog summary (attributed share), per GPU from the energy
  counter.
"""
from __future__ import annotations

import contextlib
import grp
import os
import pwd
import time
from dataclasses import dataclass, replace
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from slurm_coloc.config import Config
from slurm_coloc.report.diagnose import add_findings, flag_waste
from slurm_coloc.report.summarize import JobView, Report
from slurm_coloc.report.usage import (
    add_usage,
    alone_rates,
    learned_alone_s,
    saturated_share,
    util_by_job,
)
from slurm_coloc.store import placement as store_placement
from slurm_coloc.store import report_queries as rq


@dataclass(frozen=True)
class Filters:
    """Window (Unix s, None = open) and filters; ``users`` None = everyone (after access control)."""

    since: Optional[float] = None
    until: Optional[float] = None
    users: Optional[Tuple[str, ...]] = None
    nodes: Optional[Tuple[str, ...]] = None
    job_ids: Optional[Tuple[int, ...]] = None


@dataclass(frozen=True)
class Viewer:
    """Who runs the report: ``name``; ``sees_all`` for root and members of ``admin_group``."""

    name: str
    sees_all: bool


def current_viewer(cfg: Config, uid: Optional[int] = None) -> Viewer:
    """The calling user (``uid`` None: this process's effective uid; one without a passwd entry is named by
    its number) and whether they see every job: uid 0, or a member of ``cfg.admin_group`` (its member list or
    the user's primary group; empty: root only)."""
    uid = os.geteuid() if uid is None else uid
    try:
        pw = pwd.getpwuid(uid)
        name, gid = pw.pw_name, pw.pw_gid
    except KeyError:
        name, gid = str(uid), -1
    if uid == 0:
        return Viewer(name, True)
    if cfg.admin_group:
        with contextlib.suppress(KeyError):
            g = grp.getgrnam(cfg.admin_group)
            if name in g.gr_mem or g.gr_gid == gid:
                return Viewer(name, True)
    return Viewer(name, False)


def _overlaps(job: JobView, since: Optional[float], until: Optional[float]) -> bool:
    start = job.start_ts
    end = job.end_ts
    if since is not None and end is not None and end < since:
        return False
    if since is not None and end is None and start is not None and start < since and job.state not in (
            None, "RUNNING"):
        return False
    if until is not None and start is not None and start > until:
        return False
    return until is None or start is not None


def select_jobs(report: Report, cfg: Config, flt: Filters, viewer: Viewer, with_util: bool = True,
                now: Optional[float] = None) -> List[JobView]:
    """Jobs (in ``report.jobs`` order) that overlap the window (Unix s), match the filters and ``viewer`` may
    see, with usage, collocation figures, waste reasons and findings; one who does not see all gets only their
    own jobs. ``with_util``: also every job's coarse utilization (one batched scan); ``now`` (Unix s, default
    the clock) ends a running job's span."""
    picked = []
    for j in report.jobs:
        if not viewer.sees_all and j.user != viewer.name:
            continue
        if flt.job_ids and j.job_id not in flt.job_ids:
            continue
        if flt.users and j.user not in flt.users:
            continue
        if flt.nodes and not set(j.nodes.split(",")) & set(flt.nodes):
            continue
        if not _overlaps(j, flt.since, flt.until):
            continue
        picked.append(j)
    util = util_by_job(picked, report, time.time() if now is None else now) if with_util else {}
    learned = learned_alone_s(picked, report.node_dbs, cfg)
    rates = alone_rates(report.jobs, learned)  # history: every recorded job, not only the ones shown
    return [add_findings(flag_waste(replace(add_usage(j, report, cfg, util), **rates.get(j.job_id, {})), cfg),
                         cfg)
            for j in picked]


def job_rows(jobs: Sequence[JobView]) -> List[Dict[str, object]]:
    """One JSON-able dict per job (``JobView.to_json``)."""
    return [j.to_json() for j in jobs]


def _r(x: Optional[float], nd: int = 3) -> Optional[float]:
    return None if x is None else round(float(x), nd)


def _wmean(pairs: Iterable[Tuple[Optional[float], Optional[float]]]) -> Optional[float]:
    num = den = 0.0
    for value, weight in pairs:
        if value is not None and weight:
            num += value * weight
            den += weight
    return num / den if den else None


def user_rows(jobs: Sequence[JobView]) -> List[Dict[str, object]]:
    """Per user, by name (``?`` without one): jobs, GPU-hours, energy kWh, mean SM activity (GPU-hour
    weighted), OOMs, wasteful jobs."""
    by: Dict[str, List[JobView]] = {}
    for j in jobs:
        by.setdefault(j.user or "?", []).append(j)
    rows = []
    for user, js in sorted(by.items()):
        energies = [j.energy_kwh for j in js if j.energy_kwh is not None]
        errs = [abs(j.estimate_error_pct) for j in js if j.estimate_error_pct is not None]
        rows.append({
            "user": user, "jobs": len(js), "gpu_hours": _r(sum(j.gpu_hours or 0 for j in js)),
            "energy_kwh": _r(sum(energies), 4) if energies else None,
            "smact_mean": _r(_wmean((j.smact_mean, j.gpu_hours) for j in js), 1),
            "smocc_mean": _r(_wmean((j.smocc_mean, j.gpu_hours) for j in js), 1),
            "util_mean": _r(_wmean((j.util_mean, j.gpu_hours) for j in js), 1),
            "unused_gib_hours": _r(sum((j.unused_mib or 0) / 1024 * (j.runtime_s or 0) / 3600 for j in js)),
            "estimate_abs_error_pct_mean": _r(sum(errs) / len(errs), 1) if errs else None,
            "ooms": sum(1 for j in js if j.oom), "wasteful_jobs": sum(1 for j in js if j.waste),
            "jobs_without_samples": sum(1 for j in js if "no samples recorded for this job" in j.notes)})
    return rows


def _busy(spans: List[Tuple[float, float]]) -> float:
    total, cur_s = 0.0, 0.0
    cur_e: Optional[float] = None
    for s, e in sorted(spans):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def gpu_rows(report: Report, jobs: Sequence[JobView], flt: Filters, viewer: Viewer,
             now: float, cfg: Optional[Config] = None) -> List[Dict[str, object]]:
    """Per (node, GPU) with samples or job spans, sorted: jobs, busy hours (h), collocation factor,
    utilization vs SM activity/occupancy (%), memory (MiB), energy (kWh), and time saturated under ``cfg``'s
    placement gate (None: the defaults, ``report/usage.py``).

    Sample figures cover the window (``flt.since``..``flt.until``, Unix s) on every readable node database;
    job figures use ``jobs``, already filtered to what ``viewer`` may see, while the GPU's sample figures
    (like ``sinfo``) are shown as they are. ``_job_s``/``_busy_s`` (s) are for ``node_rows``/``cluster_row``
    (``public`` drops them); ``now`` (Unix s) ends a running job's span."""
    spans = _gpu_spans(jobs, flt, now)
    stats: Dict[Tuple[str, int], rq.GpuWindowStats] = {}
    totals: Dict[Tuple[str, int], float] = {}
    sat: Dict[Tuple[str, int], Dict[str, float]] = {}
    c = cfg or Config()  # the placement gate in percent
    gate = (100.0 * c.placement_smact_gate, 100.0 * c.placement_smocc_gate, 100.0 * c.placement_drama_gate)
    for node, db in sorted(report.node_dbs.items()):
        if flt.nodes and node not in flt.nodes:
            continue
        for g, v in store_placement.saturated_seconds(db, *gate, flt.since, flt.until).items():
            sat[(node, g)] = v
        for st in rq.gpu_window_stats(db, flt.since, flt.until, path=report.node_paths.get(node)):
            stats[(node, st.gpu_index)] = st
        for g, m in rq.gpu_totals_mib(db).items():
            totals[(node, g)] = m
    return [_gpu_row(key, stats.get(key), spans.get(key, []), sat.get(key), totals.get(key))
            for key in sorted(set(stats) | set(spans)) if not (flt.nodes and key[0] not in flt.nodes)]


def _gpu_spans(jobs: Sequence[JobView], flt: Filters,
               now: float) -> Dict[Tuple[str, int], List[Tuple[float, float]]]:
    """Per (node, GPU): the spans (epoch s) of ``jobs`` on it, cut to the window (a running job ends ``now``).
    """
    spans: Dict[Tuple[str, int], List[Tuple[float, float]]] = {}
    for j in jobs:
        if j.start_ts is None:
            continue
        s = max(j.start_ts, flt.since) if flt.since is not None else j.start_ts
        e = j.end_ts if j.end_ts is not None else now
        e = min(e, flt.until) if flt.until is not None else e
        for key in j.gpu_list:
            if e > s:
                spans.setdefault(key, []).append((s, e))
    return spans


def _gpu_row(key: Tuple[str, int], gst: Optional[rq.GpuWindowStats], sp: List[Tuple[float, float]],
             sat: Optional[Dict[str, float]], total_mib: Optional[float]) -> Dict[str, object]:
    """One row of ``gpu_rows``: the GPU's window figures (``gst``, None: no samples), its job spans ``sp``,
    its saturated and sampled seconds (``sat``) and its memory (MiB)."""
    node, gpu = key
    busy_s = _busy(sp)
    job_s = sum(e - s for s, e in sp)
    return {
        "node": node, "gpu": gpu, "jobs": len(sp), "busy_hours": _r(busy_s / 3600),
        "collocation_factor": _r(job_s / busy_s, 2) if busy_s > 0 else None,
        "util_mean": _r(gst.util_mean, 1) if gst else None,
        "smact_mean": _r(gst.smact_mean, 1) if gst else None,
        "smact_p95": _r(gst.smact_p95, 1) if gst else None,
        "smocc_mean": _r(gst.smocc_mean, 1) if gst else None,
        "smocc_p95": _r(gst.smocc_p95, 1) if gst else None,
        "mem_used_mean_mib": _r(gst.mem_used_mean_mib, 0) if gst else None,
        "mem_used_max_mib": _r(gst.mem_used_max_mib, 0) if gst else None,
        "saturated_hours": _r(sat["saturated_s"] / 3600) if sat is not None else None,
        "saturated_pct": (saturated_share(sat["saturated_s"], sat["sampled_s"]) if sat is not None
                          else None),
        "mem_total_mib": total_mib,
        "energy_kwh": _r(gst.energy_j / 3.6e6, 4) if gst and gst.energy_j is not None else None,
        "sampled_hours": _r(gst.covered_s / 3600) if gst else 0.0,
        "_job_s": job_s, "_busy_s": busy_s}


def node_rows(gpus: Sequence[Dict[str, object]]) -> List[Dict[str, object]]:
    """Per node, from ``gpu_rows``' rows (``_`` columns included): GPUs, busy hours, collocation factor, means
    weighted by sampled hours."""
    by: Dict[str, List[Dict[str, object]]] = {}
    for g in gpus:
        by.setdefault(str(g["node"]), []).append(g)
    return [dict(node=node, **_fold(gs)) for node, gs in sorted(by.items())]


def estimated(job: JobView) -> bool:
    """Whether ``job``'s request came from an estimate worth scoring: not a whole-GPU job and not an OOM rerun
    (whose recorded 'estimate' is the GPU's size)."""
    return job.share_mode not in ("gpu",
                                  "whole-gpu") and not job.retry_of and job.estimate_method != "oom-retry"


def cluster_row(gpus: Sequence[Dict[str, object]], jobs: Sequence[JobView]) -> Dict[str, object]:
    """One summary row over ``gpu_rows``' rows (``_`` columns included) and the jobs: GPUs, jobs, GPU-hours,
    kWh, collocation, OOMs, waste, estimate error."""
    errs = [abs(j.estimate_error_pct) for j in jobs if j.estimate_error_pct is not None and estimated(j)]
    row = dict(_fold(gpus))
    row.update({"jobs": len(jobs), "users": len({j.user for j in jobs}),
                "gpu_hours": _r(sum(j.gpu_hours or 0 for j in jobs)),
                "job_energy_kwh": _r(sum(j.energy_kwh or 0 for j in jobs), 4),
                "ooms": sum(1 for j in jobs if j.oom),
                "oom_retries_completed": sum(1 for j in jobs if j.oom and j.retry_outcome == "COMPLETED"),
                "wasteful_jobs": sum(1 for j in jobs if j.waste),
                "estimate_abs_error_pct_mean": _r(sum(errs) / len(errs), 1) if errs else None})
    return row


def _fold(gs: Sequence[Dict[str, Any]]) -> Dict[str, object]:
    def w(col: str) -> Optional[float]:
        return _r(_wmean((g[col], g["sampled_hours"]) for g in gs), 1)  # type: ignore[misc]

    busy = sum(float(g["_busy_s"]) for g in gs)
    job_s = sum(float(g["_job_s"]) for g in gs)
    energies = [float(g["energy_kwh"]) for g in gs if g["energy_kwh"] is not None]
    return {"gpus": len(gs), "busy_gpu_hours": _r(busy / 3600),
            "collocation_factor": _r(job_s / busy, 2) if busy > 0 else None,
            "util_mean": w("util_mean"), "smact_mean": w("smact_mean"), "smocc_mean": w("smocc_mean"),
            "energy_kwh": _r(sum(energies), 4) if energies else None}


def public(rows: Sequence[Dict[str, object]]) -> List[Dict[str, object]]:
    """Rows without the internal ``_``-prefixed columns."""
    return [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]


def sort_rows(rows: List[Dict[str, object]], key: Optional[str],
              descending: bool = False) -> List[Dict[str, object]]:
    """Sort ``rows`` in place by column ``key`` (None last) and return them; None or ``""`` keeps the order.

    Raises:
        KeyError: no row has the column (the error names it)."""
    if not key:
        return rows
    if rows and not any(key in r for r in rows):
        raise KeyError(key)
    present = [r for r in rows if r.get(key) is not None]
    missing = [r for r in rows if r.get(key) is None]
    present.sort(key=lambda r: (str(type(r[key])), r[key]), reverse=descending)  # type: ignore[index]
    return present + missing
