"""Where the metrics endpoint reads the databases (no prometheus_client here): this node's running job rows
(user and grant of each job's series) and the controller's OOM counts, each opened read-only per call.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from slurm_coloc.config import Config
from slurm_coloc.node.livestate import boot_time
from slurm_coloc.store import jobs as store_jobs
from slurm_coloc.store import oom as store_oom
from slurm_coloc.store.db import open_readonly
from slurm_coloc.store.jobs import JobRunRow

OOM_TTL_S = 60.0


def node_job_rows(cfg: Config, node: str) -> Callable[[], List[JobRunRow]]:
    """A reader of ``node``'s running job rows since this boot (read-only, opened per call: scrapes have
    threads).

    A missing database is no job (the Prolog creates it); an unreadable one makes the reader raise
    ``StoreError``.
    """
    since = boot_time()
    path = cfg.node_db_path(node)

    def rows() -> List[JobRunRow]:
        if not path.exists():
            return []
        db = open_readonly(path, busy_timeout_s=1.0)
        try:
            return store_jobs.load_open_job_runs(db, node, since)
        finally:
            db.conn.close()
    return rows


def ctld_oom_counts(cfg: Config) -> Callable[[], Optional[Tuple[int, int]]]:
    """A reader of ``(OOM deaths, reruns submitted)`` from ``ctld.db`` (shared ``state_dir``), cached
    ``OOM_TTL_S``.

    It gives None where the database cannot be read (the families are then absent) and never raises.
    """
    cache: Dict[str, Any] = {"at": -1e9, "value": None}

    def counts() -> Optional[Tuple[int, int]]:
        now = time.monotonic()
        if now - cache["at"] >= OOM_TTL_S:
            cache["at"] = now
            try:
                db = open_readonly(cfg.ctld_db_path, busy_timeout_s=1.0)
                try:
                    recs = store_oom.load_oom_events(db)
                finally:
                    db.conn.close()
                cache["value"] = (len(recs), sum(r.retry_status == "submitted" for r in recs))
            except Exception:  # no controller database here: no OOM families
                cache["value"] = None
        return cache["value"]
    return counts
