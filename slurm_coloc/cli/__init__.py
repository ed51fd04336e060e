"""Command-line programs (the only part that imports click)."""
from __future__ import annotations

from typing import Any, Callable

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
