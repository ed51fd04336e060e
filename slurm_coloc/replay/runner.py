"""Submit a replay's tasks through coloc-sbatch at their scaled times and wait for them (and OOM reruns).

Policies: ``exclusive`` submits every task with ``--exclusive-gpu`` (one job per GPU at a time); ``blind``
(also called ``coloc``) with ``--coloc-mem <catalog peak + context_mib>M`` (shards + MPS, as a user who knows
the peak from an earlier run would; Slurm packs by memory only); ``gate`` (also called ``aware``) and
``throughput`` submit the same plan held and without
GRES (``placement.submit.placer_argv`` on ``coloc-sbatch --dry-run``'s command) for a running ``coloc-placer``
to steer. ``context_mib`` (default 1024) covers what the catalog's A100 peaks lack on our machine: the
CUDA context of a torch process (612 MiB on the H100, CUDA 13: docs/facts.md §12) and library workspaces.
Without it, the first H100 replay fenced sub-GiB tasks at 1 GiB and 4 of 8 died of OOM at ~1,010 MiB
(docs/benchmarks.md). Slurm commands go through ``slurm_coloc.slurm``; GPU energy is read through
``slurm_coloc.nvml``; SM activity comes from the sampler's per-node databases through ``slurm_coloc.store``.
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from slurm_coloc.config import Config
from slurm_coloc.errors import ColocError
from slurm_coloc.replay.metrics import (
    ReplayMetrics,
    RunRecord,
    energy_growth_j,
    mean_smact,
    runs_from_records,
    summarize,
)
from slurm_coloc.replay.trace import Task
from slurm_coloc.slurm.jobs import JobInfo, squeue_all
from slurm_coloc.slurm.parse import FINAL_STATES, expand_hostlist
from slurm_coloc.slurm.run import run as slurm_run

log = logging.getLogger("slurm_coloc.replay")
FINAL = FINAL_STATES
MODES = ("exclusive", "coloc", "blind", "aware", "gate", "throughput")
PLACER_POLICY = {"aware": "gate", "gate": "gate", "throughput": "throughput"}  # mode -> the placer's policy


@dataclass
class ReplayRun:
    """A finished replay: its metrics, every run record, job id -> task index, and problems met."""

    metrics: ReplayMetrics
    runs: List[RunRecord]
    job_of_task: Dict[int, int]
    problems: List[str] = field(default_factory=list)


DEFAULT_CONTEXT_MIB = 1024


def sbatch_argv(
    task: Task,
    mode: str,
    job_script: str,
    output: str,
    extra: Sequence[str] = (),
    context_mib: int = DEFAULT_CONTEXT_MIB,
) -> List[str]:
    """coloc-sbatch arguments (after the program name) for ``task`` in ``mode``.

    Coloc mode asks ``--coloc-mem=<mem_mib + context_mib>M``; a task of unknown memory gets a whole GPU.

    Raises:
        ColocError: unknown mode or a negative ``context_mib``.
    """
    if mode not in MODES:
        raise ColocError(f"unknown replay mode {mode!r} (use {' or '.join(MODES)})")
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


def sm_activity(cfg: Config, records: Sequence[object], t0: float, t1: float) -> Optional[float]:
    """Mean GPM SM activity (%) over [t0, t1] (epoch s) of the GPUs of the replay's nodes, from the sampler
    databases under ``cfg.state_dir``; ``records``: the replay's ``JobInfo`` records (their nodes). None: no
    sample (an unreadable database counts as none)."""
    from slurm_coloc.store.db import open_readonly
    from slurm_coloc.store.samples import load_gpu_samples

    nodes = sorted({n for r in records for n in parse_index_nodes(getattr(r, "nodes", ""))})
    samples: List[dict] = []
    for node in nodes:
        try:
            db = open_readonly(cfg.node_db_path(node))
            samples += load_gpu_samples(db, t0, t1, list(range(64)))
        except Exception as exc:  # unreadable db: metric NULL
            log.info("no samples for %s: %s", node, exc)
    return mean_smact(samples)


def sm_activity_per_gpu(cfg: Config, records: Sequence[object], t0: float,
                        t1: float) -> "tuple[Optional[float], Dict[str, Optional[float]]]":
    """(mean GPM SM activity % over every GPU of the replay's nodes, the same per ``node:gpu_index``) over
    [t0, t1] from the sampler databases; an idle GPU shows with its low mean."""
    from slurm_coloc.replay.metrics import mean_smact_per_gpu
    from slurm_coloc.store.db import open_readonly
    from slurm_coloc.store.samples import load_gpu_samples

    nodes = sorted({n for r in records for n in parse_index_nodes(getattr(r, "nodes", ""))})
    samples: List[dict] = []
    for node in nodes:
        try:
            db = open_readonly(cfg.node_db_path(node))
            samples += [{**row, "node": node} for row in load_gpu_samples(db, t0, t1, list(range(64)))]
        except Exception as exc:  # unreadable db: metric NULL
            log.info("no samples for %s: %s", node, exc)
    return mean_smact(samples), mean_smact_per_gpu(samples)


def parse_index_nodes(nodes: str) -> List[str]:
    """``n[1-2]`` / ``n1,n2`` -> node names (``slurm.parse.expand_hostlist``)."""
    return expand_hostlist(nodes)


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
    """Submit ``tasks`` at ``submit_s`` offsets, wait for them (and OOM reruns) until ``deadline_s`` after the
    start, cancel what is left then, and measure.

    Args:
        tasks: the scaled trace tasks (``replay.trace.build_tasks``).
        mode: ``exclusive`` | ``coloc`` | ``blind`` | ``aware`` | ``gate`` | ``throughput`` (``sbatch_argv``;
            the last three are held for a running coloc-placer, ``PLACER_POLICY``).
        cfg: ``slurm_bin_dir``, ``state_dir`` (the sampler databases) and the placer's heartbeat.
        job_script: the batch script each task runs (``<script> <workload> --steps N --tag T``).
        out_dir: where the jobs' output files go.
        deadline_s: seconds after the first submission after which what still runs is cancelled.
        extra_sbatch: more coloc-sbatch arguments for every task.
        poll_s: seconds between queue polls.
        clock: the wall clock (s), replaceable in tests.
        context_mib: added to each task's catalog peak in the coloc modes (MiB).

    Returns:
        The ``ReplayRun``: metrics (makespan, JCT, slowdown, SM activity %, energy J, OOM reruns), the runs,
        task index -> job id, and the problems seen (placer missing or of another policy, deadline reached).

    Raises:
        ColocError: a submission failed (the jobs already submitted are cancelled first).
    """
    env = dict(os.environ)
    reader = open_energy_reader()
    e0 = _energy(reader)
    t_start = clock()
    problems = _placer_problems(mode, cfg)
    job_of_task = _submit_tasks(tasks, mode, cfg, job_script, out_dir, extra_sbatch, context_mib, env,
                                t_start,
                                clock)
    task_of_job = {j: t for t, j in job_of_task.items()}
    records = _wait_for_jobs(cfg, task_of_job, env, t_start, deadline_s, clock, poll_s, problems)
    t_end = clock()
    runs = runs_from_records(records, task_of_job)
    energy = energy_growth_j(e0, _energy(reader)) if reader is not None else None
    first = min((r.submit_ts for r in runs if r.submit_ts), default=t_start)
    last = max((r.end_ts for r in runs if r.end_ts), default=t_end)
    smact, per_gpu = sm_activity_per_gpu(cfg, records, first, last)
    metrics = summarize(mode, len(tasks), runs, smact, energy, {t.index: t.work_s for t in tasks}, per_gpu)
    return ReplayRun(metrics=metrics, runs=runs, job_of_task=job_of_task, problems=problems)


def _placer_problems(mode: str, cfg: Config) -> List[str]:
    """For a mode held for ``coloc-placer``: a problem line when no placer runs or it runs another policy."""
    problems: List[str] = []
    if mode in PLACER_POLICY:
        from slurm_coloc.placement.daemon import placer_alive, placer_policy

        if not placer_alive(cfg):
            problems.append("no coloc-placer heartbeat: held jobs start only when a placer runs")
        elif placer_policy(cfg) not in (None, PLACER_POLICY[mode]):
            problems.append(f"the running coloc-placer's placement_policy is {placer_policy(cfg)}, not "
                            f"{PLACER_POLICY[mode]}: this pass measured the former")
    return problems


def _submit_tasks(tasks: Sequence[Task], mode: str, cfg: Config, job_script: str, out_dir: str,
                  extra_sbatch: Sequence[str], context_mib: int, env: Dict[str, str], t_start: float,
                  clock: Callable[[], float]) -> Dict[int, int]:
    """Submit each task at its ``submit_s`` offset from ``t_start`` (``clock`` seconds); returns task index ->
    job id.

    Raises:
        ColocError: a submission failed (the jobs already submitted are cancelled first).
    """
    job_of_task: Dict[int, int] = {}
    for task in sorted(tasks, key=lambda t: t.submit_s):
        delay = t_start + task.submit_s - clock()
        if delay > 0:
            time.sleep(delay)
        out = str(Path(out_dir) / f"replay-{mode}-{task.index}-%j.out")
        argv = sbatch_argv(task, mode, job_script, out, extra_sbatch, context_mib)
        if mode in PLACER_POLICY:
            proc = submit_for_placer(argv, cfg, env)
        else:
            proc = subprocess.run([coloc_sbatch_path(), *argv], capture_output=True, text=True, env=env,
                                  timeout=120)
        if proc.returncode != 0:
            cancel(cfg, list(job_of_task.values()), env)
            raise ColocError(f"coloc-sbatch failed for task {task.index}: {proc.stderr.strip()}")
        job_of_task[task.index] = int(proc.stdout.strip().split(";")[0])
        log.info("task %s -> job %s", task.index, job_of_task[task.index])
    return job_of_task


def _replay_records(cfg: Config, task_of_job: Dict[int, int], env: Dict[str, str]) -> List[JobInfo]:
    """The queue records of the replay's jobs and their OOM reruns."""
    return [
        r
        for r in squeue_all(cfg.slurm_bin_dir, env)
        if r.job_id in task_of_job or runs_from_records([r], task_of_job)
    ]


def _wait_for_jobs(cfg: Config, task_of_job: Dict[int, int], env: Dict[str, str], t_start: float,
                   deadline_s: float,
                   clock: Callable[[], float], poll_s: float, problems: List[str]) -> List[JobInfo]:
    """Poll every ``poll_s`` seconds until every job has ended, or cancel what is left once ``deadline_s``
    have passed since ``t_start`` (``clock`` seconds; adding a problem line). Returns the last records."""
    while True:
        records = _replay_records(cfg, task_of_job, env)
        if records and all(r.state in FINAL and not r.completing
                           for r in records) and len(records) >= len(task_of_job):
            return records
        if clock() - t_start > deadline_s:
            left = [r.job_id for r in records if r.state not in FINAL or r.completing]
            problems.append(f"deadline of {deadline_s:.0f} s reached: cancelled job(s) {left}")
            cancel(cfg, left, env)
            time.sleep(2.0)
            return _replay_records(cfg, task_of_job, env)
        time.sleep(poll_s)


def submit_for_placer(argv: Sequence[str], cfg: Config,
                      env: Dict[str, str]) -> "subprocess.CompletedProcess[str]":
    """Plan with ``coloc-sbatch --dry-run``, then submit the plan held without GRES for coloc-placer (a
    whole-GPU plan is submitted as planned). Returns sbatch's completed process (stdout: the job id with
    ``--parsable``).

    Raises:
        ColocError: the dry run failed or printed no sbatch command.
    """
    from slurm_coloc.placement.submit import placer_argv

    dry = subprocess.run([coloc_sbatch_path(), "--dry-run", *argv], capture_output=True, text=True, env=env,
                         timeout=120)
    line = next((ln for ln in dry.stdout.splitlines() if ln.startswith("sbatch ")), None)
    if dry.returncode != 0 or line is None:
        raise ColocError(f"coloc-sbatch --dry-run failed: {dry.stderr.strip() or dry.stdout.strip()}")
    planned = shlex.split(line)[1:]
    return slurm_run(["sbatch", *(placer_argv(planned) or planned)], bin_dir=cfg.slurm_bin_dir, env=env,
                     check=False, timeout_s=120)


def cancel(cfg: Config, job_ids: Sequence[int], env: Dict[str, str]) -> None:
    """``scancel`` the given jobs (ignored when none)."""
    if job_ids:
        slurm_run(["scancel", *[str(j) for j in job_ids]], bin_dir=cfg.slurm_bin_dir, env=env, check=False)
