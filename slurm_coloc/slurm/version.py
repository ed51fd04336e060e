"""Which Slurm release a bin dir holds, and what each release lets slurm-coloc do.

Read once per bin dir and process from ``scontrol --version`` (``slurm 22.05.8``, ``slurm-wlm 24.11.5``) or
any ``--json`` output's ``meta`` (``meta.Slurm.release`` 22.05, ``meta.slurm.release`` 23.02+); never guessed
from the environment. Features switch on from the first release they were checked on (22.05.8, 24.11.5,
26.05.5: ``docs/slurm-versions.md``); a release between them takes the 22.05 paths, which work everywhere
(slower, with an inferred final state, never wrong).
"""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from slurm_coloc.errors import SlurmError
from slurm_coloc.slurm.run import run

_RELEASE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")
#: First release with ``scontrol show job --json``, ``squeue --json -j`` filtering and the job's final state
#as : ``job_state[0]`` inside the epilogs (checked on 24.11.5 and 26.05.5; 22.05.8 has none of them).
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
        """``"24.11.5"`` (two-digit minor, as Slurm prints it)."""
        return f"{self.major}.{self.minor:02d}.{self.micro}"

    @property
    def series(self) -> Tuple[int, int]:
        """``(24, 11)``: what the feature thresholds compare."""
        return (self.major, self.minor)

    def at_least(self, series: Tuple[int, int]) -> bool:
        """Whether this release is ``series`` (``(24, 11)``) or newer."""
        return self.series >= series

    @property
    def json_job_query(self) -> bool:
        """``scontrol show job --json <id>`` works and epilogs see the final state in ``job_state[0]``."""
        return self.at_least(JSON_JOB_QUERY)

    @property
    def tested(self) -> bool:
        """Whether this release series is one slurm-coloc is tested on."""
        return self.series in TESTED


def parse_release(text: Optional[str]) -> Optional[SlurmVersion]:
    """``"slurm 22.05.8"``, ``"slurm-wlm 24.11.5"``, ``"26.05.5"`` -> ``SlurmVersion``; else None."""
    m = _RELEASE.search(text or "")
    if not m:
        return None
    return SlurmVersion(int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))


def version_from_meta(meta: Any) -> Optional[SlurmVersion]:
    """The release in ``meta`` (``Slurm.release`` 22.05, ``slurm.release`` 23.02+), or None."""
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

    Raises:
        SlurmError: scontrol missing, failing, timed out, or printing no release.
    """
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
    """Cache ``version`` for ``bin_dir`` (from a ``--json`` output's ``meta``), sparing the exec."""
    with _LOCK:
        _CACHE.setdefault(bin_dir, version)
