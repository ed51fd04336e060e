"""A job's sample series for coloc-report (pure): its GPUs' GPM rates and its processes' memory over its span,
read from the node databases (``store/samples.py``) and folded into at most ``MAX_SERIES_POINTS`` time buckets
per GPU (``coloc-report advise``, the diagnosis where the Epilog summary lacks a figure, ``report/plot.py``).
"""
from __future__ import annotations

from typing import Dict, List, Tuple

from slurm_coloc.report.summarize import JobView, Report
from slurm_coloc.store import samples as store_samples

# a longer job's samples are folded into this many buckets (mean of rates, max of memory)
MAX_SERIES_POINTS = 2000
SERIES_KEYS = ("smact_pct", "smocc_pct", "tensor_pct", "dram_bw_pct")


def job_series(report: Report, job: JobView, now: float) -> List[Dict[str, object]]:
    """The job's samples over its span, sorted by ``ts`` (Unix s) across GPUs: ``{ts, node, gpu, smact_pct,
    smocc_pct, tensor_pct, dram_bw_pct}`` (%) and ``job_mem_mib`` (summed memory of its processes on that GPU,
    MiB; None with none). Above ``MAX_SERIES_POINTS`` per GPU, folded into equal time buckets; a job that
    never started has none; ``now`` (Unix s) ends a running job's span.
    """
    if job.start_ts is None:
        return []
    t1 = job.end_ts if job.end_ts is not None else now
    out: List[Dict[str, object]] = []
    for node, gpu in job.gpu_list:
        db = report.node_dbs.get(node)
        if db is None:
            continue
        mem: Dict[Tuple[float, int], float] = {}
        for p in store_samples.load_job_proc_samples(db, job.job_id):
            if p.get("used_mem_mib") is not None:
                key = (float(p["ts"]), int(p["gpu_index"]))
                mem[key] = mem.get(key, 0.0) + float(p["used_mem_mib"])
        rows = [{"ts": float(r["ts"]), "node": node, "gpu": gpu, **{k: r.get(k) for k in SERIES_KEYS},
                 "job_mem_mib": mem.get((float(r["ts"]), gpu))}
                for r in store_samples.load_gpu_samples(db, job.start_ts, t1, [gpu])]
        out.extend(_fold_series(rows, job.start_ts, t1))
    return sorted(out, key=lambda r: float(r["ts"]))  # type: ignore[arg-type]


def _fold_series(rows: List[Dict[str, object]], t0: float, t1: float) -> List[Dict[str, object]]:
    if len(rows) <= MAX_SERIES_POINTS:
        return rows
    width = max((t1 - t0) / MAX_SERIES_POINTS, 1e-3)
    buckets: Dict[int, List[Dict[str, object]]] = {}
    for r in rows:
        buckets.setdefault(int((float(r["ts"]) - t0) / width), []).append(r)  # type: ignore[arg-type]
    folded = []
    for _, rs in sorted(buckets.items()):
        row: Dict[str, object] = {"ts": rs[0]["ts"], "node": rs[0]["node"], "gpu": rs[0]["gpu"]}
        for k in SERIES_KEYS:
            vals = [float(r[k]) for r in rs if r.get(k) is not None]  # type: ignore[arg-type]
            row[k] = sum(vals) / len(vals) if vals else None
        mems = [float(r["job_mem_mib"])  # type: ignore[arg-type]
                for r in rs if r.get("job_mem_mib") is not None]
        row["job_mem_mib"] = max(mems) if mems else None
        folded.append(row)
    return folded
