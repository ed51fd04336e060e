"""The one exception family of slurm-coloc: only ``slurm_coloc.cli`` turns them into exit codes (2, or Slurm's
own code for ``SlurmError`` raised by sbatch). Every message names what failed and the offending value.
"""
from __future__ import annotations

from typing import Optional, Sequence


class ColocError(Exception):
    """Base class: a failure we expected and can explain in one line; ``hint``: the next step."""

    exit_code: int = 2

    def __init__(self, message: str, hint: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
        text = self.message if not self.hint else f"{self.message} (hint: {self.hint})"
        return " ".join(text.split())


class ConfigError(ColocError):
    """The YAML config or a COLOC_* variable is missing, malformed or has an unknown key."""


class DirectiveError(ColocError):
    """A job script or its ``#COLOC`` / ``#SBATCH`` lines cannot be used."""


class EstimateError(ColocError):
    """The model named in ``#COLOC`` cannot be found, built or traced."""


class StoreError(ColocError):
    """A slurm-coloc SQLite database cannot be opened, migrated or written."""


class SlurmError(ColocError):
    """A Slurm command failed, timed out or printed what we cannot parse; ``returncode`` None: not run."""

    def __init__(
        self,
        message: str,
        argv: Sequence[str] = (),
        returncode: Optional[int] = None,
        stderr: str = "",
        hint: Optional[str] = None,
    ) -> None:
        super().__init__(message, hint)
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr
        if returncode is not None and returncode > 0:
            self.exit_code = returncode


class MissingExtra(ColocError):
    """An optional dependency a command needs is not installed (one line with its install hint)."""


#: optional module -> (what it is for, how to install it); setup.cfg's extras
EXTRAS = {"torch": ("PyTorch, which the memory estimator runs",
                    "pip install 'slurm-coloc[estimator]'; Debian package: coloc-admin torch DIR"),
          "numpy": ("numpy, which the memory estimator uses",
                    "pip install 'slurm-coloc[estimator]'; Debian package: coloc-admin torch DIR"),
          "matplotlib": ("matplotlib, which draws the plots", "pip install matplotlib"),
          "pynvml": ("nvidia-ml-py, which reads the GPUs", "pip install 'slurm-coloc[gpu]'")}


def require(module: str) -> None:
    """Raise ``MissingExtra`` when optional ``module`` (a key of ``EXTRAS``; else KeyError) is not installed
    or blocked (``sys.modules[module] = None``); never imports it."""
    import importlib.util

    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: a None entry in sys.modules
        found = False
    if not found:
        what, hint = EXTRAS[module]
        raise MissingExtra(f"{module} is not installed: {what}", hint=hint)
