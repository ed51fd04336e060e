"""Turning coloc-sbatch's sbatch argv into a submission for coloc-placer. Pure.

The placer can steer only a held job without GRES (docs/design.md, "Placement mechanism"), so a shared job's
``--gres=shard:N`` is dropped, ``--hold`` added, and ``"place": true`` put into its coloc comment (``shards``
is already there; ``JobComment.with_place``). Whole-GPU and multi-GPU submissions are returned unchanged: the
placer leaves them to Slurm.
"""
from __future__ import annotations

import re
from typing import List, Optional, Sequence

from slurm_coloc.comment import JobComment

_SHARD = re.compile(r"^shard:(\d+)$")


def placer_argv(argv: Sequence[str]) -> Optional[List[str]]:
    """The held, GRES-less form of coloc-sbatch's sbatch ``argv`` (program name excluded; a new list,
    ``--hold`` first), or None when it is not a shared shard job (its first ``--gres=`` is not ``shard:N``
    alone, or no valid coloc comment of mode ``shard`` follows it). The rewritten comment is that
    ``JobComment`` with ``place``: the user's text in front, then its validated fields.

    coloc-sbatch writes ``--gres=...`` then ``--comment=...`` before the script and removes the user's GPU
    options, so the first ``--gres=`` and the first ``--comment=`` after it are its own; the script's
    arguments are never touched. ``["-t", "30", "--gres=shard:4", "--comment=coloc:{...}", "job.sh"]`` ->
    ``["--hold", "-t", "30", "--comment=coloc:{..."place":true...}", "job.sh"]``.
    """

    args = list(argv)
    g = next((i for i, a in enumerate(args) if a.startswith("--gres=")), None)
    if g is None or not _SHARD.match(args[g].split("=", 1)[1]):
        return None
    c = next((i for i in range(g + 1, len(args)) if args[i].startswith("--comment=")), None)
    if c is None:
        return None
    coloc = JobComment.read(args[c].split("=", 1)[1])
    if coloc.mode != "shard":
        return None
    args[c] = coloc.with_place().comment_arg()
    del args[g]
    return ["--hold", *args]
