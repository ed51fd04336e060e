"""Run a Slurm command, the only place slurm-coloc executes Slurm binaries, and which release a bin dir holds.

Hooks get no PATH, so binaries are resolved against ``Config.slurm_bin_dir``. Every command wrapper of
slurm/ takes the same ``bin_dir`` (that directory), ``env`` (the command's whole environment; None:
``slurm_env()``) and ``timeout_s`` (seconds before the child is killed).

The release is read once per bin dir and process from ``scontrol --version`` (``slurm 22.05.8``) or any
``--json`` output's ``meta`` (``meta.Slurm.release`` 22.05, ``meta.slurm.release`` 23.02+); never guessed
from the environment. Features switch on from the first release they were checked on (22.05.8, 24.11.5,
26.05.5: ``docs/slurm-versions.md``); a release between them takes the 22.05 paths, which work everywhere
(slower, with an inferred final state, never wrong).
"""
from __future__ import annotations

import os
import re
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Mapping, Optional, Sequence, Tuple

from slurm_coloc.errors import SlurmError

DEFAULT_TIMEOUT_S = 30.0


def slurm_env(extra: Optional[Mapping[str, str]] = None, base: Optional[Mapping[str, str]] = None) -> dict:
    """A new environment for a Slurm command: ``base`` (None: os.environ; ``PATH`` /usr/bin:/bin) plus
    ``extra``.

    PrologSlurmctld/EpilogSlurmctld get no SLURM_CONF (docs/facts.md §1); callers pass it in ``extra``."""
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
    default. SlurmError (argv, return code, stderr): missing, timed out, or (``check``) exited non-zero."""
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


_RELEASE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")
#: First release with ``scontrol show job --json``, ``squeue --json -j`` filtering and the job's final state
#: as ``job_state[0]`` inside the epilogs (checked on 24.11.5 and 26.05.5; 22.05.8 has none of them).
JSON_JOB_QUERY = (24, 11)
#: First release with SelectTypeParameters ``MULTIPLE_SHARING_GRES_PJ`` (one job's shards from several GPUs).
MULTIPLE_SHARING_GRES = (23, 11)
#: First release whose ``cgroup/v1`` plugin logs ``cgroup/v1 plugin is deprecated`` (26.05.5).
CGROUP_V1_DEPRECATED = (26, 5)
#: The releases slurm-coloc is tested on (``scripts/slurm_versions.sh``, ``COLOC_SLURM``).
TESTED = ((22, 5), (24, 11), (26, 5))


@dataclass(frozen=True)
class SlurmVersion:
    """A Slurm release: ``major.minor.micro`` (``24.11.5`` -> 24, 11, 5; minor is the month)."""

    major: int
    minor: int
    micro: int = 0

    @property
    def release(self) -> str:
        """``"24.11.5"`` (two-digit minor)."""
        return f"{self.major}.{self.minor:02d}.{self.micro}"

    @property
    def series(self) -> Tuple[int, int]:
        return (self.major, self.minor)

    def at_least(self, series: Tuple[int, int]) -> bool:
        return self.series >= series

    @property
    def json_job_query(self) -> bool:
        """``scontrol show job --json <id>`` works and epilogs see the final state in ``job_state[0]``."""
        return self.at_least(JSON_JOB_QUERY)

    @property
    def tested(self) -> bool:
        return self.series in TESTED


def parse_release(text: Optional[str]) -> Optional[SlurmVersion]:
    """``"slurm 22.05.8"``, ``"slurm-wlm 24.11.5"``, ``"26.05.5"`` -> ``SlurmVersion``; else None."""
    m = _RELEASE.search(text or "")
    if not m:
        return None
    return SlurmVersion(int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))


def version_from_meta(meta: object) -> Optional[SlurmVersion]:
    """The release in a ``--json`` output's ``meta``, or None."""
    if not isinstance(meta, Mapping):
        return None
    for key in ("slurm", "Slurm"):
        block = meta.get(key)
        if isinstance(block, Mapping) and isinstance(block.get("release"), str):
            return parse_release(block["release"])
    return None


_CACHE: Dict[str, SlurmVersion] = {}
_LOCK = threading.Lock()


def slurm_version(bin_dir: str = "/usr/bin", env: Optional[Mapping[str, str]] = None,
                  timeout_s: float = 10.0) -> SlurmVersion:
    """``scontrol --version`` of ``bin_dir`` (needs no controller), cached per bin dir for the process.
    SlurmError: scontrol missing, failing, timed out, or printing no release."""
    with _LOCK:
        if bin_dir in _CACHE:
            return _CACHE[bin_dir]
    proc = run(["scontrol", "--version"], bin_dir=bin_dir, env=env, timeout_s=timeout_s)
    found = parse_release(proc.stdout)
    if found is None:
        raise SlurmError(f"scontrol --version printed no release: {proc.stdout.strip()[:80]!r}")
    with _LOCK:
        _CACHE[bin_dir] = found
    return found


def remember(bin_dir: str, version: SlurmVersion) -> None:
    """Cache ``version`` (from a ``--json`` ``meta``) for ``bin_dir``, sparing the exec."""
    with _LOCK:
        _CACHE.setdefault(bin_dir, version)
