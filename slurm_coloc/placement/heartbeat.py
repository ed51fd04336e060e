"""coloc-placer's heartbeat: the file a running placer rewrites after each round, and what its readers ask
of it (``coloc-sbatch``: is a placer alive, so submit held for it; ``coloc-replay``: which policy runs; the
fallback release: none alive). Light on purpose: ``coloc-sbatch`` imports this, not the placer's loop.
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import List, Mapping, Optional

from slurm_coloc.atomic import write_atomic
from slurm_coloc.config import Config

log = logging.getLogger("slurm_coloc.placer")


def heartbeat_paths(cfg: Config) -> List[Path]:
    """``<state_dir>/placer.json`` (admins, shared with the node databases) and a world-readable copy
    ``<run_dir>/placer.json`` for job users (``state_dir`` is root/admin-group only), which ``coloc-sbatch``
    reads on the same host or where ``run_dir`` is shared with the login nodes.
    """
    return [Path(cfg.state_dir) / "placer.json", Path(cfg.run_dir) / "placer.json"]


def write_heartbeat(cfg: Config, summary: Mapping[str, object]) -> None:
    """Write the heartbeat files, 0644: ``summary`` (JSON values) with ``ts`` (Unix s) and ``pid``.

    A copy that cannot be written (directory missing or read-only) is skipped with a warning.

    Raises:
        OSError: no copy could be written (the first copy's error).
    """
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
    """Remove the heartbeat files on a clean stop, so later jobs are not held for a gone placer; one that
    cannot be removed is logged and left (it goes stale).
    """
    for path in heartbeat_paths(cfg):
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("heartbeat %s not removed: %s", path, exc)


def placer_alive(cfg: Config, max_age_s: Optional[float] = None) -> bool:
    """Whether a placer finished a round within ``max_age_s`` (s; default 5 x ``placement_interval_s`` + 30 s)
    and not in the future, from the first readable heartbeat file; none readable: False.
    """
    limit = max_age_s if max_age_s is not None else 5 * cfg.placement_interval_s + 30
    for path in heartbeat_paths(cfg):
        try:
            ts = float(json.loads(path.read_text())["ts"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        return 0 <= time.time() - ts <= limit
    return False


def placer_policy(cfg: Config) -> Optional[str]:
    """The readable heartbeat's ``placement_policy`` (``blind``, ``aware``, ...); None without one or without
    a text policy.
    """
    for path in heartbeat_paths(cfg):
        try:
            policy = json.loads(path.read_text()).get("policy")
        except (OSError, ValueError, AttributeError):
            continue
        return policy if isinstance(policy, str) else None
    return None
