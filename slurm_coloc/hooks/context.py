"""What a Slurm hook knows about its job, read from its environment (docs/facts.md §5), as one dataclass.

Pure: takes a mapping, never reads files or runs Slurm. slurmd/slurmctld set these variables from the job
record, each value whole (a job name holding ``Key=value`` text or a newline stays one value). Values users
choose (job name, comment) are kept as opaque text: nothing here is executed, imported or parsed for fields.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from slurm_coloc.errors import ColocError
from slurm_coloc.slurm.parse import decode_exit_code, parse_index_list


def _int(value: Optional[str]) -> Optional[int]:
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        return None


@dataclass(frozen=True)
class HookContext:
    """The job as a Prolog/Epilog/PrologSlurmctld/EpilogSlurmctld/TaskProlog sees it.

    Attributes:
        context: ``SLURM_SCRIPT_CONTEXT`` (``prolog_slurmd``, ``epilog_slurmctld``, ...); empty for
            TaskProlog.
        uid / gid: ``SLURM_JOB_UID`` / ``SLURM_JOB_GID`` (every root hook has both).
        job_name: ``SLURM_JOB_NAME`` (the slurmctld hooks only; empty in the node Prolog/Epilog).
        gpus: global GPU indices from ``SLURM_JOB_GPUS`` (node hooks only).
        exit_code / signal: decoded ``SLURM_JOB_EXIT_CODE`` (epilogs only; a timeout shows 0/0: docs/facts.md
            §5).
    """

    job_id: Optional[int]
    context: str
    uid: Optional[int]
    gid: Optional[int]
    user_name: str
    job_name: str
    partition: str
    node: str
    node_list: str
    gpus: tuple
    comment: str
    restart_count: int
    exit_code: Optional[int]
    signal: Optional[int]
    spank_mem: Optional[str]
    spank_share: Optional[str]

    @property
    def job(self) -> int:
        """``job_id``, for a hook that needs one.

        Raises:
            ColocError: the environment named no job (``SLURM_JOB_ID`` missing or not a number).
        """
        if self.job_id is None:
            raise ColocError("no SLURM_JOB_ID in the hook's environment")
        return self.job_id

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "HookContext":
        """Built from a hook's environment (pure); missing variables and a non-integer id: None/empty."""
        raw_ec = _int(env.get("SLURM_JOB_EXIT_CODE"))
        code, sig = decode_exit_code(raw_ec) if raw_ec is not None else (None, None)
        return cls(
            job_id=_int(env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")),
            context=env.get("SLURM_SCRIPT_CONTEXT", ""),
            uid=_int(env.get("SLURM_JOB_UID") or env.get("SLURM_UID")),
            gid=_int(env.get("SLURM_JOB_GID")),
            user_name=env.get("SLURM_JOB_USER", "") or env.get("USER", ""),
            job_name=env.get("SLURM_JOB_NAME", ""),
            partition=env.get("SLURM_JOB_PARTITION", ""),
            node=env.get("SLURMD_NODENAME", ""),
            node_list=env.get("SLURM_JOB_NODELIST", "") or env.get("SLURM_NODELIST", ""),
            gpus=tuple(parse_index_list(env.get("SLURM_JOB_GPUS", ""))),
            comment=env.get("SLURM_JOB_COMMENT", ""),
            restart_count=_int(env.get("SLURM_JOB_RESTART_COUNT")) or 0,
            exit_code=code,
            signal=sig,
            spank_mem=env.get("SPANK_COLOC_MEM"),
            spank_share=env.get("SPANK_COLOC_SHARE"),
        )
