"""Submit a replay's tasks through coloc-sbatch at their scaled times and wait for them (and OOM reruns).

Modes: ``exclusive`` submits every task with ``--exclusive-gpu``; ``blind`` (alias ``coloc``) with
``--coloc-mem <catalog peak + context_mib>M`` (shards + MPS; Slurm packs by memory only); ``gate`` (alias
``aware``) and ``throughput`` submit the same plan held and without GRES (``placement.heartbeat.placer_argv``
on ``coloc-sbatch --dry-run``'s command) for a running ``coloc-placer``. ``context_mib`` (default 1024) covers
what the catalog's A100 peaks lack: a torch process's CUDA context (612 MiB on the H100, CUDA 13:
docs/facts.md §12) and library workspaces (without it, 4 of 8 sub-GiB tasks of an H100 replay died of OOM,
docs/benchmarks.md). SM activity: ``metrics.sm_activity_per_gpu``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from slurm_coloc.config import Config
from slurm_coloc.errors import ColocError
from slurm_coloc.placement import policies
from slurm_coloc.replay.metrics import (
    ReplayMetrics,
    RunRecord,
    energy_growth_j,
    runs_from_records,
    sm_activity_per_gpu,
    summarize,
)
from slurm_coloc.replay.trace import Task
from slurm_coloc.slurm import jobs as slurm_jobs
from slurm_coloc.slurm.jobs import JobInfo, cancel_jobs, squeue_all
from slurm_coloc.slurm.parse import FINAL_STATES

log = logging.getLogger("slurm_coloc.replay")
FINAL = FINAL_STATES
SLURM_MODES = ("exclusive", "coloc", "blind")  # placed by Slurm alone
ALIASES = {"aware": "gate"}  # another name of a placer policy's mode


def modes() -> Tuple[str, ...]:
    """Every replay mode: Slurm's own (``SLURM_MODES``), the aliases, and each registered placement policy
    (``placement.policies``: held for a coloc-placer running that policy)."""
    return (*SLURM_MODES, *ALIASES, *policies.names())


def placer_policy(mode: str) -> Optional[str]:
    """The ``placement_policy`` a replay mode needs the running coloc-placer to have; None: Slurm places."""
    name = ALIASES.get(mode, mode)
    return name if name in policies.POLICIES else None


@dataclass
class ReplayRun:
    """A finished replay: its metrics, every run record, job id -> task index, problems met, and per run its
    record with the GPU it held (``per_task``: ``RunRecord`` fields + ``gpu``, ``node:index`` or None)."""

    metrics: ReplayMetrics
    runs: List[RunRecord]
    job_of_task: Dict[int, int]
    problems: List[str] = field(default_factory=list)
    per_task: List[Dict[str, object]] = field(default_factory=list)


DEFAULT_CONTEXT_MIB = 1024


def sbatch_argv(
    task: Task,
    mode: str,
    job_script: str,
    output: str,
    extra: Sequence[str] = (),
    context_mib: int = DEFAULT_CONTEXT_MIB,
) -> List[str]:
    """coloc-sbatch arguments (after the program name) for ``task`` in ``mode``: coloc modes ask
    ``--coloc-mem=<mem_mib + context_mib>M`` (MiB), a task of unknown memory (0) a whole GPU; ``extra`` before
    the script. ColocError: unknown mode or negative ``context_mib``."""
    if mode not in modes():
        raise ColocError(f"unknown replay mode {mode!r} (use {' or '.join(modes())})")
    if context_mib < 0:
        raise ColocError(f"context allowance must be >= 0 MiB (got {context_mib})")
    gpu = (
        ["--exclusive-gpu"]
        if mode == "exclusive" or not task.mem_mib
        else [f"--coloc-mem={task.mem_mib + context_mib}M"]
    )
    return [
        "--parsable",
        f"--job-name=replay-{task.index}",
        f"--output={output}",
        *gpu,
        *extra,
        job_script,
        task.workload,
        "--steps",
        str(task.steps),
        "--tag",
        f"replay-{mode}-{task.index}",
    ]


def coloc_sbatch_path() -> str:
    """The coloc-sbatch next to this Python (same venv), else the one on PATH."""
    here = Path(sys.executable).parent / "coloc-sbatch"
    return str(here) if here.exists() else "coloc-sbatch"


def _energy(reader: Optional[object]) -> Dict[int, Optional[float]]:
    if reader is None:
        return {}
    frame = reader.read()  # type: ignore[attr-defined]
    return {g.index: g.energy_j for g in frame.gpus}


def open_energy_reader() -> Optional[object]:
    """An NVML reader for the energy counters, or None where NVML is unavailable (CPU test cluster)."""
    try:
        from slurm_coloc.nvml import NvmlReader

        return NvmlReader(gpm=False)
    except Exception as exc:  # no NVML: energy is NULL
        log.info("no NVML for energy: %s", exc)
        return None


def task_script(job_script: str, task: Task, out_dir: str) -> str:
    """A copy of ``job_script`` for one task (``<out_dir>/replay-task-<digest>.sh``, 0755, the same in every
    pass) with a comment line naming its workload and steps, so each task has its own SHA-256 and job
    signature: coloc-placer's history of a task steers that task only. OSError: unreadable script or
    unwritable ``out_dir``."""
    text = Path(job_script).read_text()
    head, _, rest = text.partition("\n")
    body = f"{head}\n# coloc-replay task: {task.workload} --steps {task.steps}\n{rest}"
    path = Path(out_dir) / f"replay-task-{hashlib.sha256(body.encode()).hexdigest()[:16]}.sh"
    if not path.exists() or path.read_text() != body:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(body)
        tmp.chmod(0o755)
        os.replace(tmp, path)
    return str(path)


def _submit_all(tasks: Sequence[Task], mode: str, cfg: Config, job_script: str, out_dir: str,
                extra_sbatch: Sequence[str], clock: Callable[[], float], context_mib: int,
                env: Dict[str, str], t_start: float, gpu_of: Dict[int, str]) -> Dict[int, int]:
    """Submit each task at its ``submit_s`` offset from ``t_start``; task index -> job id. ColocError: a
    submission failed (those already submitted are cancelled)."""
    job_of_task: Dict[int, int] = {}
    for task in sorted(tasks, key=lambda t: t.submit_s):
        delay = t_start + task.submit_s - clock()
        if delay > 0:
            time.sleep(delay)
        out = str(Path(out_dir) / f"replay-{mode}-{task.index}-%j.out")
        argv = sbatch_argv(task, mode, task_script(job_script, task, out_dir), out, extra_sbatch, context_mib)
        if placer_policy(mode) is not None:
            proc = submit_for_placer(argv, cfg, env)
        else:
            proc = subprocess.run([coloc_sbatch_path(), *argv], capture_output=True, text=True, env=env,
                                  timeout=120)
        if proc.returncode != 0:
            cancel(cfg, list(job_of_task.values()), env)
            raise ColocError(f"coloc-sbatch failed for task {task.index}: {proc.stderr.strip()}")
        job_of_task[task.index] = int(proc.stdout.strip().split(";")[0])
        log.info("task %s -> job %s", task.index, job_of_task[task.index])
        note_gpus(squeue_all(cfg.slurm_bin_dir, env),
                  gpu_of)  # a short job may end before the last submission
    return job_of_task


def run_replay(
    tasks: Sequence[Task],
    mode: str,
    cfg: Config,
    job_script: str,
    out_dir: str,
    deadline_s: float,
    extra_sbatch: Sequence[str] = (),
    poll_s: float = 1.0,
    clock: Callable[[], float] = time.time,
    context_mib: int = DEFAULT_CONTEXT_MIB,
) -> ReplayRun:
    """Submit ``tasks`` at ``submit_s`` offsets (each with its own ``task_script``), wait for them and OOM
    reruns until ``deadline_s`` (s) after the first, cancel what is left, and measure, noting each job's GPU.
    ``mode``: one of ``modes()``; ``job_script`` runs as ``<script> <workload> --steps N --tag T``; ``poll_s``
    (s); ``context_mib`` (MiB) added to each catalog peak. Problems include a placer missing or of another
    policy and a deadline reached. ColocError: a submission failed (those already submitted are cancelled
    first)."""
    env = dict(os.environ)
    reader = open_energy_reader()
    e0 = _energy(reader)
    t_start = clock()
    problems = _placer_problems(mode, cfg)
    gpu_of: Dict[int, str] = {}
    job_of_task = _submit_all(tasks, mode, cfg, job_script, out_dir, extra_sbatch, clock, context_mib, env,
                              t_start, gpu_of)
    records = _wait(cfg, job_of_task, env, t_start, deadline_s, poll_s, clock, problems, gpu_of)
    t_end = clock()
    runs = runs_from_records(records, {j: t for t, j in job_of_task.items()})
    energy = energy_growth_j(e0, _energy(reader)) if reader is not None else None
    first = min((r.submit_ts for r in runs if r.submit_ts), default=t_start)
    last = max((r.end_ts for r in runs if r.end_ts), default=t_end)
    smact, per_gpu = sm_activity_per_gpu(cfg, records, first, last)
    metrics = summarize(mode, len(tasks), runs, smact, energy, {t.index: t.work_s for t in tasks}, per_gpu)
    per_task = [{**asdict(r), "gpu": gpu_of.get(r.job_id)}
                for r in sorted(runs, key=lambda r: (r.task, r.job_id))]
    return ReplayRun(metrics=metrics, runs=runs, job_of_task=job_of_task, problems=problems,
                     per_task=per_task)


def note_gpus(records: Sequence[JobInfo], gpu_of: Dict[int, str]) -> None:
    """Note in ``gpu_of`` (job id -> ``node:index``) the first GPU each running job holds (``gres_detail``).
    """
    from slurm_coloc.slurm.placement import gpu_holdings

    for r in records:
        for node, idx, _name, _count in gpu_holdings(r):
            gpu_of.setdefault(r.job_id, f"{node}:{idx}")


def _placer_problems(mode: str, cfg: Config) -> List[str]:
    """For a placer mode: a problem line when no coloc-placer runs or it runs another ``placement_policy``."""
    wanted = placer_policy(mode)
    if wanted is None:
        return []
    from slurm_coloc.placement import heartbeat

    if not heartbeat.placer_alive(cfg):
        return ["no coloc-placer heartbeat: held jobs start only when a placer runs"]
    running = heartbeat.placer_policy(cfg)
    if running not in (None, wanted):
        return [f"the running coloc-placer's placement_policy is {running}, not {wanted}: this pass measured "
                f"the former"]
    return []


def _wait(cfg: Config, job_of_task: Dict[int, int], env: Dict[str, str], t_start: float, deadline_s: float,
          poll_s: float, clock: Callable[[], float], problems: List[str],
          gpu_of: Dict[int, str]) -> List[JobInfo]:
    """Poll until every replay job (OOM reruns included) is final, or cancel the rest at the deadline (a
    problem line), noting GPUs in ``gpu_of``; the last records."""
    task_of_job = {j: t for t, j in job_of_task.items()}

    def ours() -> List[JobInfo]:
        recs = [r for r in squeue_all(cfg.slurm_bin_dir, env)
                if r.job_id in task_of_job or runs_from_records([r], task_of_job)]
        note_gpus(recs, gpu_of)
        return recs
    while True:
        records = ours()
        if records and all(r.state in FINAL and not r.completing
                           for r in records) and len(records) >= len(task_of_job):
            return records
        if clock() - t_start > deadline_s:
            left = [r.job_id for r in records if r.state not in FINAL or r.completing]
            problems.append(f"deadline of {deadline_s:.0f} s reached: cancelled job(s) {left}")
            cancel(cfg, left, env)
            time.sleep(2.0)
            return ours()
        time.sleep(poll_s)


def submit_for_placer(argv: Sequence[str], cfg: Config,
                      env: Dict[str, str]) -> "subprocess.CompletedProcess[str]":
    """Plan with ``coloc-sbatch --dry-run``, then submit the plan held without GRES for coloc-placer (a
    whole-GPU plan as planned); sbatch's completed process. ColocError: the dry run failed or printed no
    sbatch command; SlurmError: sbatch missing or timed out."""
    from slurm_coloc.placement.heartbeat import placer_argv

    dry = subprocess.run([coloc_sbatch_path(), "--dry-run", *argv], capture_output=True, text=True, env=env,
                         timeout=120)
    line = next((ln for ln in dry.stdout.splitlines() if ln.startswith("sbatch ")), None)
    if dry.returncode != 0 or line is None:
        raise ColocError(f"coloc-sbatch --dry-run failed: {dry.stderr.strip() or dry.stdout.strip()}")
    planned = shlex.split(line)[1:]
    return slurm_jobs.sbatch(placer_argv(planned) or planned, cfg.slurm_bin_dir, env, timeout_s=120)


def cancel(cfg: Config, job_ids: Sequence[int], env: Dict[str, str]) -> None:
    """``scancel`` ``job_ids`` (none: nothing; Slurm's refusal ignored); SlurmError: missing or timed out."""
    cancel_jobs(job_ids, cfg.slurm_bin_dir, env)
