"""Slurm side of coloc-placer: typed-shard nodes' GPUs, who holds their shards, the held jobs waiting, and the
updates that steer one to a GPU (measured on 22.05.8: benchmarks/placement_mechanism.py). gres.conf types GPU
``i`` ``g<i>``; a held job without GRES takes ``scontrol update jobid=N NodeList=<node> Gres=shard:g<i>:<n>``
and runs on exactly that GPU after ``scontrol release``. A job that has a shard GRES cannot be moved (untyped
-> typed is refused, typed -> other type ADDS the type), so the placer only takes jobs without GRES.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple

from slurm_coloc.comment import COMMENT_TAG, WAIT_TAG, JobComment, strip_wait, wait_comment
from slurm_coloc.slurm.jobinfo import JobInfo
from slurm_coloc.slurm.jobs import squeue_all
from slurm_coloc.slurm.parse import gres_detail_counts
from slurm_coloc.slurm.run import run

_TYPED = re.compile(r"^(?P<name>gpu|shard):g(?P<idx>\d+):(?P<count>\d+)")
HELD_REASONS = ("JobHeldUser", "JobHeldAdmin")


@dataclass(frozen=True)
class NodeGpus:
    """One node's typed GPUs: ``shards`` maps GPU index -> shards configured on it."""

    node: str
    state: str
    shards: Dict[int, int]


_NODE_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/]*)=")


def parse_node_kv(line: str) -> Dict[str, str]:
    """One ``scontrol show node -o`` line -> ``{key: value}``; the first occurrence of a key wins. Node lines
    hold only admin-set text, so splitting at `` Key=`` is safe; job records are read from JSON."""
    out: Dict[str, str] = {}
    marks = list(_NODE_KEY.finditer(line.strip()))
    text = line.strip()
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        out.setdefault(m.group(1), text[m.end():end].strip())
    return out


def parse_node_gres(line: str) -> Optional[NodeGpus]:
    """A ``scontrol show node -o`` line's typed GPUs (``Gres=shard:g0:80,...`` -> ``{0: 80}``) or None."""
    kv = parse_node_kv(line)
    shards: Dict[int, int] = {}
    for part in (kv.get("Gres") or "").split(","):
        m = _TYPED.match(part.strip())
        if m and m.group("name") == "shard":
            shards[int(m.group("idx"))] = int(m.group("count"))
    if not kv.get("NodeName") or not shards:
        return None
    return NodeGpus(kv["NodeName"], kv.get("State", ""), shards)


def typed_nodes(bin_dir: str = "/usr/bin", env: Optional[Mapping[str, str]] = None) -> List[NodeGpus]:
    """Nodes with typed shards that take jobs (not DOWN/DRAIN/FAIL); SlurmError: scontrol failed."""
    out = []
    for line in run(["scontrol", "show", "node", "-o"], bin_dir=bin_dir, env=env,
                    timeout_s=15).stdout.splitlines():
        n = parse_node_gres(line)
        if n and not any(s in n.state for s in ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING")):
            out.append(n)
    return out


def gpu_holdings(job: JobInfo) -> List[Tuple[str, int, str, int]]:
    """``(node, gpu index, gres name, count)`` per GPU a running job holds, from ``gres_detail`` (a whole-GPU
    entry counts as all the GPU's shards)."""
    return [(job.nodes, i, name, count) for name, _type, per in gres_detail_counts(job.gres_detail)
            if name in ("gpu", "shard") for i, count in sorted(per.items()) if count]


def placer_shards(job: JobInfo) -> Optional[int]:
    """The shards (GiB) of a job the placer steers: pending, held, without GRES, with a valid coloc comment
    with ``place`` true and ``shards`` set; else None (a comment that breaks the protocol: one warning)."""
    if not (job.state == "PENDING" and job.raw.get("state_reason") in HELD_REASONS
            and not (job.tres_per_node or "").replace("gres:", "").replace("gres/", "").strip()):
        return None
    return JobComment.read(job.comment, job.job_id).placed_shards


def is_candidate(job: JobInfo) -> bool:
    return placer_shards(job) is not None


def queue(bin_dir: str = "/usr/bin", env: Optional[Mapping[str, str]] = None) -> List[JobInfo]:
    """Every job slurmctld knows; SlurmError: squeue failed, timed out or unparsable."""
    return squeue_all(bin_dir, env, timeout_s=30)


def steer(job_id: int, node: str, index: int, shards: int, comment: str, bin_dir: str = "/usr/bin",
          env: Optional[Mapping[str, str]] = None) -> None:
    """Give held ``job_id`` ``shards`` (GiB) of GPU ``index`` on ``node``, clear a ``coloc-wait:`` note,
    release it. SlurmError: an update or the release failed (the job stays held; the next round retries)."""
    argv = ["scontrol", "update", f"jobid={int(job_id)}", f"NodeList={node}",
            f"Gres=shard:g{int(index)}:{int(shards)}"]
    if comment.startswith(WAIT_TAG):
        argv.append("Comment=" + strip_wait(comment))
    run(argv, bin_dir=bin_dir, env=env, timeout_s=15)
    run(["scontrol", "release", str(int(job_id))], bin_dir=bin_dir, env=env, timeout_s=15)


def admin_hold(job_id: int, bin_dir: str = "/usr/bin", env: Optional[Mapping[str, str]] = None) -> None:
    """``scontrol hold N`` (root): ``JobHeldUser`` -> ``JobHeldAdmin``, not user-releasable; SlurmError."""
    run(["scontrol", "hold", str(int(job_id))], bin_dir=bin_dir, env=env, timeout_s=15)


def release_memory_only(job_id: int, shards: int, comment: str, bin_dir: str = "/usr/bin",
                        env: Optional[Mapping[str, str]] = None) -> None:
    """Give held ``job_id`` an untyped ``shard:<n>`` request (packed by memory alone), clear a wait note,
    release it; SlurmError: an update or the release failed."""
    argv = ["scontrol", "update", f"jobid={int(job_id)}", f"Gres=shard:{int(shards)}"]
    if comment.startswith(WAIT_TAG):
        argv.append("Comment=" + strip_wait(comment))
    run(argv, bin_dir=bin_dir, env=env, timeout_s=15)
    run(["scontrol", "release", str(int(job_id))], bin_dir=bin_dir, env=env, timeout_s=15)


def note_wait(job_id: int, reason: str, comment: str, bin_dir: str = "/usr/bin",
              env: Optional[Mapping[str, str]] = None) -> None:
    """Comment ``coloc-wait:<reason>|...`` on a held job (``squeue -o '%i %r %k'`` shows it); no-op if
    unchanged or lossy. SlurmError: the update failed."""
    text = wait_comment(reason, comment)
    if text != comment and COMMENT_TAG in text:
        run(["scontrol", "update", f"jobid={int(job_id)}", f"Comment={text}"], bin_dir=bin_dir, env=env,
            timeout_s=15)
