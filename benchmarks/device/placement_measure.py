"""Measurement of one placement benchmark pass (``placement_passes.py``): per job its Slurm times, signature,
``COLOC_BENCH`` record and GPU; SM activity per GPU and activity alone from the node database; the placer's counts
from its log; one log line per job."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from benchmarks.device import placement_metrics as pm
from slurm_coloc import config as config_mod
from slurm_coloc.comment import JobComment
from slurm_coloc.replay.metrics import runs_from_records
from slurm_coloc.slurm.placement import gpu_holdings

HERE = Path(__file__).resolve().parent

ROOT = Path(os.environ.get("COLOC_BENCH_ROOT", "/opt/coloc"))
JOBS = ROOT / "jobs"


def note_gpus(recs: Sequence[Any], gpu_of: Dict[int, str]) -> None:
    """Note in ``gpu_of`` the first GPU (``node:index`` from ``gres_detail``) each running job holds."""
    for r in recs:
        for node, idx, _name, _count in gpu_holdings(r):
            gpu_of.setdefault(r.job_id, f"{node}:{idx}")


def bench_record(path_glob: str, job_id: Optional[int]) -> Optional[Dict[str, Any]]:
    """The job's ``COLOC_BENCH`` record without its timeline (start-up: t_ready - t_launch; training: t1 - t0)."""
    for path in sorted(JOBS.glob(path_glob)):
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("COLOC_BENCH "):
                rec = json.loads(line[len("COLOC_BENCH "):])
                if rec.get("fake") or str(rec.get("job_id")) == str(job_id):
                    return {k: v for k, v in rec.items() if k not in ("timeline", "env")}
    return None


def placer_summary(log_path: Path, offset: int = 0) -> Dict[str, Any]:
    """Counts from the placer's log from byte ``offset`` on (this pass's part): placements by source of the
    prediction and by basis, waits, memory-only releases."""
    text = log_path.read_bytes()[offset:].decode(errors="replace") if log_path.exists() else ""
    return {"placed_history": len(re.findall(r"shards, history SMACT", text)),
            "placed_predicted": len(re.findall(r"shards, predicted SMACT", text)),
            "wait_notes": text.count(" waits: "), "memory_only": text.count("released memory-only"),
            "saturated_rounds": text.count("saturated, no new tenants"), "errors": text.count("round failed"),
            "placed_by_model": text.count("(slowdown-model"), "placed_empty_gpu": text.count("(empty-gpu"),
            "at_bound_waits": text.count("at its bound")}


def measure(jobs: Sequence[Dict[str, Any]], job_of: Mapping[int, int], recs: Sequence[Any], scenario: str,
            policy: str, gpu_of: Optional[Mapping[int, str]] = None) -> List[Dict[str, Any]]:
    """Per planned job: Slurm's times of its runs (OOM reruns followed), signature, COLOC_BENCH record, and the
    GPU it ran on (``gpu``: ``node:index`` seen in Slurm's ``gres_detail`` while it ran)."""
    task_of = {j: i for i, j in job_of.items()}
    runs = runs_from_records(recs, task_of)
    comment_of = {r.job_id: r.comment for r in recs}
    out = []
    for job in jobs:
        i = job["index"]
        mine = [r for r in runs if r.task == i]
        orig = next((r for r in mine if r.retry_of is None), None)
        last = max(mine, key=lambda r: r.end_ts or 0.0) if mine else None
        out.append({**job, "job_id": job_of.get(i), "submit_ts": orig.submit_ts if orig else None,
                    "start_ts": orig.start_ts if orig else None,
                    "end_ts": max((r.end_ts for r in mine), default=None) or None,
                    "state": last.state if last else None,
                    "oom_reruns": sum(r.retry_of is not None for r in mine),
                    "signature": JobComment.read(comment_of.get(job_of.get(i, -1), "")).signature(),
                    "gpu": (gpu_of or {}).get(job_of.get(i, -1)),
                    "bench": bench_record(f"pb-{scenario}-{policy}-{i}-*.out", job_of.get(i))})
    return out


def smact_per_gpu(cfg: Any, t0: float, t1: float) -> Dict[str, Optional[float]]:
    """Mean GPM SM activity (%) of each GPU of node n1 over [t0, t1] (idle samples included: an idle GPU shows)."""
    from slurm_coloc.replay.metrics import mean_smact
    from slurm_coloc.store.db import open_readonly
    from slurm_coloc.store.samples import load_gpu_samples

    try:
        db = open_readonly(cfg.node_db_path("n1"))
        try:
            rows = load_gpu_samples(db, t0, t1, list(range(16)))
        finally:
            db.conn.close()
    except Exception:  # noqa: BLE001 - no samples: no figure
        return {}
    idx = sorted({int(r["gpu_index"]) for r in rows})
    return {str(i): mean_smact([r for r in rows if int(r["gpu_index"]) == i]) for i in idx}


def alone_activity(jobs: List[Dict[str, Any]]) -> None:
    """Per job of an exclusive pass: SMACT/SMOCC/DRAMA while computing (fractions; ``store.placement``)."""
    from slurm_coloc.store.db import open_readonly
    from slurm_coloc.store.placement import alone_activity as query

    cfg = config_mod.load(f"{ROOT}/etc/coloc.yaml", environ={})
    db = open_readonly(cfg.node_db_path("n1"))
    try:
        got = query(db, [j["job_id"] for j in jobs if j["job_id"]])
    finally:
        db.conn.close()
    for j in jobs:
        j["alone_activity"] = got.get(j["job_id"])


def job_line(j: Mapping[str, Any], alone_s: Optional[float]) -> str:
    """One job's times: JCT, run, start-up split into Slurm start -> Python (``t_launch``), Python -> model and
    data on the GPU (``t_ready``), the 5 warm-up steps (``t0``), then training (``t1 - t0``), time alone."""
    b = j.get("bench") or {}

    def d(a: Optional[float], z: Optional[float]) -> str:
        return pm.fmt(float(z) - float(a)) if a and z else "-"
    return (f"job {j['index']:>2} {j['workload']:<26} {j['state']} jct {d(j.get('submit_ts'), j.get('end_ts'))} s, "
            f"run {d(j.get('start_ts'), j.get('end_ts'))} s = to python {d(j.get('start_ts'), b.get('t_launch'))} + "
            f"set-up {d(b.get('t_launch'), b.get('t_ready'))} + warm-up {d(b.get('t_ready'), b.get('t0'))} + "
            f"training {d(b.get('t0'), b.get('t1'))} s; alone {pm.fmt(alone_s)} s; "
            f"activity alone {j.get('alone_activity')}")


def history_from_alone(files: Sequence[Mapping[str, Any]]) -> Dict[str, Dict[str, float]]:
    """``{signature: {smact, smocc, drama, run_s, startup_s}}`` from exclusive pass files: each job's measured
    activity alone, its run time (end - start) and start-up (start -> ``t_ready`` of its bench record: model and
    data on the GPU), the mean over its runs when a signature repeats; jobs without a signature or a measurement are
    skipped. Pure."""
    acc: Dict[str, List[Mapping[str, Any]]] = {}
    for f in files:
        for j in f.get("jobs", []):
            act = dict(j.get("alone_activity") or {})
            if j.get("signature") and act.get("smact") is not None:
                b = j.get("bench") or {}
                if j.get("start_ts") and j.get("end_ts"):
                    act["run_s"] = float(j["end_ts"]) - float(j["start_ts"])
                    if b.get("t_ready"):
                        act["startup_s"] = max(0.0, float(b["t_ready"]) - float(j["start_ts"]))
                acc.setdefault(j["signature"], []).append(act)
    out = {}
    for sig, acts in acc.items():
        out[sig] = {k: sum(float(a.get(k) or 0.0) for a in acts) / len(acts) for k in ("smact", "smocc", "drama")}
        for k in ("run_s", "startup_s"):
            vals = [float(a[k]) for a in acts if a.get(k) is not None]
            if vals:
                out[sig][k] = sum(vals) / len(vals)
    return out


def history_file(files: Sequence[Mapping[str, Any]], models: Sequence[str] = ()) -> Dict[str, Any]:
    """The placer's history file object (``placement/history.py``) from exclusive pass files: ``signatures``
    (``history_from_alone``) of the runs whose GPU model is not known, and ``gpu_models`` (model -> the same
    form) of those whose model is: each job's ``alone_activity["gpu_model"]`` (the node database's name of its
    GPU), else ``models[k]`` for the k-th file ("" or absent: not known). Pure."""
    split: Dict[str, List[Mapping[str, Any]]] = {}
    for k, f in enumerate(files):
        label = models[k] if k < len(models) else ""
        for j in f.get("jobs", []):
            split.setdefault((j.get("alone_activity") or {}).get("gpu_model") or label, []).append(j)
    out: Dict[str, Any] = {"signatures": history_from_alone([{"jobs": split.get("", [])}])}
    per_model = {m: history_from_alone([{"jobs": js}]) for m, js in sorted(split.items()) if m}
    if per_model:
        out["gpu_models"] = per_model
    return out


def alone_from_files(files: Sequence[Mapping[str, Any]], scenario: str) -> Dict[int, float]:
    """Index -> time alone (s) of ``scenario``'s jobs from its exclusive pass files (parts stitched)."""
    parts = sorted((f for f in files if f.get("scenario") == scenario and f.get("policy") == "exclusive"),
                   key=lambda f: str(f.get("part") or ""))
    return pm.alone_times(pm.stitch(parts)["jobs"]) if parts else {}
