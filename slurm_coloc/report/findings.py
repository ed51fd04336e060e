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
    """``job`` (usage filled in) with its diagnosis (report/diagnose.py) as ``findings`` dicts, top first;
    ``series`` (``coloc-report advise``) fills figures the Epilog summary lacks.
    """
    d = diagnose.diagnose(job, cfg, series)
    return replace(job, findings=[f.to_json() for f in d.findings])


def flag_waste(job: JobView, cfg: Config) -> JobView:
    """``job`` with ``waste`` set to the reasons (in words) it wasted its GPU share; ``job`` itself when none.

    Rules: SM activity mean (%) below ``report_waste_smact_pct``; more than ``report_waste_unused_pct`` % of
    the requested memory never used. Jobs shorter than ``report_waste_min_runtime_s`` (s) are not judged.
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
