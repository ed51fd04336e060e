"""What coloc-report says about one job (pure): the reasons it wasted its GPU share (``flag_waste``,
thresholds from the config) and its diagnosis (``add_findings``, report/diagnose.py).

Used by ``report/views.py`` for every selected job, ``report/query.py`` for ``coloc-report advise`` and the
node Epilog's summary figures (``hooks/figures.py``).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Dict, List, Optional, Sequence

from slurm_coloc.config import Config
from slurm_coloc.report import diagnose
from slurm_coloc.report.summarize import JobView
from slurm_coloc.units import format_mib


def add_findings(job: JobView, cfg: Config, series: Optional[Sequence[Dict[str, object]]] = None) -> JobView:
    """``job`` with its diagnosis (report/diagnose.py) as ``findings`` dicts, top first.

    Args:
        job: the job, usage figures filled in (``usage.add_usage``).
        cfg: the diagnosis thresholds.
        series: its samples (``series.job_series``; ``coloc-report advise``), used where the Epilog summary
            lacks a figure; None: the summary's figures only.
    """
    d = diagnose.diagnose(job, cfg, series)
    return replace(job, findings=[f.to_json() for f in d.findings])


def flag_waste(job: JobView, cfg: Config) -> JobView:
    """Add the reasons (in words) why a job wasted its GPU share; thresholds from the config.

    Rules: SM activity mean below ``report_waste_smact_pct``; more than ``report_waste_unused_pct`` % of the
    requested memory never used. Jobs shorter than ``report_waste_min_runtime_s`` are not judged.

    Args:
        job: the job, usage figures filled in (``runtime_s`` s, ``smact_mean`` %, ``unused_mib`` and
            ``requested_mib`` MiB).
        cfg: the ``report_waste_*`` thresholds.

    Returns:
        ``job`` with ``waste`` set, or ``job`` itself when nothing is flagged.
    """
    if job.runtime_s is None or job.runtime_s < cfg.report_waste_min_runtime_s:
        return job
    reasons: List[str] = []
    if job.smact_mean is not None and job.smact_mean < cfg.report_waste_smact_pct:
        reasons.append(f"low SM activity: {job.smact_mean:.1f}% mean (< {cfg.report_waste_smact_pct:g}%), "
                       f"the GPU mostly waited")
    if job.unused_mib is not None and job.requested_mib:
        unused_pct = 100.0 * job.unused_mib / job.requested_mib
        if unused_pct > cfg.report_waste_unused_pct:
            reasons.append(f"memory far below request: peak {format_mib(job.peak_mem_mib)} of "
                           f"{format_mib(job.requested_mib)} requested ({unused_pct:.0f}% unused)")
    return replace(job, waste=reasons) if reasons else job
