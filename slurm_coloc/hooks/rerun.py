"""The OOM rerun of one job, built by root from Slurm's record of the job only (docs/design.md, OOM rerun).

Mechanism: a NEW job, submitted by root with ``sbatch --uid --gid``, of a sanitised copy of the batch script
Slurm stored (``scontrol write batch_script``). Slurm 22.05 keeps a requeued job's GRES and refuses shard ->
gpu (docs/facts.md §6), and a requeue truncates the output that holds the OOM message, so requeueing cannot
give the job a whole GPU (docs/design.md says why).

What root never interprets: the script's directive lines (``#SBATCH``, ``#SLURM``, ``#PBS``, ``#BSUB``, ...
of every scheduler dialect; ``neutralise_directives``), the job's environment (``--export=NONE``, and sbatch
itself runs with ``PATH`` and ``SLURM_CONF`` only) and the job's comment (only the script's arguments, and
only where they agree with what Slurm recorded: ``script_args``). sbatch is also told ``--ignore-pbs``.
Every option of the rerun is the job's own value in slurmctld's record (``retry_sbatch_args``), one argv
word each, no shell. An array task is rerun alone (``--array=<its task id>``). The rerun carries the job's
whole confinement from the record (reservation, excluded and required nodes, QOS, account, WCKey, features,
licenses, other GRES, container, ...: ``slurm/jobinfo.py``), or is refused with the reason
(``rerun_refusal``). Root submits it: a site ``job_submit`` filter sees ``submit_uid`` 0 (docs/admin.md).
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import List, Mapping, Optional, Sequence, Tuple

from slurm_coloc.comment import JobComment
from slurm_coloc.config import Config
from slurm_coloc.errors import ColocError
from slurm_coloc.slurm import jobs as slurm_jobs
from slurm_coloc.slurm.jobinfo import JobInfo, confinement_of, refusal
from slurm_coloc.units import shards_to_mib

NEUTRAL_PREFIX = "# (coloc oom rerun) "
# A directive of any batch system, anywhere in the script, with any leading blanks and case: Slurm's sbatch
# reads "#SBATCH" and "#SLURM" at the start of a line (src/sbatch/opt.c _opt_batch_script) and "#PBS" unless
# --ignore-pbs; LSF "#BSUB", Moab "#MSUB", Grid Engine "#$", Cobalt "#COBALT", Flux "#flux:", LoadLeveler
# "#@".
_DIRECTIVE = re.compile(r"^[ \t\v\f]*#[ \t]*(?:SBATCH|SLURM|PBS|BSUB|MSUB|COBALT|FLUX:|\$|@)", re.IGNORECASE)
_LINE_BREAK = re.compile(r"(\r\n|\n|\r)")


def neutralise_directives(script: str) -> Tuple[str, int]:
    """``(script, lines changed)``: every directive line of the user's script made a plain comment.

    Pure, never raises.

    Neutralised (``NEUTRAL_PREFIX`` put in front, the line kept after it): every line matching a directive of
    any dialect (``_DIRECTIVE``) anywhere, and every comment line of the header (before the first line that is
    neither blank nor a comment, where sbatch stops reading directives), except a ``#!`` first line. Lines are
    split at ``\\n``, ``\\r\\n`` and ``\\r`` alike (kept as they are), so no reader's idea of a line start is
    missed.
    """
    parts = _LINE_BREAK.split(script)  # [line, sep, line, sep, ..., line]
    header = True
    changed = 0
    for i in range(0, len(parts), 2):
        line = parts[i]
        body = line.lstrip(" \t\v\f")
        comment = body.startswith("#")
        if header and body and not comment:
            header = False
        if i == 0 and line.startswith("#!"):
            continue
        if _DIRECTIVE.match(line) or (header and comment):
            parts[i] = NEUTRAL_PREFIX + line
            changed += 1
    return "".join(parts), changed


def script_args(job: Optional[JobInfo], argv: Optional[Sequence[str]]) -> Tuple[List[str], bool]:
    """``(argument words, exact)`` of the batch script (pure, never raises).

    Slurm's record first (``JobInfo.recorded_script_args``: 22.05's ``command``, 26.05's ``submit_line``, both
    argv joined by single spaces). ``argv`` is the coloc comment's (``JobComment.argv``, within
    ``comment.values.MAX_ARGS`` words of at most ``MAX_ARG_CHARS``; None: absent), used only where its words
    are the words Slurm recorded (it is the user's text: it can restore spaces inside arguments, never add or
    change any); else Slurm's words. ``exact`` False: spaces inside arguments may be lost, or the arguments
    are unknown (empty list).

    Slurm 24.11 records the script alone (docs/slurm-versions.md); there the comment's ``argv`` is the only
    source. The arguments follow the script path, where sbatch reads no option, so they shape only what the
    user's own script sees.
    """
    recorded, exact = job.recorded_script_args() if job else ([], True)
    words = list(argv) if argv is not None else []
    if recorded is None:
        return (words, True) if argv is not None else ([], False)  # 24.11: Slurm keeps the script path only
    if argv is not None and " ".join(words).split() == recorded:
        return words, True  # the comment's words agree with what Slurm recorded
    return recorded, exact


def retry_sbatch_args(job: JobInfo, cfg: Config) -> List[str]:
    """sbatch options of ``job``'s rerun, one argv word each (no shell; pure), the rerun's coloc comment last.

    Every value is the job's own in slurmctld's record (``squeue --json``): name, partition, account, time
    limit (``--time`` in minutes), working directory, output paths (``--open-mode=append``), nodes, tasks,
    CPUs,
    memory (``--mem`` in MiB), and for an array task ``--array=<its task id>``. Fixed by root:
    ``--ignore-pbs``, ``--export=NONE`` (slurmd loads the user's login environment; nothing of the hook's or
    the job's leaks), ``--no-requeue`` and all shards of one GPU (``--gres=shard:<gpu_mem_gib>``, 1 shard = 1
    GiB: 22.05 takes one job's shards from one GPU, so no shard job fits beside it, while ``--gres=gpu:1``
    would not keep shard tenants off: docs/facts.md §4), then the job's other per-node GRES. Its confinement
    is carried verbatim (``slurm/jobinfo.py``). Nothing comes from the job's comment, script or
    environment.

    Raises:
        ColocError: part of the job's confinement cannot be carried (``rerun_refusal`` names it).
    """
    why = rerun_refusal(job)
    if why:
        raise ColocError(why)
    gib = cfg.gpu_mem_gib
    confined = confinement_of(job.raw)
    gres = ",".join((f"shard:{gib}", *confined.other_gres))
    args = [f"--job-name={job.name}", f"--partition={job.partition}", f"--chdir={job.work_dir or '/'}",
            "--ignore-pbs", "--open-mode=append", "--export=NONE", "--no-requeue", f"--gres={gres}",
            *confined.options]
    if job.array_job_id and job.array_task_id is not None:
        args.append(f"--array={int(job.array_task_id)}")
    if job.account not in ("", "(null)"):
        args.append(f"--account={job.account}")
    if job.time_limit_s:
        args.append(f"--time={max(1, job.time_limit_s // 60)}")
    out, err, inp = job.stdout_path, job.stderr_path, job.stdin_path
    if out:
        args.append(f"--output={out}")
    if err and err != out:
        args.append(f"--error={err}")
    if inp and inp != "/dev/null":
        args.append(f"--input={inp}")
    args += _shape_args(job)
    args.append(JobComment.oom_rerun(job.job_id, gib, shards_to_mib(gib)).comment_arg())
    return args


def _shape_args(job: JobInfo) -> List[str]:
    """The job's nodes, tasks, CPUs and memory as sbatch options (``--mem`` in MiB), from its record."""
    args = [f"{opt}={value}" for value, opt in ((job.num_nodes, "--nodes"), (job.num_tasks, "--ntasks"),
                                                (job.cpus_per_task, "--cpus-per-task")) if value]
    if not job.cpus_per_task and job.min_cpus_per_node and job.min_cpus_per_node > 1:
        args.append(f"--mincpus={job.min_cpus_per_node}")
    if job.mem_per_node_mib:
        args.append(f"--mem={job.mem_per_node_mib}M")
    elif job.mem_per_cpu_mib:
        args.append(f"--mem-per-cpu={job.mem_per_cpu_mib}M")
    return args


def rerun_refusal(job: JobInfo) -> Optional[str]:
    """Why ``job``'s rerun is refused (one line), or None (pure, never raises).

    A part of its confinement the rerun cannot carry (``slurm/jobinfo.py``: GRES per job/task/socket, CPUs
    or memory per GRES, a burst buffer, a heterogeneous job's component).
    """
    return refusal(confinement_of(job.raw))


def submit_retry(job: JobInfo, cfg: Config, env: Mapping[str, str], uid: int, gid: int,
                 argv: Optional[Sequence[str]]) -> Tuple[int, bool]:
    """Submit the rerun as the job's user; ``(new job id, whether the script's arguments are exact)``.

    The batch script is written to a root-only directory and its directives neutralised; sbatch runs as
    ``uid``/``gid`` with only ``SLURM_CONF`` of ``env``. ``hook_timeout_s``: a fifth bounds scontrol, a
    quarter sbatch. ``argv``: see ``script_args``.

    Raises:
        ColocError: scontrol or sbatch failed (SlurmError), or the script could not be handled.
    """
    work = Path(cfg.run_dir) / "oom"
    work.mkdir(parents=True, mode=0o700, exist_ok=True)
    if work.is_symlink() or (work.stat().st_uid != os.geteuid()) or work.stat().st_mode & 0o077:
        raise ColocError(f"{work} is not a private directory of this hook's user")
    job_id = job.job_id
    path = work / f"{job_id}.sh"
    path.unlink(missing_ok=True)
    senv = {"PATH": "/usr/bin:/bin", **({"SLURM_CONF": env["SLURM_CONF"]} if env.get("SLURM_CONF") else {})}
    try:
        slurm_jobs.write_batch_script(job_id, str(path), cfg.slurm_bin_dir, senv,
                                      timeout_s=cfg.hook_timeout_s / 5)
        try:
            text = path.read_text(encoding="utf-8", errors="surrogateescape")
        except OSError as exc:
            raise ColocError(f"cannot read the saved batch script of job {job_id}: {exc}") from None
        path.write_text(neutralise_directives(text)[0], encoding="utf-8", errors="surrogateescape")
        argv, exact = script_args(job, argv)
        new_id = slurm_jobs.sbatch_as_user(str(path), uid, gid, retry_sbatch_args(job, cfg), argv,
                                           cfg.slurm_bin_dir, env.get("SLURM_CONF"),
                                           timeout_s=cfg.hook_timeout_s / 4)
        return new_id, exact
    finally:
        path.unlink(missing_ok=True)
