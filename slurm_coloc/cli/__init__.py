"""Command-line programs (the only part that imports click)."""
from __future__ import annotations

import logging
import logging.handlers
import os
from pathlib import Path
from typing import Any, Callable, Optional

import click

from slurm_coloc import __version__


def version_option(prog: str) -> Callable[[Any], Any]:
    """``--version`` for command ``prog``: prints ``<prog> (slurm-coloc) <version>`` and exits 0.

    Args:
        prog: the command's name as the user types it (``coloc-sbatch``).

    Returns:
        The click decorator.
    """
    return click.version_option(__version__, "--version", prog_name=prog,
                                message="%(prog)s (slurm-coloc) %(version)s")


def setup_logging(log_dir: str, prog: str, file_name: Optional[str]) -> None:
    """Log ``slurm_coloc`` to ``<log_dir>/<file_name>`` (stderr when None or the file cannot be made)."""
    handler: logging.Handler = logging.StreamHandler()
    if file_name:
        try:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            handler = logging.handlers.WatchedFileHandler(Path(log_dir) / file_name)
        except OSError:
            pass
    handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s {prog}[%(process)d] %(message)s"))
    root = logging.getLogger("slurm_coloc")
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, os.environ.get("COLOC_LOG_LEVEL", "INFO").upper(), logging.INFO))
