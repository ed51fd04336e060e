"""Run a Slurm command: the only place slurm-coloc executes Slurm binaries.

Hooks get no PATH, so binaries are resolved against ``Config.slurm_bin_dir``. Every command wrapper of
slurm/ takes the same ``bin_dir`` (that directory), ``env`` (the command's whole environment; None:
``slurm_env()``) and ``timeout_s`` (seconds before the child is killed).
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Mapping, Optional, Sequence

from slurm_coloc.errors import SlurmError

DEFAULT_TIMEOUT_S = 30.0


def slurm_env(extra: Optional[Mapping[str, str]] = None, base: Optional[Mapping[str, str]] = None) -> dict:
    """A new environment for a Slurm command: ``base`` (None: os.environ; ``PATH`` /usr/bin:/bin) plus
    ``extra``.

    PrologSlurmctld/EpilogSlurmctld get no SLURM_CONF (docs/facts.md §1); callers pass it in ``extra``.
    """
    env = dict(os.environ if base is None else base)
    env.setdefault("PATH", "/usr/bin:/bin")
    if extra:
        env.update(extra)
    return env


def run(
    argv: Sequence[str],
    bin_dir: str = "/usr/bin",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    env: Optional[Mapping[str, str]] = None,
    check: bool = True,
    stdin_text: Optional[str] = None,
) -> subprocess.CompletedProcess:
    """Run ``argv`` (argv[0] a Slurm program, resolved in ``bin_dir``); text output; stdin /dev/null by
    default.

    Raises:
        SlurmError: the binary is missing, timed out, or (with ``check``) exited non-zero; carries argv,
            return code and stderr.
    """
    if not argv:
        raise SlurmError("empty Slurm command")
    exe = argv[0] if os.path.isabs(argv[0]) else str(Path(bin_dir) / argv[0])
    full = [exe, *argv[1:]]
    try:
        proc = subprocess.run(
            full,
            input=stdin_text,
            stdin=None if stdin_text is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=dict(env) if env is not None else slurm_env(),
            check=False,
        )
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} not found at {exe}", argv=full,
                         hint="install slurm-client or set slurm_bin_dir in the config") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{argv[0]} timed out after {timeout_s:g} s", argv=full) from None
    except OSError as exc:
        raise SlurmError(f"cannot run {exe}: {exc}", argv=full) from None
    if check and proc.returncode != 0:
        err = " ".join(proc.stderr.split()) or f"exit status {proc.returncode}"
        raise SlurmError(f"{argv[0]} failed: {err}", argv=full, returncode=proc.returncode,
                         stderr=proc.stderr.strip())
    return proc
