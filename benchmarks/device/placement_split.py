"""The ``split`` pass of the placement benchmark (``placement_passes.py``): a placer with a fixed decision. While
its jobs are submitted it writes the placer's heartbeat, so ``coloc-sbatch`` gives them the held, GRES-less form
that ``coloc-placer`` steers (Slurm refuses a typed ``shard:g<i>:N`` on a job submitted with an untyped
``shard:N``); then it gives each job the GPU a split names and releases them all at once, as the placer steers a
job. It measures on the device what a split found by ``benchmarks/placement_best_split.py`` gives, with every job
started on arrival.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import List, Mapping, Tuple

from slurm_coloc.comment import JobComment
from slurm_coloc.config import Config
from slurm_coloc.placement.heartbeat import heartbeat_paths, write_heartbeat
from slurm_coloc.slurm.jobs import squeue_all
from slurm_coloc.slurm.placement import steer


def stand_in(cfg: Config, on: bool) -> None:
    """Write (``on``) or remove the placer's heartbeat, so that ``coloc-sbatch`` submits for a placer."""
    if on:
        write_heartbeat(cfg, {"placement_policy": "split"})
    else:
        for path in heartbeat_paths(cfg):
            path.unlink(missing_ok=True)


def split_plan(job_of: Mapping[int, int], gpu_of: Mapping[int, int],
               shards_of: Mapping[int, int], comment_of: Mapping[int, str]) -> List[Tuple[int, int, int, str]]:
    """What to steer: ``(job_id, gpu_index, shards, comment)`` per job, in job index order.

    Args:
        job_of: job index -> Slurm job id; gpu_of: job index -> GPU index; shards_of: Slurm job id -> its shard
            request for the placer (absent or 0: not found held with one); comment_of: Slurm job id -> its comment.

    Raises:
        KeyError: a job without a GPU in ``gpu_of``; ValueError: a job without a shard request.
    """
    plan = []
    for index in sorted(job_of):
        job_id = job_of[index]
        if not shards_of.get(job_id):
            raise ValueError(f"split: job {job_id} (index {index}) not found held with a shard request")
        plan.append((job_id, int(gpu_of[index]), int(shards_of[job_id]), comment_of.get(job_id, "")))
    return plan


def steer_split(job_of: Mapping[int, int], gpu_of: Mapping[int, int], node: str, bin_dir: str,
                env: Mapping[str, str]) -> None:
    """Give every held job (``job_of``: job index -> Slurm job id) its shard request on GPU ``gpu_of[index]`` of
    ``node`` and release it (``slurm.placement.steer``), all at once (one thread each).

    Raises:
        What ``split_plan`` raises; SlurmError: squeue, an update or a release failed.
    """
    recs = squeue_all(bin_dir, env)
    plan = split_plan(job_of, gpu_of, {r.job_id: JobComment.read(r.comment, r.job_id).placed_shards or 0
                                       for r in recs},
                      {r.job_id: r.comment or "" for r in recs})
    with ThreadPoolExecutor(max_workers=max(1, len(plan))) as pool:
        list(pool.map(lambda p: steer(p[0], node, p[1], p[2], p[3], bin_dir, env), plan))
