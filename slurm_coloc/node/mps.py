"""CUDA MPS for the jobs of shared GPUs, as the node Prolog/Epilog use it (runs as root): ``acquire``
registers a job with the daemon of its GPU, starting the daemon if need be, and ``release`` unregisters it,
stopping a daemon left with no member (node/mps_daemon.py: the daemons' layout, start and stop).

Each daemon's root-owned directory holds ``members/<job_id>`` (one file per shared job using the daemon, with
its grant in MiB) and ``lock`` (flock serialising concurrent Prologs/Epilogs of that daemon); under that lock
the daemon's per-client ceiling and the GPU's compute mode follow the members (node/mps_guard.py). Every
failure is returned, never raised, so the job can run without MPS (time-slicing) and the node is not drained.
"""
from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from slurm_coloc.config import Config
from slurm_coloc.node import mps_guard
from slurm_coloc.node.mps_daemon import (
    MpsDaemon,
    MpsOutcome,
    control_sender,
    daemon_for,
    resolve_binary,
    root_dir,
    start,
    stop,
)


class _Lock:
    """flock on ``path`` with a bounded wait."""

    def __init__(self, path: Path, timeout_s: float) -> None:
        self.path, self.timeout_s, self.fd = path, timeout_s, -1

    def __enter__(self) -> "_Lock":
        self.fd = os.open(str(self.path), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > deadline:
                    os.close(self.fd)
                    raise TimeoutError(f"MPS lock {self.path} busy for {self.timeout_s:g} s") from None
                time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def _ceiling(cfg: Config, d: MpsDaemon, binary: str, joining: Optional[str]) -> Dict[str, Any]:
    """Set the daemon's per-client ceiling to what ``mps_guard.plan_ceiling`` says (under the daemon's
    lock)."""
    if not cfg.mps_ceiling:
        return {}
    grants = mps_guard.member_grants(d.members_dir, cfg.gpu_mem_gib * mps_guard.MIB_PER_GIB)
    new = mps_guard.plan_ceiling(grants, mps_guard.read_int(d.root / mps_guard.CEILING_FILE), joining)
    if new is None:
        return {}
    res = mps_guard.apply_ceiling(control_sender(cfg, d, binary), new)
    if not res["errors"]:
        (d.root / mps_guard.CEILING_FILE).write_text(f"{new}\n")
    return {"ceiling": res}


def acquire(cfg: Config, job_id: int, gpu_index: int, uuid: Optional[str],
            env: Optional[Dict[str, str]] = None, uid: Optional[int] = None, grant_mib: Optional[int] = None,
            modes: Any = None) -> MpsOutcome:
    """Make sure a daemon serves GPU ``gpu_index`` (``uid``'s in per-user mode); register ``job_id`` with it.

    ``grant_mib`` (the job's shards) goes into its member file and the daemon's ceiling; ``modes`` replaces
    NVML for ``mps_compute_mode`` (tests). ``ok`` False (``mps-missing`` / ``mps-start-failed`` /
    ``mps-error``): the job runs without MPS. Never raises: every error becomes an ``mps-error`` outcome.
    """
    try:
        d = daemon_for(cfg, gpu_index, uuid, uid)
    except ValueError as exc:
        return MpsOutcome(False, "mps-error", None, {"error": str(exc)})
    binary = resolve_binary(cfg, env)
    if binary is None:
        return MpsOutcome(False, "mps-missing", d, {"binary": cfg.mps_control_bin})
    try:
        root_dir(d.root)
        root_dir(d.members_dir)
        with _Lock(d.root / "lock", cfg.mps_start_timeout_s):
            first = not any(not p.name.startswith(".") for p in d.members_dir.iterdir())
            guard = mps_guard.set_exclusive(cfg, d.root, d.gpu_index, modes) if first else {}
            out = start(cfg, d, binary)
            if out.ok:
                if out.event == "mps-start":  # a new daemon has no limit yet, whatever an old one had
                    (d.root / mps_guard.CEILING_FILE).unlink(missing_ok=True)
                mps_guard.write_member(d.members_dir, job_id, grant_mib)
                guard.update(_ceiling(cfg, d, binary, str(int(job_id))))
            elif first:
                guard.update(mps_guard.restore_mode(d.root, modes))  # time-sliced tenants need the old mode
            out.detail.update(guard, key=d.key)
            return out
    except Exception as exc:  # MPS trouble must never fail the job or drain the node
        return MpsOutcome(False, "mps-error", d, {"error": f"{type(exc).__name__}: {exc}"})


def job_daemons(cfg: Config, job_id: int) -> List[MpsDaemon]:
    """Daemons listing ``job_id`` as member, from directory names (``gpu_index`` -1 when by UUID)."""
    base = Path(cfg.run_dir) / "mps"
    out = []
    for member in sorted(base.glob(f"*/members/{int(job_id)}")):
        root = member.parent.parent
        key, sep, uid_s = root.name.rpartition(".uid")
        if not (sep and uid_s.isdigit()):
            key, uid_s = root.name, ""
        index = int(key[3:]) if key.startswith("idx") and key[3:].isdigit() else -1
        out.append(MpsDaemon(key=key, gpu_index=index, visible=key if index < 0 else str(index), root=root,
                             uid=int(uid_s) if uid_s else None))
    return out


def release(cfg: Config, job_id: int, env: Optional[Dict[str, str]] = None,
            modes: Any = None) -> List[MpsOutcome]:
    """Unregister ``job_id`` from its daemons and follow the members left (one outcome per daemon).

    A daemon left with no member stops unless ``mps_keep_warm``; the ceiling drops to the largest remaining
    grant; the compute mode is restored after the last member. Outcomes: ``mps-kept``, ``mps-kept-warm``,
    ``stop``'s or ``mps-error`` (a daemon's errors never raise).
    """
    outcomes = []
    binary = resolve_binary(cfg, env) or cfg.mps_control_bin
    for d in job_daemons(cfg, job_id):
        try:
            with _Lock(d.root / "lock", cfg.mps_start_timeout_s):
                (d.members_dir / str(int(job_id))).unlink(missing_ok=True)
                left = [p.name for p in d.members_dir.iterdir() if not p.name.startswith(".")]
                if left:
                    outcomes.append(MpsOutcome(True, "mps-kept", d, {"members": len(left), "key": d.key,
                                                                     **_ceiling(cfg, d, binary, None)}))
                    continue
                if cfg.mps_keep_warm:
                    out = MpsOutcome(True, "mps-kept-warm", d, {"key": d.key})
                else:
                    out = stop(cfg, d, binary)
                    out.detail["key"] = d.key
                out.detail.update(mps_guard.restore_mode(d.root, modes))
                outcomes.append(out)
        except Exception as exc:
            outcomes.append(MpsOutcome(False, "mps-error", d, {"error": f"{type(exc).__name__}: {exc}"}))
    return outcomes
