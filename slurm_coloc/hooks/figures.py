"""The job's summary figures for its AdminComment: measured facts only, computed by the node Epilog and stored
in its node database (``job_figures``); EpilogSlurmctld writes them into AdminComment (hooks/ctld.py) without
reading samples. Computed with ``report/facts.py`` (``store/`` reads only) from the controller's job row and
every node database of its node list, read-only, as ``coloc-report`` computes them. No judgement runs here:
waste rules and diagnosis run as the user who asks; this root hook never imports the report pipeline
(tests/test_hook_shims.py). Contract (the node Epilog): ``record`` never raises an ``Exception``, is skipped
when less than ``MIN_LEFT_S`` of the hook's alarm is left, and reads one job's rows."""
from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from sqlite_utils import Database

from slurm_coloc.config import Config
from slurm_coloc.hooks.ctld import _nodes
from slurm_coloc.report import facts
from slurm_coloc.store import oom as store_oom
from slurm_coloc.store import report_queries as rq
from slurm_coloc.store import summaries as store_summaries

MIN_LEFT_S = 2.0  # the figures are skipped when the hook's alarm fires sooner than this


@dataclass(frozen=True)
class JobFacts:
    """What ``summary_dict`` reads of a job (names of ``report.summarize.JobView``, which it also takes).
    Request and estimate (MiB), measured figures (MiB, %, kWh, GPU hours), OOM and rerun, watchdog."""

    estimate_mib: Optional[int] = None
    estimate_method: Optional[str] = None
    share_mode: Optional[str] = None
    shards: Optional[int] = None
    requested_mib: Optional[float] = None
    peak_mem_mib: Optional[float] = None
    estimate_error_pct: Optional[float] = None
    util_mean: Optional[float] = None
    smact_mean: Optional[float] = None
    smact_p95: Optional[float] = None
    smocc_mean: Optional[float] = None
    smocc_p95: Optional[float] = None
    energy_kwh: Optional[float] = None
    gpu_hours: Optional[float] = None
    oom: bool = False
    retry_job_id: Optional[int] = None
    watchdog: Optional[str] = None


def _read(cfg: Config, job_id: int, nodes: Optional[List[str]]
          ) -> Tuple[Dict[str, Any], List[Dict[str, Any]], Dict[str, Database], List[Any], Any]:
    """The controller row ({} when absent), node run rows, open node databases by name, Epilog summaries, OOM.
    From the controller database and every node database of the row's node list (``nodes`` when it has none).
    """
    ctld = rq.open_for_report(cfg.ctld_db_path)
    row = rq.load_job_row(ctld, job_id) or {}
    oom = store_oom.load_oom_event(ctld, job_id)
    runs: List[Dict[str, Any]] = []
    dbs: Dict[str, Database] = {}
    summaries: List[Any] = []
    for node in _nodes(str(row.get("node_list") or "")) or list(nodes or []):
        path = cfg.node_db_path(node)
        if not path.exists():
            continue
        dbs[node] = db = rq.open_for_report(path)
        runs.extend(rq.load_job_run_rows(db, job_id))
        summaries.extend(store_summaries.load_summaries(db, job_id))
    return row, runs, dbs, summaries, oom


def job_facts(cfg: Config, job_id: int, nodes: Optional[List[str]] = None) -> Optional[JobFacts]:
    """The job's facts as ``report/usage.py`` ``add_usage`` computes them; None: no database knows the job.
    From the controller row and every node database of its node list (``nodes`` when the row has none yet,
    e.g. the node Epilog's own node before EpilogSlurmctld recorded the list). Raises StoreError (a database
    that exists but cannot be read (``record`` catches it))."""
    row, runs, dbs, summaries, oom = _read(cfg, job_id, nodes)
    if not row and not runs:
        return None
    times = {k: [float(t) for t in [r.get(k) for r in runs] + [row.get(k)]
                 if isinstance(t, (int, float)) and t] for k in ("start_ts", "end_ts")}
    start = min(times["start_ts"]) if times["start_ts"] else None
    end = max(times["end_ts"]) if times["end_ts"] else None
    by_node: Dict[str, List[int]] = {}
    for r in runs:
        idxs = [int(i) for i in str(r.get("gpus") or "").split(",") if i.strip().isdigit()]
        if idxs:
            by_node.setdefault(str(r["node"]), []).extend(idxs)
    n_gpus, shards = sum(len(v) for v in by_node.values()), row.get("shards_req")
    held = facts.gpus_held(shards, n_gpus, cfg.gpu_mem_gib)
    fig, _ = facts.summary_figures([s for s in summaries if s.n_samples])
    if start is not None and by_node:
        facts.sample_figures(dbs, job_id, (start, end if end is not None else start + 1e9), by_node,
                             any(s.n_samples for s in summaries), (held / max(1, n_gpus)) if held else 1.0,
                             fig, [])
    runtime = max(0.0, end - start) if start is not None and end is not None else None
    return JobFacts(
        estimate_mib=row.get("estimate_mib"), estimate_method=row.get("estimate_method"),
        share_mode=row.get("share_mode"), shards=shards,
        requested_mib=facts.requested_mib(shards, row.get("share_mode"), n_gpus, cfg.gpu_mem_gib),
        peak_mem_mib=fig["peak"],
        estimate_error_pct=facts.estimate_error(fig["peak"], row.get("estimate_mib"))[1],
        util_mean=fig["util_mean"], smact_mean=fig["smact_mean"], smact_p95=fig["smact_p95"],
        smocc_mean=fig["smocc_mean"], smocc_p95=fig["smocc_p95"],
        energy_kwh=None if fig["energy_j"] is None else fig["energy_j"] / 3.6e6,
        gpu_hours=None if held is None or runtime is None else held * runtime / 3600.0,
        oom=oom is not None, retry_job_id=oom.retry_job_id if oom else None,
        watchdog=facts.watchdog_reason(dbs, job_id, set(by_node) | {str(r["node"]) for r in runs}))


def _int(x: Optional[float]) -> Optional[int]:
    return None if x is None else int(round(x))


def summary_dict(view: Any) -> Dict[str, Any]:
    """The compact AdminComment dict of a job's facts (``JobFacts`` or a ``JobView`` with usage; pure). None
    values left out, floats rounded (keys: hooks/ctld.py): MiB (``est_mib``, ``req_mib``, ``peak_mib``), %
    (``err_pct``, ``util``, ``smact``, ``smocc``), ``kwh``, ``gpu_h``. No waste codes or findings."""
    def r(x: Optional[float], nd: int = 1) -> Optional[float]:
        return None if x is None else round(float(x), nd)

    d: Dict[str, Any] = {
        "coloc": 1, "est_mib": view.estimate_mib,
        "method": (view.estimate_method or "").replace(" ", "_") or None,
        "mode": view.share_mode,
        "shards": view.shards, "req_mib": _int(view.requested_mib), "peak_mib": _int(view.peak_mem_mib),
        "err_pct": r(view.estimate_error_pct), "util": r(view.util_mean), "smact": r(view.smact_mean),
        "smact_p95": r(view.smact_p95), "smocc": r(view.smocc_mean), "smocc_p95": r(view.smocc_p95),
        "kwh": r(view.energy_kwh, 5), "gpu_h": r(view.gpu_hours, 6), "oom": view.oom or None,
        "retry": view.retry_job_id, "watchdog": view.watchdog,
        "measured": view.peak_mem_mib is not None or view.smact_mean is not None}
    return {k: v for k, v in d.items() if v is not None}


def compute(cfg: Config, job_id: int, nodes: Optional[List[str]] = None) -> Optional[Dict[str, Any]]:
    """``{"summary": <summary_dict>}`` of ``job_facts``; None: job unknown. Raises StoreError (a database that
    exists but cannot be read (``record`` catches it))."""
    got = job_facts(cfg, job_id, nodes)
    return None if got is None else {"summary": summary_dict(got)}


def record(cfg: Config, db: Database, job_id: int, node: str, node_list: str = "") -> Dict[str, Any]:
    """Compute the job's figures and store them in this node's ``db``; the hook log's detail. ``node_list``
    (as Slurm prints it) is read where the controller's row has none yet; "": this node alone. Skipped when
    less than ``MIN_LEFT_S`` of the hook's alarm is left. Detail: ``ms`` taken and ``measured``, or
    ``skipped`` / ``error`` in words. Never raises an ``Exception`` (the hook's own alarm, a
    ``BaseException``, passes)."""
    left = signal.getitimer(signal.ITIMER_REAL)[0]
    if left and left < MIN_LEFT_S:
        return {"skipped": f"{left:.1f} s of the hook's budget left"}
    t0 = time.monotonic()
    try:
        figures = compute(cfg, job_id, _nodes(node_list) or [node])
        if figures is None:
            return {"skipped": "job not recorded"}
        store_summaries.record_figures(db, job_id, node, figures)
        return {"ms": round(1000 * (time.monotonic() - t0)), "measured": figures["summary"].get("measured")}
    except Exception as exc:  # the AdminComment figures are never worth failing the node
        return {"error": " ".join(f"{type(exc).__name__}: {exc}".split())[:300]}
