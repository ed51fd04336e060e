"""What earlier runs of a script needed: the history input of the estimator (read-only)."""
from __future__ import annotations

from typing import List

from slurm_coloc.config import Config
from slurm_coloc.errors import StoreError
from slurm_coloc.store.db import open_readonly
from slurm_coloc.store.oom import history_peaks_mib


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
