"""What submitters need of coloc-placer (light: ``coloc-sbatch`` imports this, not the placer's loop): its
heartbeat file, rewritten after each round (is a placer alive, so submit held for it; which policy runs), and
``placer_argv``: the placer steers only a held job without GRES (docs/design.md), so a shared job's
``--gres=shard:N`` is dropped, ``--hold`` added and ``"place": true`` put into its coloc comment."""
from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path
from typing import List, Mapping, Optional, Sequence

from slurm_coloc.atomic import write_atomic
from slurm_coloc.comment import JobComment
from slurm_coloc.config import Config

log = logging.getLogger("slurm_coloc.placer")
_SHARD = re.compile(r"^shard:(\d+)$")


def heartbeat_paths(cfg: Config) -> List[Path]:
    """``<state_dir>/placer.json`` (admins; ``state_dir`` is root/admin-group only) and a world-readable copy
    ``<run_dir>/placer.json``, which ``coloc-sbatch`` reads where ``run_dir`` is shared with the login nodes.
    """
    return [Path(cfg.state_dir) / "placer.json", Path(cfg.run_dir) / "placer.json"]


def write_heartbeat(cfg: Config, summary: Mapping[str, object]) -> None:
    """Write the heartbeat files, 0644: ``summary`` (JSON values) with ``ts`` (Unix s) and ``pid``; a copy
    that cannot be written is skipped with a warning. OSError: none could be (the first copy's error)."""
    text = json.dumps({"ts": time.time(), "pid": os.getpid(), **summary}, sort_keys=True)
    errors = []
    for path in heartbeat_paths(cfg):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, text.encode(), 0o644)
        except OSError as exc:
            errors.append(exc)
            log.warning("heartbeat %s not written: %s", path, exc)
    if len(errors) == len(heartbeat_paths(cfg)):
        raise errors[0]


def clear_heartbeat(cfg: Config) -> None:
    """Remove the heartbeat files on a clean stop (later jobs are not held for a gone placer); logs failures.
    """
    for path in heartbeat_paths(cfg):
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("heartbeat %s not removed: %s", path, exc)


def placer_alive(cfg: Config, max_age_s: Optional[float] = None) -> bool:
    """Whether the first readable heartbeat is at most ``max_age_s`` old (s; default 5 x
    ``placement_interval_s`` + 30 s) and not in the future."""
    limit = max_age_s if max_age_s is not None else 5 * cfg.placement_interval_s + 30
    for path in heartbeat_paths(cfg):
        try:
            ts = float(json.loads(path.read_text())["ts"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        return 0 <= time.time() - ts <= limit
    return False


def placer_policy(cfg: Config) -> Optional[str]:
    """The readable heartbeat's ``placement_policy``; None without one or without a text policy."""
    for path in heartbeat_paths(cfg):
        try:
            policy = json.loads(path.read_text()).get("policy")
        except (OSError, ValueError, AttributeError):
            continue
        return policy if isinstance(policy, str) else None
    return None


def placer_argv(argv: Sequence[str]) -> Optional[List[str]]:
    """The held, GRES-less form of coloc-sbatch's sbatch ``argv`` (program name excluded; ``--hold`` first),
    or None when its first ``--gres=`` is not ``shard:N`` alone or no coloc comment of mode ``shard`` follows
    it; both are coloc-sbatch's own, written before the script, whose arguments are never touched."""
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
