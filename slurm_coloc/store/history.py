"""What earlier runs of a script needed: the history input of the estimator (read-only).

Functions taking a node list read the node databases of its nodes (Slurm host list, ``gpu[01-02]``) and
never raise: an unreadable node database is logged and skipped.
"""
from __future__ import annotations

import logging
import os
from typing import List, Optional

from slurm_coloc.config import Config
from slurm_coloc.errors import SlurmError, StoreError
from slurm_coloc.slurm.parse import expand_hostlist
from slurm_coloc.store.oom import history_peaks_mib
from slurm_coloc.store.report_queries import job_peak_mem_mib as _node_peak
from slurm_coloc.store.report_queries import open_for_report as open_readonly  # users read root's WAL files

log = logging.getLogger(__name__)


MAX_HISTORY_JOBS = 20  # the most recent completed runs whose measured peaks are read


def script_history_mib(cfg: Config, script_sha256: str, uid: Optional[int] = None) -> List[int]:
    """MiB values earlier runs of user ``uid``'s (None: the caller's) script with this SHA-256 needed.

    Trust: keyed on what root recorded, ``jobs.script_sha256`` (root's hash of the batch script Slurm stored;
    "" gives []) and ``jobs.uid`` / ``oom_events.uid`` (Slurm's), never the job's comment; so no user's jobs
    feed another's estimate, and a forged comment feeds nothing.

    Returns:
        OOM fences (``store.oom.history_peaks_mib``: the job needed more), oldest first, then the measured
        peaks (``job_summaries.peak_mem_mib`` of the job's nodes) of the last ``MAX_HISTORY_JOBS`` COMPLETED
        runs, newest first; [] when the controller database does not exist yet.

    Raises:
        StoreError: the controller database exists but cannot be read (node files are skipped quietly).
    """
    uid = os.getuid() if uid is None else int(uid)
    if not script_sha256 or not cfg.ctld_db_path.exists():
        return []
    db = open_readonly(cfg.ctld_db_path)
    try:
        values = history_peaks_mib(db, script_sha256, uid)
        done = db.execute("SELECT job_id, node_list FROM jobs WHERE script_sha256 = ? AND uid = ? "
                          "AND state = 'COMPLETED' ORDER BY job_id DESC LIMIT ?",
                          [script_sha256, uid, MAX_HISTORY_JOBS]).fetchall()
    except Exception as exc:  # sqlite3 errors while reading a damaged file
        raise StoreError(f"cannot read history from {cfg.ctld_db_path}: {exc}") from None
    for job_id, node_list in done:
        peak = measured_peak_mib(cfg, int(job_id), node_list or "")
        if peak:
            values.append(peak)
    return values


def node_names(node_list: str) -> List[str]:
    """The nodes of a Slurm host list (``gpu[01-02],n5`` -> gpu01 gpu02 n5); [] when unreadable (logged)."""
    try:
        return expand_hostlist(node_list)
    except SlurmError as exc:
        log.warning("cannot read node list %r: %s", node_list[:80], exc.one_line())
        return []


def measured_peak_mib(cfg: Config, job_id: int, node_list: str) -> Optional[int]:
    """The largest per-node summary peak (MiB) the node Epilogs recorded for ``job_id``; None if none did."""
    from slurm_coloc.store.summaries import load_summaries

    best: Optional[float] = None
    for node in node_names(node_list):
        path = cfg.node_db_path(node)
        if not path.exists():
            continue
        try:
            rows = load_summaries(open_readonly(path), job_id)
        except Exception as exc:  # history is best effort
            log.warning("cannot read the summary of job %s from %s: %s", job_id, path, exc)
            continue
        for row in rows:
            if row.peak_mem_mib and (best is None or row.peak_mem_mib > best):
                best = row.peak_mem_mib
    return None if best is None else int(round(best))


def job_peak_mem_mib(cfg: Config, job_id: int, node_list: str) -> Optional[int]:
    """The sampler's peak GPU memory of ``job_id``, MiB summed over its processes per instant, max over nodes.

    None when no node recorded samples for it.
    """
    best: Optional[float] = None
    for node in node_names(node_list or ""):
        path = cfg.node_db_path(node)
        if not path.exists():
            continue
        try:
            peak = _node_peak(open_readonly(path), job_id)
        except Exception as exc:  # evidence is optional
            log.warning("cannot read samples of job %s from %s: %s", job_id, path, exc)
            continue
        if peak is not None and (best is None or peak > best):
            best = peak
    return None if best is None else int(round(best))


def sampler_watched(cfg: Config, node_list: str, start_ts: Optional[float], end_ts: Optional[float]) -> bool:
    """Whether a sampler recorded GPU samples on a node of ``node_list`` in ``[start_ts, end_ts]`` (Unix s).

    None or 0 times: False. Then a job with no process samples of its own held no GPU memory in that time.
    """
    from slurm_coloc.store.oom import gpu_samples_between

    if not start_ts or not end_ts:
        return False
    for node in node_names(node_list or ""):
        path = cfg.node_db_path(node)
        if not path.exists():
            continue
        try:
            if gpu_samples_between(open_readonly(path), start_ts, end_ts):
                return True
        except Exception as exc:  # evidence is optional
            log.warning("cannot read gpu samples from %s: %s", path, exc)
    return False


def stopped_by_watchdog(cfg: Config, job_id: int, node_list: str) -> bool:
    """Whether the sampler's watchdog stopped ``job_id`` on a node of ``node_list`` (unreadable: no event)."""
    from slurm_coloc.store.oom import has_watchdog_event

    for node in node_names(node_list or ""):
        path = cfg.node_db_path(node)
        if not path.exists():
            continue
        try:
            if has_watchdog_event(open_readonly(path), job_id):
                return True
        except Exception as exc:  # logged; treated as no event
            log.warning("cannot read watchdog events from %s: %s", path, exc)
    return False
