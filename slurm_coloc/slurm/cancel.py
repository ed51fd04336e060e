"""Stopping a job from a root daemon (the node sampler's watchdog): ``scancel`` and where its stderr goes."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Optional

from slurm_coloc.errors import SlurmError
from slurm_coloc.slurm.parse import parse_scontrol_kv
from slurm_coloc.slurm.run import run

_ID_IN_PARENS = re.compile(r"\((\d+)\)$")


@dataclass(frozen=True)
class StderrTarget:
    """A job's expanded stderr path (``StdErr``; ``StdOut`` when Slurm shows none) and its user's uid/gid."""

    path: str
    uid: int
    gid: int


def scancel(job_id: int, bin_dir: str = "/usr/bin", env: Optional[Mapping[str, str]] = None,
            timeout_s: float = 15.0) -> None:
    """Cancel ``job_id``. Equivalent: ``scancel <job_id>`` (a job that already ended is not an error to Slurm).

    Raises:
        SlurmError: scancel missing, timed out or refused (its stderr is carried).
    """
    run(["scancel", str(int(job_id))], bin_dir=bin_dir, env=env, timeout_s=timeout_s)


def parse_stderr_target(kv: Mapping[str, str]) -> StderrTarget:
    """``StderrTarget`` from ``scontrol show job -o`` fields ``StdErr``/``StdOut``, ``UserId``, ``GroupId`` (pure).

    ``UserId=colocuser(2001) GroupId=colocuser(2001)``: the numbers in parentheses.

    Raises:
        SlurmError: no path or no numeric uid/gid.
    """
    path = kv.get("StdErr") or kv.get("StdOut") or ""
    uid = _ID_IN_PARENS.search(kv.get("UserId", ""))
    gid = _ID_IN_PARENS.search(kv.get("GroupId", ""))
    if not path or uid is None or gid is None:
        raise SlurmError(f"scontrol shows no StdErr/UserId/GroupId for job {kv.get('JobId', '?')}")
    return StderrTarget(path, int(uid.group(1)), int(gid.group(1)))


def stderr_target(job_id: int, bin_dir: str = "/usr/bin", env: Optional[Mapping[str, str]] = None,
                  timeout_s: float = 15.0) -> StderrTarget:
    """Where ``job_id`` writes its stderr, and as whom. Equivalent: ``scontrol show job -o <job_id>``.

    Raises:
        SlurmError: unknown job, scontrol failure, or fields missing.
    """
    argv = ["scontrol", "show", "job", "-o", str(int(job_id))]
    out = run(argv, bin_dir=bin_dir, env=env, timeout_s=timeout_s).stdout.strip()
    if not out:
        raise SlurmError(f"scontrol printed nothing for job {job_id}", argv=argv)
    return parse_stderr_target(parse_scontrol_kv(out.splitlines()[0]))
