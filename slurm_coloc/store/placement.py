"""Queries of coloc-placer: each GPU's live activity in a node database, and the measured activity of earlier
runs that ran alone on their GPU. Read-only (``db.open_readonly``). Activity comes out as fractions 0..1 (the
tables store percent); GPM columns NVML lacks come out as None. Times are Unix s; a missing table reads as
empty."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Tuple

from sqlite_utils import Database

from slurm_coloc.comment import JobComment


@dataclass(frozen=True)
class LiveGpu:
    """Mean of one GPU's samples over the window before its last sample. ``smact, smocc, drama``: mean SM
    activity, SM occupancy, DRAM bandwidth utilisation (fractions; None: NULL); ``mem_used_mib``: max memory
    used in the window (MiB); ``name``: the GPU's model as NVML names it (``gpus`` table; "" when unknown)."""

    gpu_index: int
    last_ts: float
    smact: Optional[float]
    smocc: Optional[float]
    drama: Optional[float]
    mem_used_mib: Optional[float]
    n: int
    name: str = ""


def _frac(v: Optional[float]) -> Optional[float]:
    return None if v is None else max(0.0, min(1.0, float(v) / 100.0))


def live_gpus(db: Database, window_s: float) -> List[LiveGpu]:
    """Each GPU's ``LiveGpu``, by index: means over ``[last_ts - window_s, last_ts]`` of its newest sample."""
    if not db.table("gpu_samples").exists():
        return []
    rows = db.execute(
        "SELECT s.gpu_index, m.last_ts, AVG(s.smact_pct), AVG(s.smocc_pct), AVG(s.dram_bw_pct), "
        "MAX(s.mem_used_mib), "
        "COUNT(*) FROM gpu_samples s JOIN (SELECT gpu_index, MAX(ts) AS last_ts FROM gpu_samples GROUP BY "
        "gpu_index) m "
        "ON s.gpu_index = m.gpu_index WHERE s.ts >= m.last_ts - ? GROUP BY s.gpu_index ORDER BY s.gpu_index",
        [float(window_s)]).fetchall()
    names: Dict[int, str] = {}
    if db.table("gpus").exists():
        names = {int(i): str(n or "") for i, n in db.execute("SELECT gpu_index, name FROM gpus").fetchall()}
    return [LiveGpu(int(r[0]), float(r[1]), _frac(r[2]), _frac(r[3]), _frac(r[4]), r[5], int(r[6]),
                    names.get(int(r[0]), "")) for r in rows]


def finished_jobs(ctld: Database, limit: int = 5000) -> List[Dict[str, Any]]:
    """The newest ``limit`` ended jobs of ``ctld.db``, newest end first. Keys: ``job_id``, ``uid`` (Slurm's;
    None: unknown), ``coloc`` (``coloc_json`` as a validated ``comment.JobComment``; ``NO_COMMENT`` when
    absent or invalid) and ``state`` (Slurm's final; None)."""
    if not ctld["jobs"].exists():
        return []
    rows = ctld.execute("SELECT job_id, uid, coloc_json, state FROM jobs WHERE end_ts IS NOT NULL "
                        "ORDER BY end_ts DESC LIMIT ?", [int(limit)]).fetchall()
    return [{"job_id": int(job_id), "uid": int(uid) if isinstance(uid, int) else None,
             "coloc": JobComment.from_json_text(text if isinstance(text, str) else None),
             "state": state if isinstance(state, str) else None} for job_id, uid, text, state in rows]


# a sample with less SM activity is start-up or tear-down (imports, CUDA set-up), not work
BUSY_SMACT_PCT = 1.0


def alone_activity(node_db: Database, job_ids: Iterable[int],
                   since_ts: float = 0.0) -> Dict[int, Dict[str, Any]]:
    """Measured activity, while computing, of the jobs' single-GPU runs here that had their GPU alone. Alone:
    no other ``job_runs`` row on the same ``gpus`` overlaps it. Activity: mean SMACT/SMOCC/DRAMA of the GPU's
    samples over the run that show work (``smact_pct >= BUSY_SMACT_PCT``): start-up (imports, CUDA context,
    cuDNN set-up; 10-30 s on the H100 harness) keeps the GPU idle and would dilute a short run's mean, while
    collocated jobs contend only while they compute. Without such samples: the Epilog's ``job_summaries``
    means (DRAMA None). Runs ended before ``since_ts`` are left out. Returns: ``{job_id: {"smact": f, "smocc":
    f, "drama": f, "run_s": s, "startup_s": s, "gpu_model": name}}``: fractions (None: not measured);
    ``startup_s`` = first working sample - start (None: none); ``gpu_model`` from the ``gpus`` table (None:
    not recorded)."""
    ids = sorted({int(j) for j in job_ids})
    if not ids or not all(node_db[t].exists() for t in ("job_runs", "job_summaries", "gpu_samples")):
        return {}
    out: Dict[int, Dict[str, Any]] = {}
    busy = ("FROM gpu_samples g WHERE g.gpu_index = CAST(r.gpus AS INTEGER) AND g.ts >= r.start_ts "
            "AND g.ts <= r.end_ts AND g.smact_pct >= ?")
    model = ("(SELECT m.name FROM gpus m WHERE m.gpu_index = CAST(r.gpus AS INTEGER) LIMIT 1)"
             if node_db["gpus"].exists() else "NULL")
    for chunk in (ids[i:i + 500] for i in range(0, len(ids), 500)):
        marks = ",".join("?" * len(chunk))
        rows = node_db.execute(
            f"SELECT r.job_id, s.smact_mean, s.smocc_mean, (SELECT COUNT(*) {busy}), (SELECT "
            f"AVG(g.smact_pct) {busy}), "
            f"(SELECT AVG(g.smocc_pct) {busy}), (SELECT AVG(g.dram_bw_pct) {busy}), r.end_ts - r.start_ts, "
            f"(SELECT MIN(g.ts) {busy}) - r.start_ts, {model} "
            "FROM job_runs r LEFT JOIN job_summaries s ON s.job_id = r.job_id AND s.node = r.node "
            f"WHERE r.job_id IN ({marks}) AND r.end_ts IS NOT NULL AND r.end_ts >= ? AND r.gpus NOT LIKE "
            "'%,%' "
            "AND NOT EXISTS ("
            " SELECT 1 FROM job_runs o WHERE o.gpus = r.gpus AND o.job_id != r.job_id AND o.start_ts < "
            "r.end_ts "
            " AND (o.end_ts IS NULL OR o.end_ts > r.start_ts))",
            [BUSY_SMACT_PCT] * 5 + chunk + [float(since_ts)]).fetchall()
        for job_id, smact, smocc, n_busy, b_smact, b_smocc, b_drama, run_s, startup_s, name in rows:
            timing: Dict[str, Any] = {"run_s": None if run_s is None else float(run_s),
                                      "startup_s": None if startup_s is None else max(0.0, float(startup_s)),
                                      "gpu_model": str(name) if name else None}
            if n_busy:
                out[int(job_id)] = {"smact": _frac(b_smact), "smocc": _frac(b_smocc), "drama": _frac(b_drama),
                                    **timing}
            elif smact is not None:
                out[int(job_id)] = {"smact": _frac(smact), "smocc": _frac(smocc), "drama": None, **timing}
    return out


def saturated_seconds(db: Database, smact_pct: float, smocc_pct: float, drama_pct: float,
                      t0: Optional[float] = None, t1: Optional[float] = None) -> Dict[int, Dict[str, float]]:
    """Per GPU ``{"saturated_s", "sampled_s"}``: seconds over the saturation gate, seconds with SM activity. A
    row counts for its ``res_s`` (a rolled-up row judged by its means). Saturated: ``smact_pct`` column >=
    ``smact_pct`` and (``smocc_pct`` >= ``smocc_pct`` or ``dram_bw_pct`` >= ``drama_pct``) (CARMA's gate,
    thresholds in %). Rows without SM activity (no GPM) count in neither. ``t0``/``t1`` None: unbounded."""
    if not db.table("gpu_samples").exists():
        return {}
    where, args = ["smact_pct IS NOT NULL"], [float(smact_pct), float(smocc_pct), float(drama_pct)]
    if t0 is not None:
        where.append("ts >= ?")
        args.append(float(t0))
    if t1 is not None:
        where.append("ts <= ?")
        args.append(float(t1))
    rows = db.execute(
        "SELECT gpu_index, SUM(CASE WHEN smact_pct >= ? AND (COALESCE(smocc_pct, -1) >= ? OR "
        "COALESCE(dram_bw_pct, -1) >= ?) THEN res_s ELSE 0 END), SUM(res_s) FROM gpu_samples WHERE "
        + " AND ".join(where) + " GROUP BY gpu_index", args).fetchall()
    return {int(g): {"saturated_s": float(s or 0.0), "sampled_s": float(n or 0.0)} for g, s, n in rows}


@dataclass(frozen=True)
class GpuCoRuns:
    """One GPU's finished single-GPU runs and its samples over their span, for ``coruns.learn``. ``runs``:
    ``(job_id, start_ts, end_ts, compute_ts)``; ``compute_ts``: the job's first process sample at 90 % of its
    peak memory (None without process samples); ``samples``: ``(ts, smact, res_s)``: GPM SM activity as a
    fraction, seconds the row stands for."""

    gpu_index: int
    name: str
    runs: List[Tuple[int, float, float, Optional[float]]]
    samples: List[Tuple[float, float, float]]


def co_runs(node_db: Database, job_ids: Iterable[int], since_ts: float = 0.0) -> List[GpuCoRuns]:
    """Per GPU, the given jobs' finished single-GPU runs here that ended after ``since_ts``. With every other
    finished run on that GPU over their span (neighbours the fit must explain too) and every sample of that
    GPU with SM activity over it."""
    ids = sorted({int(j) for j in job_ids})
    if not ids or not all(node_db[t].exists() for t in ("job_runs", "gpu_samples")):
        return []
    spans: Dict[int, List[Tuple[float, float]]] = {}
    for chunk in (ids[i:i + 500] for i in range(0, len(ids), 500)):
        marks = ",".join("?" * len(chunk))
        for gpus, start, end in node_db.execute(
                f"SELECT gpus, start_ts, end_ts FROM job_runs WHERE job_id IN ({marks}) AND end_ts IS NOT "
                "NULL AND start_ts IS NOT NULL AND end_ts >= ? AND gpus NOT LIKE '%,%' AND gpus != ''",
                chunk + [float(since_ts)]).fetchall():
            if str(gpus).isdigit():
                spans.setdefault(int(gpus), []).append((float(start), float(end)))
    runs: Dict[int, List[Tuple[int, float, float, Optional[float]]]] = {}
    for gpu, sp in spans.items():  # every run that shared those spans, whatever its end: it took SMs too
        for job_id, start, end in node_db.execute(
                "SELECT job_id, start_ts, end_ts FROM job_runs WHERE gpus = ? AND start_ts IS NOT NULL AND "
                "end_ts IS NOT NULL AND start_ts <= ? AND end_ts >= ?",
                [str(gpu), max(e for _, e in sp), min(s for s, _ in sp)]).fetchall():
            runs.setdefault(gpu, []).append((int(job_id), float(start), float(end), None))
    names: Dict[int, str] = {}
    if node_db["gpus"].exists():
        names = {int(i): str(n or "") for i, n in
                 node_db.execute("SELECT gpu_index, name FROM gpus").fetchall()}
    has_proc = node_db["proc_samples"].exists()
    out = []
    for gpu, here in sorted(runs.items()):
        t0, t1 = min(r[1] for r in here), max(r[2] for r in here)
        samples = [(float(ts), float(v) / 100.0, float(res or 0.0)) for ts, v, res in node_db.execute(
            "SELECT ts, smact_pct, res_s FROM gpu_samples WHERE gpu_index = ? AND ts >= ? AND ts <= ? AND "
            "smact_pct IS NOT NULL ORDER BY ts", [gpu, t0, t1]).fetchall()]
        if has_proc:
            here = [(j, s, e, _compute_ts(node_db, j, gpu, s, e)) for j, s, e, _ in here]
        out.append(GpuCoRuns(gpu, names.get(gpu, ""), here, samples))
    return out


def _compute_ts(db: Database, job_id: int, gpu: int, start: float, end: float) -> Optional[float]:
    """A job's first process sample on ``gpu`` at 90 % of its peak memory in [start, end] (None: none)."""
    row = db.execute(
        "SELECT MIN(ts) FROM proc_samples WHERE job_id = ? AND gpu_index = ? AND ts >= ? AND ts <= ? AND "
        "used_mem_mib >= 0.9 * (SELECT MAX(used_mem_mib) FROM proc_samples WHERE job_id = ? AND "
        "gpu_index = ? AND ts >= ? AND ts <= ?)",
        [job_id, gpu, start, end, job_id, gpu, start, end]).fetchone()
    return float(row[0]) if row and row[0] is not None else None
