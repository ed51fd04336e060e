"""What coloc-placer knows of job signatures from earlier runs: activity, run time and start-up alone, from
the node databases (runs that had their GPU alone) and a ``placement_history_path`` file. Never fatal: a
corrupt or stale file or an unreadable database is skipped with one warning.

History is per user (``intensity.HistoryKey`` = ``(uid, signature)``): a run measured in the databases is
keyed by the uid Slurm ran it as, so it steers only that user's jobs; the admin's ``placement_history_path``
file is keyed under uid None and counts for everyone. A job's lookups go ``(its uid, sig)`` then ``(None,
sig)`` (``intensity.history_keys``).
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from slurm_coloc.config import Config
from slurm_coloc.errors import ConfigError
from slurm_coloc.placement import intensity, share
from slurm_coloc.placement.intensity import HistoryKey
from slurm_coloc.placement.policy import Activity
from slurm_coloc.store import placement as store_placement
from slurm_coloc.store.db import open_readonly

log = logging.getLogger("slurm_coloc.placer")
Timing = Tuple[Optional[float], Optional[float]]  # (run_s, startup_s) of one run alone


def log_once(seen: Optional[Set[str]], key: str, msg: str, *args: Any) -> None:
    """Log a warning once per ``key`` (every time when ``seen`` is None).

    Args:
        seen: the keys already logged (``key`` is added), or None.
        key: what the warning is about; msg, args: the ``logging`` format and its arguments.
    """
    if seen is not None:
        if key in seen:
            return
        seen.add(key)
    log.warning(msg, *args)


def _history_json(path: str) -> Dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        sigs = data["signatures"]
        if not isinstance(sigs, dict):
            raise TypeError("signatures is not an object")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"cannot read placement_history_path {path!r}: {exc}") from None
    return sigs


def _num(v: Any) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1e7 else None


def read_history_file(path: str, timing: Optional[Dict[str, List[Timing]]] = None) -> Dict[str, Activity]:
    """Signature -> activity from a ``placement_history_path`` file (``{"signatures": {sig: {"smact": f,
    "smocc": f, "drama": f[, "run_s": s, "startup_s": s]}}}``, fractions 0..1, seconds). Entries that are not
    such objects are skipped.

    Args:
        path: the history file's path.
        timing: when given, gets each signature's ``(run_s, startup_s)`` (s) appended where present.

    Returns:
        signature -> ``Activity`` (fractions 0..1).

    Raises:
        ConfigError: the file is unreadable or not a JSON object with ``signatures``.
    """
    out: Dict[str, Activity] = {}
    for sig, a in _history_json(path).items():
        vals = [a.get(k) if isinstance(a, dict) else None for k in ("smact", "smocc", "drama")]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1 for v in vals):
            out[str(sig)] = Activity(*(float(v) for v in vals))  # type: ignore[arg-type]
            if timing is not None and _num(a.get("run_s")) is not None:
                timing.setdefault(str(sig), []).append((_num(a.get("run_s")), _num(a.get("startup_s"))))
    return out


def _read_admin_file(cfg: Config, now: float, seen: Optional[Set[str]], out: Dict[HistoryKey, List[Activity]],
                     timing: Optional[Dict[HistoryKey, List[Timing]]]) -> None:
    """Add ``placement_history_path``'s runs to ``out`` (and ``timing``) under uid None, unless the file is
    stale or bad (then one warning per ``seen`` key)."""
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
        for sig, act in read_history_file(path, file_timing).items():
            out.setdefault((None, sig), []).append(act)
        if timing is not None:
            for sig, timed in file_timing.items():
                timing.setdefault((None, sig), []).extend(timed)
    except ConfigError as exc:
        log_once(seen, f"bad:{path}", "%s: ignored (jobs without other history are placed by the gate "
                 "or by memory)", exc.one_line())


def _finished_keys(cfg: Config, seen: Optional[Set[str]]) -> Optional[Dict[int, HistoryKey]]:
    """job id -> ``(uid, signature)`` of the finished jobs recorded in ctld.db (those with both); None (one
    warning per ``seen`` key) when the database is unreadable."""
    try:
        ctld = open_readonly(cfg.ctld_db_path, busy_timeout_s=1.0)
        try:
            keys: Dict[int, HistoryKey] = {}
            for j in store_placement.finished_jobs(ctld):
                sig = j["coloc"].signature()
                if sig and j["uid"] is not None:
                    keys[j["job_id"]] = (j["uid"], sig)
        finally:
            ctld.conn.close()
    except Exception as exc:  # a bad database means no history, never a stop
        log_once(seen, f"db:{cfg.ctld_db_path}", "history database %s unreadable (%s): ignored",
                 cfg.ctld_db_path, exc)
        return None
    return keys


def _read_node_dbs(cfg: Config, keys: Dict[int, HistoryKey], now: float, seen: Optional[Set[str]],
                   out: Dict[HistoryKey, List[Activity]],
                   timing: Optional[Dict[HistoryKey, List[Timing]]]) -> None:
    """Add the alone runs of ``keys``' jobs in every node database to ``out`` (and ``timing``); an unreadable
    database is skipped with one warning per ``seen`` key."""
    for db_path in sorted(cfg.node_db_dir.glob("*.db")) if cfg.node_db_dir.is_dir() else []:
        try:
            db = open_readonly(db_path, busy_timeout_s=1.0)
            try:
                runs = store_placement.alone_activity(db, keys, now - cfg.placement_history_max_age_s)
            finally:
                db.conn.close()
        except Exception as exc:  # as above
            log_once(seen, f"db:{db_path}", "history database %s unreadable (%s): ignored", db_path, exc)
            continue
        for job_id, a in runs.items():
            if a["smact"] is not None:
                out.setdefault(keys[job_id], []).append(Activity(a["smact"], a["smocc"] or 0.0,
                                                                 a["drama"] or 0.0))
                if timing is not None and a.get("run_s") is not None:
                    timing.setdefault(keys[job_id], []).append((a.get("run_s"), a.get("startup_s")))


def read_history(cfg: Config, timing: Optional[Dict[HistoryKey, List[Timing]]] = None,
                 now: Optional[float] = None,
                 seen: Optional[Set[str]] = None) -> Dict[HistoryKey, List[Activity]]:
    """The measured activity of earlier runs that had their GPU alone (ctld.db + every node database), keyed
    by the uid Slurm ran each job as (a recorded job without a uid is skipped; recorded comments are validated
    again, ``store.placement.finished_jobs``), plus one run per signature of ``placement_history_path`` when
    set, under uid None (the admin's file, for everyone).

    Args:
        cfg: ``placement_history_path``, ``placement_history_max_age_s`` (s; older runs, and a history file
            not modified within it, are stale and skipped), ``ctld_db_path``, ``node_db_dir``.
        timing: when given, gets the same runs' ``(run_s, startup_s)`` (s) under the same keys.
        now: the wall clock (epoch s); the current time when None.
        seen: warning keys already logged (each warning is logged once per key).

    Returns:
        ``(uid, signature)`` -> the runs' ``Activity`` (SMACT, SMOCC, DRAMA fractions, 0..1).

    Never raises on bad input: a corrupt or stale file, or an unreadable database, is skipped with one
    warning.
    """
    now = time.time() if now is None else now
    out: Dict[HistoryKey, List[Activity]] = {}
    _read_admin_file(cfg, now, seen, out, timing)
    if not cfg.ctld_db_path.exists():
        return out
    keys = _finished_keys(cfg, seen)
    if keys is None:
        return out
    _read_node_dbs(cfg, keys, now, seen, out, timing)
    return out


def profile(coloc: Any, history: Mapping[HistoryKey, Sequence[Activity]],
            timing: Mapping[HistoryKey, Sequence[Timing]], uid: Optional[int] = None) -> share.Profile:
    """The measured profile of a job's signature (``share.Profile``; smact None without history) for a job run
    by ``uid``: ``coloc`` is its ``comment.JobComment`` (a coloc JSON object is validated first). Activity and
    timing each come from the first of ``intensity.history_keys(sig, uid)`` that has runs (the user's own,
    then the admin's file); another user's runs never count. Pure.

    Args:
        coloc: the job's ``comment.JobComment``, or a coloc JSON object.
        history: history key -> the activities measured alone (fractions).
        timing: history key -> the ``(run_s, startup_s)`` of runs alone (s).
        uid: the job's user, or None (then only the admin's file counts).

    Returns:
        The ``share.Profile``: SM activity alone (fraction, None without history), mean run and start-up
        times (s, None without timing).
    """
    keys = intensity.history_keys(intensity.signature(coloc), uid)
    act = next((a for a in (intensity.from_history(history.get(k, ())) for k in keys) if a is not None), None)
    timed: Sequence[Timing] = next((t for t in (timing.get(k, ()) for k in keys) if t), ())
    run = [r for r, _ in timed if r is not None]
    start = [s for _, s in timed if s is not None]
    return share.Profile(act.smact if act else None, sum(run) / len(run) if run else None,
                         sum(start) / len(start) if start else None)
