"""Job-level Slurm operations built on ``run`` and the pure parsers."""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence

from slurm_coloc.errors import SlurmError
from slurm_coloc.slurm.parse import (
    JobRecord,
    parse_sbatch_parsable,
    parse_scontrol_kv,
    parse_squeue_json,
)
from slurm_coloc.slurm.run import run


def sbatch(
    args: Sequence[str],
    bin_dir: str = "/usr/bin",
    env: Optional[Mapping[str, str]] = None,
    timeout_s: float = 60.0,
):
    """Run ``sbatch <args>`` and return the completed process (stdout/stderr kept for the caller).

    Equivalent: ``sbatch <args>``. Does not raise on sbatch's own refusal: the caller prints its stderr
    and exits with its code (coloc-sbatch is a drop-in).

    Raises:
        SlurmError: sbatch missing or timed out.
    """
    return run(["sbatch", *args], bin_dir=bin_dir, env=env, timeout_s=timeout_s, check=False)


def submit_parsable(args: Sequence[str], bin_dir: str = "/usr/bin", env: Optional[Mapping[str, str]] = None,
                    timeout_s: float = 60.0) -> int:
    """``sbatch --parsable <args>`` -> job id.

    Raises:
        SlurmError: sbatch failed (its stderr is carried) or printed no job id.
    """
    proc = run(["sbatch", "--parsable", *args], bin_dir=bin_dir, env=env, timeout_s=timeout_s)
    return parse_sbatch_parsable(proc.stdout)[0]


def squeue_all(bin_dir: str = "/usr/bin", env: Optional[Mapping[str, str]] = None,
               timeout_s: float = 30.0) -> List[JobRecord]:
    """Every job slurmctld still knows. Equivalent: ``squeue --json`` (22.05 ignores filters).

    Raises:
        SlurmError: squeue failed or printed something unparsable.
    """
    return parse_squeue_json(run(["squeue", "--json"], bin_dir=bin_dir, env=env, timeout_s=timeout_s).stdout)


def job_record(job_id: int, bin_dir: str = "/usr/bin", env: Optional[Mapping[str, str]] = None,
               timeout_s: float = 30.0) -> Optional[JobRecord]:
    """The ``squeue --json`` record of ``job_id``, or None if slurmctld no longer knows it."""
    for rec in squeue_all(bin_dir, env, timeout_s):
        if rec.job_id == job_id:
            return rec
    return None


def show_job(job_id: int, bin_dir: str = "/usr/bin", env: Optional[Mapping[str, str]] = None,
             detail: bool = False, timeout_s: float = 15.0) -> Dict[str, str]:
    """Key/value view of one job with expanded StdOut/StdErr paths.

    Equivalent: ``scontrol show job -o [-d] <job_id>``.

    Raises:
        SlurmError: unknown job or scontrol failure.
    """
    argv = ["scontrol", "show", "job", "-o"] + (["-d"] if detail else []) + [str(int(job_id))]
    out = run(argv, bin_dir=bin_dir, env=env, timeout_s=timeout_s).stdout.strip()
    if not out:
        raise SlurmError(f"scontrol printed nothing for job {job_id}", argv=argv)
    return parse_scontrol_kv(out.splitlines()[0])


def write_batch_script(job_id: int, path: str, bin_dir: str = "/usr/bin",
                       env: Optional[Mapping[str, str]] = None, timeout_s: float = 15.0) -> None:
    """Save a job's batch script. Equivalent: ``scontrol write batch_script <job_id> <path>``."""
    run(["scontrol", "write", "batch_script", str(int(job_id)), path], bin_dir=bin_dir, env=env, timeout_s=timeout_s)
