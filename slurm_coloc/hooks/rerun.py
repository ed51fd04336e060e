"""The OOM rerun of one job, built by root from Slurm's record of the job only (docs/design.md, OOM rerun): a
NEW job, submitted by root with ``sbatch --uid --gid``, of a sanitised copy of the batch script Slurm stored
(``scontrol write batch_script``); a requeue cannot give the job a whole GPU (22.05 keeps the GRES,
docs/facts.md §6). Root never interprets the script's directive lines of any dialect
(``neutralise_directives``, plus ``--ignore-pbs``), the job's environment (``--export=NONE``) or its comment
(beyond ``script_args``). Every option is the job's own value in slurmctld's record, one argv word each, no
shell; the job's confinement is carried whole (``slurm/jobinfo.py``) or the rerun is refused
(``rerun_refusal``). A site ``job_submit`` filter sees ``submit_uid`` 0 (docs/admin.md)."""
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
    """``(script, lines changed)`` (pure): ``NEUTRAL_PREFIX`` before every ``_DIRECTIVE`` line and every
    comment line of the header, except a ``#!`` first line; lines split at ``\\n``, ``\\r\\n`` and ``\\r``
    alike."""
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
    """``(argument words, exact)`` of the batch script (pure, never raises). Slurm's record
    (``JobInfo.recorded_script_args``) first; ``argv`` (the coloc comment's, the user's text; None: absent)
    only restores spaces inside those words, never adds or changes one (24.11 records none: then ``argv`` is
    the only source). ``exact`` False: spaces may be lost, or the arguments are unknown ([])."""
    recorded, exact = job.recorded_script_args() if job else ([], True)
    words = list(argv) if argv is not None else []
    if recorded is None:
        return (words, True) if argv is not None else ([], False)  # 24.11: Slurm keeps the script path only
    if argv is not None and " ".join(words).split() == recorded:
        return words, True  # the comment's words agree with what Slurm recorded
    return recorded, exact


def retry_sbatch_args(job: JobInfo, cfg: Config) -> List[str]:
    """sbatch options of ``job``'s rerun, one argv word each (pure), its coloc comment last: the job's own
    values in slurmctld's record (``--time`` in minutes, ``--mem`` in MiB, an array task's ``--array=<id>``),
    its other GRES and confinement verbatim, and root's ``--ignore-pbs``, ``--export=NONE``, ``--no-requeue``
    and all shards of one GPU (``--gres=shard:<gpu_mem_gib>``, 1 shard = 1 GiB: docs/facts.md §4). Raises
    ColocError (``rerun_refusal``)."""
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
    """Why ``job``'s rerun is refused (confinement ``slurm/jobinfo.py`` cannot carry), or None; pure."""
    return refusal(confinement_of(job.raw))


def submit_retry(job: JobInfo, cfg: Config, env: Mapping[str, str], uid: int, gid: int,
                 argv: Optional[Sequence[str]]) -> Tuple[int, bool]:
    """Submit the rerun as the job's user; ``(new job id, arguments exact)``. The script goes to a root-only
    directory, directives neutralised; sbatch runs as ``uid``/``gid`` with only ``SLURM_CONF`` of ``env``; a
    fifth of ``hook_timeout_s`` bounds scontrol, a quarter sbatch. Raises ColocError (scontrol or sbatch
    failed, or the script could not be handled)."""
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
