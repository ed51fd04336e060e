"""What coloc-placer knows of job signatures from earlier runs: activity, run time and start-up alone, from
the node databases (runs that had their GPU alone) and a ``placement_history_path`` file. Never fatal: a
corrupt or stale file or an unreadable database is skipped with one warning.

History is per user (``intensity.HistoryKey`` = ``(uid, signature)``): a run in the databases is keyed by the
uid Slurm ran it as and steers only that user's jobs; the admin's file is keyed under uid None and counts for
everyone (lookup order: ``intensity.history_keys``). Runs whose GPU model is known are also kept per model
(``ModelRuns``): a job's profile on a GPU comes from that model's runs where there are any (an H200 runs the
same steps faster than an H100, and the sharing model predicts departures from time alone).
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from slurm_coloc import coruns as learn
from slurm_coloc.comment import JobComment
from slurm_coloc.config import Config
from slurm_coloc.errors import ConfigError
from slurm_coloc.placement import intensity
from slurm_coloc.placement.intensity import HistoryKey
from slurm_coloc.placement.policies import Activity, Profile
from slurm_coloc.store import placement as store_placement
from slurm_coloc.store.db import open_readonly

log = logging.getLogger("slurm_coloc.placer")
Timing = Tuple[Optional[float], Optional[float]]  # (run_s, startup_s) of one run alone


@dataclass
class ModelRuns:
    """Runs alone split by the GPU model they ran on (NVML's name, e.g. ``NVIDIA H200``): per model, history
    key -> activities (fractions) and ``(run_s, startup_s)`` (s), as ``read_history`` fills its own maps."""

    activity: Dict[str, Dict[HistoryKey, List[Activity]]] = field(default_factory=dict)
    timing: Dict[str, Dict[HistoryKey, List[Timing]]] = field(default_factory=dict)
    learned: Set[HistoryKey] = field(default_factory=set)  # keys whose runs were learned from shared runs

    def add(self, model: Optional[str], key: HistoryKey, act: Activity, timed: Optional[Timing]) -> None:
        """Keep one run under its model (nothing when the model is not known)."""
        if not model:
            return
        self.activity.setdefault(model, {}).setdefault(key, []).append(act)
        if timed is not None:
            self.timing.setdefault(model, {}).setdefault(key, []).append(timed)


def log_once(seen: Optional[Set[str]], key: str, msg: str, *args: Any) -> None:
    """Log a warning once per ``key`` (added to ``seen``; every time when ``seen`` is None)."""
    if seen is not None:
        if key in seen:
            return
        seen.add(key)
    log.warning(msg, *args)


def _history_json(path: str) -> Dict[str, Any]:
    """The history file's JSON object, with ``signatures`` checked to be an object."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        sigs = data["signatures"]
        if not isinstance(sigs, dict):
            raise TypeError("signatures is not an object")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"cannot read placement_history_path {path!r}: {exc}") from None
    return data


def _num(v: Any) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1e7 else None


def _entries(sigs: Mapping[Any, Any]) -> Dict[str, Tuple[Activity, Optional[Timing]]]:
    """Signature -> (activity, timing or None) of the valid entries of one ``signatures`` object."""
    out: Dict[str, Tuple[Activity, Optional[Timing]]] = {}
    for sig, a in sigs.items():
        vals = [a.get(k) if isinstance(a, dict) else None for k in ("smact", "smocc", "drama")]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1 for v in vals):
            run_s = _num(a.get("run_s"))
            timed = (run_s, _num(a.get("startup_s"))) if run_s is not None else None
            out[str(sig)] = (Activity(*(float(v) for v in vals)), timed)  # type: ignore[arg-type]
    return out


def read_history_file(path: str, timing: Optional[Dict[str, List[Timing]]] = None,
                      by_model: Optional[Dict[str, Dict[str, Tuple[Activity, Optional[Timing]]]]] = None
                      ) -> Dict[str, Activity]:
    """Signature -> ``Activity`` from a ``placement_history_path`` file.

    Form: ``{"signatures": {sig: {"smact": f, "smocc": f, "drama": f[, "run_s": s, "startup_s": s]}}[,
    "gpu_models": {model: {sig: {...}}}]}``, fractions 0..1, seconds; ``gpu_models`` keyed by NVML's model
    name. Entries not such objects are skipped. A signature only under ``gpu_models`` counts for any model too
    (its models' mean). ``timing`` gets each signature's ``(run_s, startup_s)`` (the ``signatures`` entry,
    else every model's); ``by_model`` gets model -> signature -> ``(Activity, timing or None)``.

    Raises:
        ConfigError: the file is unreadable, not a JSON object with ``signatures``, or its ``gpu_models`` is
            not an object of objects.
    """
    data = _history_json(path)
    plain = _entries(data["signatures"])
    models: Dict[str, Dict[str, Tuple[Activity, Optional[Timing]]]] = {}
    raw = data.get("gpu_models", {})
    if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
        raise ConfigError(f"cannot read placement_history_path {path!r}: gpu_models is not an object of "
                          "objects")
    for model, sigs in raw.items():
        if str(model):
            models[str(model)] = _entries(sigs)
    out = {sig: act for sig, (act, _) in plain.items()}
    for sig in sorted({s for m in models.values() for s in m} - set(plain)):
        mean = intensity.from_history([m[sig][0] for m in models.values() if sig in m])
        if mean is not None:
            out[sig] = mean
    if timing is not None:
        for sig in out:
            found = [plain[sig][1]] if sig in plain else [m[sig][1] for m in models.values() if sig in m]
            timing.setdefault(sig, []).extend(t for t in found if t is not None)
    if by_model is not None:
        by_model.update(models)
    return out


def _read_admin_file(cfg: Config, now: float, seen: Optional[Set[str]], out: Dict[HistoryKey, List[Activity]],
                     timing: Optional[Dict[HistoryKey, List[Timing]]], by_model: Optional[ModelRuns]) -> None:
    """Add ``placement_history_path``'s runs to ``out`` (and ``timing``, ``by_model``) under uid None, unless
    the file is stale or bad (then one warning per ``seen`` key)."""
    path = cfg.placement_history_path
    if not path:
        return
    try:
        age = now - Path(path).stat().st_mtime
    except OSError:
        age = 0.0  # missing: read_history_file says so
    if age > cfg.placement_history_max_age_s:
        log_once(seen, f"stale:{path}", "history file %s is stale (%.0f days old): ignored", path,
                 age / 86400)
        return
    try:
        file_timing: Dict[str, List[Timing]] = {}
        file_models: Dict[str, Dict[str, Tuple[Activity, Optional[Timing]]]] = {}
        for sig, act in read_history_file(path, file_timing, file_models).items():
            out.setdefault((None, sig), []).append(act)
        if by_model is not None:
            for model, sigs in file_models.items():
                for sig, (act, one) in sigs.items():
                    by_model.add(model, (None, sig), act, one)
        if timing is not None:
            for sig, timed in file_timing.items():
                timing.setdefault((None, sig), []).extend(timed)
    except ConfigError as exc:
        log_once(seen, f"bad:{path}", "%s: ignored (jobs without other history are placed by the gate "
                 "or by memory)", exc.one_line())


Found = Dict[int, Tuple[HistoryKey, float]]  # job id -> (history key, prior SM activity alone)


def _finished_keys(cfg: Config, seen: Optional[Set[str]],
                   cal: Optional[intensity.Calibration] = None) -> Optional[Found]:
    """job id -> ``((uid, signature), prior SM activity alone)`` of the jobs recorded in ctld.db that ended
    COMPLETED (a killed, cancelled, preempted, timed-out or OOM'd run says nothing of its work alone and never
    counts) with both a uid and a signature; the prior is the job's prediction, floored as the placer counts
    it (``Calibration.smact_floor``). None (one warning per ``seen`` key) when the database is unreadable."""
    try:
        ctld = open_readonly(cfg.ctld_db_path, busy_timeout_s=1.0)
        try:
            keys: Found = {}
            for j in store_placement.finished_jobs(ctld):
                sig = j["coloc"].signature()
                if sig and j["uid"] is not None and j["state"] == "COMPLETED":
                    prior = 0.5 if cal is None else max(
                        intensity.predict(intensity.features(j["coloc"]), cal).smact, cal.smact_floor)
                    keys[j["job_id"]] = ((j["uid"], sig), prior)
        finally:
            ctld.conn.close()
    except Exception as exc:  # a bad database means no history, never a stop
        log_once(seen, f"db:{cfg.ctld_db_path}", "history database %s unreadable (%s): ignored",
                 cfg.ctld_db_path, exc)
        return None
    return keys


def _read_node_dbs(cfg: Config, found: Found, now: float, seen: Optional[Set[str]],
                   out: Dict[HistoryKey, List[Activity]],
                   timing: Optional[Dict[HistoryKey, List[Timing]]], by_model: Optional[ModelRuns],
                   cal: Optional[intensity.Calibration]) -> None:
    """Add the runs of ``found``'s jobs in every node database to ``out`` (and ``timing``, and ``by_model``
    where the run's GPU model is recorded): runs alone as measured, shared runs as learned from their GPU's
    co-run mixes (``learn.learn``) where the signature has no run alone (for the user, or in the admin's
    file); an unreadable database is skipped with one warning per ``seen`` key."""
    keys = {j: k for j, (k, _) in found.items()}
    since = now - cfg.placement_history_max_age_s
    learned: List[Tuple[float, learn.LearnedRun, Optional[str]]] = []
    for db_path in sorted(cfg.node_db_dir.glob("*.db")) if cfg.node_db_dir.is_dir() else []:
        try:
            db = open_readonly(db_path, busy_timeout_s=1.0)
            try:
                runs = store_placement.alone_activity(db, keys, since)
                gpus = store_placement.co_runs(db, list(keys)[:LEARN_RECENT_JOBS], since)  # newest first
            finally:
                db.conn.close()
        except Exception as exc:  # as above
            log_once(seen, f"db:{db_path}", "history database %s unreadable (%s): ignored", db_path, exc)
            continue
        for job_id, a in runs.items():
            if a["smact"] is not None:
                act = Activity(a["smact"], a["smocc"] or 0.0, a["drama"] or 0.0)
                timed = (a.get("run_s"), a.get("startup_s")) if a.get("run_s") is not None else None
                out.setdefault(keys[job_id], []).append(act)
                if timing is not None and timed is not None:
                    timing.setdefault(keys[job_id], []).append(timed)
                if by_model is not None:
                    by_model.add(a.get("gpu_model"), keys[job_id], act, timed)
        learned.extend((end, r, model) for end, r, model in _learned(db_path.stem, gpus, found, runs, cal))
    alone_keys = set(out)  # a signature measured alone (databases or the admin's file) keeps those runs only
    for _end, r, model in sorted(learned, key=lambda t: t[0]):
        if r.key in alone_keys or (None, r.key[1]) in alone_keys:
            continue
        # SMOCC and DRAMA of a shared run are not separable: the calibration's ratios to SMACT
        act = (Activity(r.smact, min(1.0, r.smact * cal.smocc_per_smact),
                        min(1.0, r.smact * cal.drama_per_smact)) if cal is not None else Activity(r.smact))
        out.setdefault(r.key, []).append(act)
        if timing is not None:
            timing.setdefault(r.key, []).append((r.run_s, r.startup_s))
        if by_model is not None:
            by_model.add(model, r.key, act, (r.run_s, r.startup_s))
            by_model.learned.add(r.key)


def _learned(node: str, gpus: Sequence[store_placement.GpuCoRuns], found: Found,
             alone: Mapping[int, Any], cal: Optional[intensity.Calibration]
             ) -> List[Tuple[float, learn.LearnedRun, Optional[str]]]:
    """``(end_ts, learned run, GPU model)`` of the shared runs of one node database (runs alone are measured
    and left to ``alone_activity``); a neighbour that did not end COMPLETED is fitted (it took SMs) but never
    kept."""
    floor = cal.smact_floor if cal else 0.5
    m = learn.mixes(node, gpus, lambda j: found.get(j, ((None, f"job:{j}"), floor)))
    of = {r.job_id: r for r in m.runs}
    return [(of[r.job_id].end_ts, r, m.models.get(of[r.job_id].gpu) or None)
            for r in m.learn(cal.capacity_for if cal is not None else lambda _model: 1.0)
            if r.shared and r.job_id not in alone and r.job_id in found]


LEARN_RECENT_JOBS = 300
"""Shared runs learned per history read: the most recently ended jobs (``RUNS_PER_KEY`` runs of a signature
are kept in any case). The fit reads every sample of their GPUs over their span, so the bound keeps each read,
every ``HISTORY_REFRESH_S`` of the placer's loop, to seconds."""


def read_history(cfg: Config, timing: Optional[Dict[HistoryKey, List[Timing]]] = None,
                 now: Optional[float] = None,
                 seen: Optional[Set[str]] = None,
                 by_model: Optional[ModelRuns] = None,
                 cal: Optional[intensity.Calibration] = None) -> Dict[HistoryKey, List[Activity]]:
    """``(uid, signature)`` -> the activity alone (fractions 0..1) of earlier runs (ctld.db + every node
    database), at most ``RUNS_PER_KEY`` runs per key (the last) and ``KEYS_PER_USER`` keys per uid (run last).

    Measured for runs that had their GPU alone, learned from co-run mixes for shared ones (``coruns.py``; only
    runs that ended COMPLETED), keyed by the uid Slurm ran each job as (a job without a uid is skipped;
    recorded comments are validated again), plus ``placement_history_path``'s runs under uid None (the admin's
    file, for everyone). Runs older than ``placement_history_max_age_s`` (s), and a file not modified within
    it, are stale. ``timing`` and ``by_model`` get the same runs' ``(run_s, startup_s)`` (s) and per-GPU-model
    copies; ``cal`` None: priors 0.5 and capacity 1.0. Never raises on bad input: a corrupt or stale file or
    an unreadable database is skipped with one warning per ``seen`` key.
    """
    now = time.time() if now is None else now
    out: Dict[HistoryKey, List[Activity]] = {}
    _read_admin_file(cfg, now, seen, out, timing, by_model)
    if not cfg.ctld_db_path.exists():
        return out
    keys = _finished_keys(cfg, seen, cal)
    if keys is None:
        return out
    _read_node_dbs(cfg, keys, now, seen, out, timing, by_model, cal)
    return _capped(out, timing, by_model)


RUNS_PER_KEY = 20
"""Runs kept per history key (the last): a signature's profile is their mean."""
KEYS_PER_USER = 500
"""History keys kept per uid (those added last): one user's flood of signatures never grows the placer's
memory without bound, and never pushes out another user's keys (each uid has its own cap)."""


def _capped(out: Dict[HistoryKey, List[Activity]], timing: Optional[Dict[HistoryKey, List[Timing]]],
            by_model: Optional[ModelRuns]) -> Dict[HistoryKey, List[Activity]]:
    """``out`` (and ``timing``, ``by_model`` in place) cut to ``RUNS_PER_KEY`` and ``KEYS_PER_USER``."""
    per_uid: Dict[Optional[int], List[HistoryKey]] = {}
    for key in out:  # insertion order: the admin's file, then the databases' runs oldest first
        per_uid.setdefault(key[0], []).append(key)
    kept = {k for keys in per_uid.values() for k in keys[-KEYS_PER_USER:]}
    maps: List[Dict[HistoryKey, Any]] = [out]
    if timing is not None:
        maps.append(timing)
    if by_model is not None:
        maps.extend([*by_model.activity.values(), *by_model.timing.values()])
    for m in maps:
        for key in list(m):
            if key not in kept:
                del m[key]
            else:
                m[key] = m[key][-RUNS_PER_KEY:]
    return out


def profile(coloc: JobComment, history: Mapping[HistoryKey, Sequence[Activity]],
            timing: Mapping[HistoryKey, Sequence[Timing]], uid: Optional[int] = None,
            gpu_model: str = "", by_model: Optional[ModelRuns] = None) -> Profile:
    """The ``Profile`` of ``uid``'s job on a GPU of model ``gpu_model`` ("": any model's runs): SM
    activity alone (fraction, None without history), mean run and start-up (s, None without timing), and
    whether it was learned from shared runs. Pure.

    Activity and timing each come from the first of ``intensity.history_keys(sig, uid)`` with runs on
    ``gpu_model`` (``by_model``), else the first with runs on any model; another user's runs never count.
    """
    keys = intensity.history_keys(intensity.signature(coloc), uid)
    same_act: Mapping[HistoryKey, Sequence[Activity]] = {}
    same_timing: Mapping[HistoryKey, Sequence[Timing]] = {}
    if gpu_model and by_model is not None:
        same_act = by_model.activity.get(gpu_model, {})
        same_timing = by_model.timing.get(gpu_model, {})
    found = ((intensity.from_history(h.get(k, ())), k) for h in (same_act, history) for k in keys)
    act, key = next(((a, k) for a, k in found if a is not None), (None, None))
    timed: Sequence[Timing] = next(
        (t for t in (h.get(k, ()) for h in (same_timing, timing) for k in keys) if t), ())
    run = [r for r, _ in timed if r is not None]
    start = [s for _, s in timed if s is not None]
    return Profile(act.smact if act else None, sum(run) / len(run) if run else None,
                   sum(start) / len(start) if start else None,
                   learned=by_model is not None and key in by_model.learned)
