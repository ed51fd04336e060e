"""The job's summary figures, computed by the node Epilog and stored in its node database (``job_figures``).

EpilogSlurmctld writes them into AdminComment (hooks/admin_comment.py) without running the report pipeline
itself: the figures need the report's aggregation (``report/usage.py`` ``add_usage``), waste rules and
diagnosis (``report/findings.py``, ``report/diagnose.py``), which the controller hook's 30-second budget
should not carry. Here they are computed as ``coloc-report`` computes them: from the controller's row of the
job (``ctld.db``, on the shared ``state_dir``) and every node database of its node list, read-only.

Contract (the node Epilog): ``record`` never raises an ``Exception`` (our bug never fails the node); it is
skipped when less than ``MIN_LEFT_S`` of the hook's alarm is left; its work is one job's rows.
"""
from __future__ import annotations

import signal
import time
from typing import Any, Dict, List, Optional, Tuple

from slurm_coloc.config import Config
from slurm_coloc.errors import SlurmError
from slurm_coloc.report.findings import add_findings, flag_waste
from slurm_coloc.report.summarize import JobView, Report, spec_fields
from slurm_coloc.report.usage import add_usage
from slurm_coloc.slurm.parse import expand_hostlist
from slurm_coloc.store import oom as store_oom
from slurm_coloc.store import report_queries as rq
from slurm_coloc.store import summaries as store_summaries

MIN_LEFT_S = 2.0  # the figures are skipped when the hook's alarm fires sooner than this
# no spaces: scontrol -o
WASTE_CODES = {"low SM activity": "low-smact", "memory far below request": "unused-mem"}


def _nodes(node_list: str) -> List[str]:
    """The node names of a recorded Slurm host list (``gpu[01-02]`` -> gpu01 gpu02); [] when unreadable."""
    try:
        return expand_hostlist(node_list)
    except SlurmError:
        return []


def job_view(cfg: Config, job_id: int, nodes: Optional[List[str]] = None) -> Tuple[Optional[JobView], Report]:
    """The job's report view from the controller row and every node database of its node list (``nodes`` when
    the row has none yet, e.g. the node Epilog's own node before EpilogSlurmctld recorded the list).

    Args:
        cfg: the configuration (database paths); job_id: the Slurm job id.
        nodes: node names read when the controller's row has no node list; None: none.

    Returns:
        ``(view or None when no database knows the job, the report holding the open databases)``.

    Raises:
        StoreError: a database that exists but cannot be read (``record`` catches it).
    """
    report = Report()
    ctld = rq.open_for_report(cfg.ctld_db_path)
    row = rq.load_job_row(ctld, job_id) or {}
    o = store_oom.load_oom_event(ctld, job_id)
    if o is not None:
        report.oom_by_job[job_id] = o
    runs = []
    for node in _nodes(str(row.get("node_list") or "")) or list(nodes or []):
        path = cfg.node_db_path(node)
        if not path.exists():
            continue
        db = rq.open_for_report(path)
        report.node_dbs[node] = db
        report.node_paths[node] = str(path)
        runs.extend(rq.load_job_run_rows(db, job_id))
        report.summaries.setdefault(job_id, []).extend(store_summaries.load_summaries(db, job_id))
    if not row and not runs:
        return None, report

    def times(key: str) -> List[float]:
        return [float(t) for t in [r.get(key) for r in runs] + [row.get(key)]
                if isinstance(t, (int, float)) and t]

    starts, ends = times("start_ts"), times("end_ts")
    view = JobView(
        job_id=job_id, user=row.get("user_name"), name=row.get("job_name"),  # type: ignore[arg-type]
        nodes=",".join(str(r["node"]) for r in runs), gpus=";".join(f"{r['node']}:{r['gpus']}" for r in runs
                                                                    if r.get("gpus")),
        shards=row.get("shards_req"), share_mode=row.get("share_mode"),  # type: ignore[arg-type]
        estimate_mib=row.get("estimate_mib"), estimate_method=row.get("estimate_method"),  # type: ignore[arg-type]
        state=row.get("state"), exit_code=row.get("exit_code"), signal=row.get("signal"),  # type: ignore[arg-type]
        start_ts=min(starts) if starts else None, end_ts=max(ends) if ends else None,
        **spec_fields(row.get("spec_json")))  # type: ignore[arg-type]
    return view, report


def _int(x: Optional[float]) -> Optional[int]:
    return None if x is None else int(round(x))


def summary_dict(view: JobView) -> Dict[str, Any]:
    """The compact AdminComment dict of a job view (None values left out, floats rounded; keys:
    hooks/admin_comment.py).

    Args:
        view: the job's view with usage and findings (``report``): MiB, %, kWh, GPU hours.

    Returns:
        The dict (``est_mib``, ``req_mib``, ``peak_mib`` in MiB; ``err_pct``, ``util``, ``smact``, ``smocc``
        in %; ``kwh``, ``gpu_h``, ...). Pure.
    """
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
        "measured": view.peak_mem_mib is not None or view.smact_mean is not None,
        "waste": [WASTE_CODES.get(w.split(":")[0], "other") for w in view.waste] or None,
        "finding": view.findings[0]["name"] if view.findings else None}
    return {k: v for k, v in d.items() if v is not None}


def compute(cfg: Config, job_id: int, nodes: Optional[List[str]] = None) -> Optional[Dict[str, Any]]:
    """``{"summary": <summary_dict>, "findings": [finding names, top first]}`` of the job; None: job unknown.

    The findings are all kept so that EpilogSlurmctld, which learns of an OOM after this ran, can drop
    ``over-request`` (never judged for an OOM'd job: report/diagnose.py) and name the next one.

    Args:
        cfg: the configuration (database paths, the report's thresholds); job_id: the Slurm job id.
        nodes: node names read when the controller's row has no node list; None: none.

    Raises:
        StoreError: a database that exists but cannot be read (``record`` catches it).
    """
    view, report = job_view(cfg, job_id, nodes)
    if view is None:
        return None
    full = add_findings(flag_waste(add_usage(view, report, cfg), cfg), cfg)
    return {"summary": summary_dict(full), "findings": [f["name"] for f in full.findings]}


def record(cfg: Config, db: Any, job_id: int, node: str, node_list: str = "") -> Dict[str, Any]:
    """Compute the job's figures and store them in this node's database ``db``; returns a detail for the hook
    log.

    Skipped when less than ``MIN_LEFT_S`` of the hook's alarm is left.

    Args:
        cfg: the configuration; db: this node's database; job_id: the Slurm job id; node: this node's name.
        node_list: the job's nodes as Slurm prints them (``JobInfo.nodes``), read where the controller's row
            has no list yet; this node alone when empty.

    Returns:
        The detail (``ms``: the time taken, ms; ``measured``), or ``skipped`` / ``error`` in words.

    Raises:
        Never raises an ``Exception`` (the hook's own alarm, a ``BaseException``, passes).
    """
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
