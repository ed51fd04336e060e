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


def sbatch_as_user(script_path: str, uid: int, gid: int, args: Sequence[str], script_args: Sequence[str] = (),
                   bin_dir: str = "/usr/bin", slurm_conf: Optional[str] = None, timeout_s: float = 15.0) -> int:
    """Submit ``script_path`` as user ``uid``/``gid`` from root; return the new job id.

    Equivalent: ``env -i PATH=/usr/bin:/bin SLURM_CONF=<conf> sbatch --parsable --uid=<uid> --gid=<gid> <args>
    <script_path> <script_args>``. sbatch runs with a minimal environment so nothing of the caller's (a hook's
    ``SLURM_SCRIPT_CONTEXT``, ``SBATCH_*`` defaults) reaches the job or changes the request; pass
    ``--export=NONE`` in ``args`` to have slurmd load the user's login environment (facts §6: ``--uid`` is for
    root only).

    Raises:
        SlurmError: sbatch refused the job (its stderr is carried), timed out, or printed no job id.
    """
    env = {"PATH": "/usr/bin:/bin"}
    if slurm_conf:
        env["SLURM_CONF"] = slurm_conf
    argv = ["sbatch", "--parsable", f"--uid={int(uid)}", f"--gid={int(gid)}", *args, script_path, *script_args]
    proc = run(argv, bin_dir=bin_dir, env=env, timeout_s=timeout_s)
    return parse_sbatch_parsable(proc.stdout)[0]


def spank_options_available(bin_dir: str = "/usr/bin", env: Optional[Mapping[str, str]] = None) -> bool:
    """Whether sbatch lists the SPANK plugin's ``--coloc-mem`` option (plugin loaded via plugstack.conf).

    Equivalent: ``sbatch --help | grep -- --coloc-mem``. False when sbatch cannot be run.
    """
    try:
        proc = run(["sbatch", "--help"], bin_dir=bin_dir, env=env, timeout_s=10.0, check=False)
    except SlurmError:
        return False
    return "--coloc-mem" in proc.stdout


def set_admin_comment(job_id: int, text: str, bin_dir: str = "/usr/bin", env: Optional[Mapping[str, str]] = None,
                      timeout_s: float = 10.0) -> None:
    """Set a job's AdminComment (root/SlurmUser only); ``scontrol show job`` and sacct then show it.

    Equivalent: ``scontrol update jobid=<job_id> AdminComment=<text>`` (one argv word, no shell, so spaces and
    quotes in ``text`` are safe). The jobstats convention: a compact machine-readable summary at job end.

    Raises:
        SlurmError: scontrol refused (not root, unknown job) or timed out.
    """
    if "\n" in text:
        raise SlurmError("AdminComment must be one line")
    run(["scontrol", "update", f"jobid={int(job_id)}", f"AdminComment={text}"], bin_dir=bin_dir, env=env,
        timeout_s=timeout_s)


def set_admin_comment_accounting(job_id: int, text: str, bin_dir: str = "/usr/bin",
                                 env: Optional[Mapping[str, str]] = None, timeout_s: float = 10.0) -> None:
    """Set a finished job's AdminComment in the accounting database (slurmdbd), as jobstats does.

    Equivalent: ``sacctmgr -i update job where jobid=<job_id> set AdminComment=<text>``. slurmctld refuses
    ``scontrol update`` once a job has finished (22.05: ``Job has already finished``), so at job end this is the
    only store; ``sacct -o AdminComment`` shows it. Without slurmdbd it fails.

    Raises:
        SlurmError: sacctmgr failed (no slurmdbd, not an admin) or timed out.
    """
    if "\n" in text:
        raise SlurmError("AdminComment must be one line")
    run(["sacctmgr", "-i", "update", "job", "where", f"jobid={int(job_id)}", "set", f"AdminComment={text}"],
        bin_dir=bin_dir, env=env, timeout_s=timeout_s)
