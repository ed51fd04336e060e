"""What earlier runs of a script needed: the history input of the estimator (read-only)."""
from __future__ import annotations

import logging
from typing import List, Optional

from slurm_coloc.config import Config
from slurm_coloc.errors import StoreError
from slurm_coloc.store.oom import history_peaks_mib
from slurm_coloc.store.report_queries import job_peak_mem_mib as _node_peak
from slurm_coloc.store.report_queries import open_for_report as open_readonly  # users read root's WAL files

log = logging.getLogger(__name__)


def script_history_mib(cfg: Config, script_sha256: str) -> List[int]:
    """MiB values earlier runs of the script with this SHA-256 needed, oldest first.

    Today: the fence each OOM-killed attempt hit (``store.oom.history_peaks_mib``). Returns ``[]`` when the
    controller database does not exist yet.

    Raises:
        StoreError: the database exists but cannot be read.
    """
    if not script_sha256 or not cfg.ctld_db_path.exists():
        return []
    db = open_readonly(cfg.ctld_db_path)
    try:
        return history_peaks_mib(db, script_sha256)
    except Exception as exc:  # sqlite3 errors while reading a damaged file
        raise StoreError(f"cannot read history from {cfg.ctld_db_path}: {exc}") from None


def job_peak_mem_mib(cfg: Config, job_id: int, node_list: str) -> Optional[int]:
    """The sampler's peak GPU memory of ``job_id`` (MiB, summed over its processes per sample instant), the
    largest over the node databases of ``node_list`` (``n1,n2``; bracket ranges are not expanded: nodes missing
    from the list are read only if named). None when no node recorded samples for it. Never raises: an
    unreadable node database is logged and skipped.
    """
    best: Optional[float] = None
    for node in [n for n in (node_list or "").split(",") if n and "[" not in n]:
        path = cfg.node_db_path(node)
        if not path.exists():
            continue
        try:
            peak = _node_peak(open_readonly(path), job_id)
        except Exception as exc:  # noqa: BLE001 - evidence is optional
            log.warning("cannot read samples of job %s from %s: %s", job_id, path, exc)
            continue
        if peak is not None and (best is None or peak > best):
            best = peak
    return None if best is None else int(round(best))
