"""CUDA MPS for the jobs of shared GPUs, as the node Prolog/Epilog use it (runs as root): ``acquire``
registers a job with the daemon of its GPU, starting the daemon if need be, and ``release`` unregisters it,
stopping a daemon left with no member (node/mps_daemon.py: the daemons' layout, start and stop).

Each daemon's root-owned directory holds ``members/<job_id>`` (one file per shared job using the daemon, with
its grant in MiB) and ``lock`` (flock serialising concurrent Prologs/Epilogs of that daemon). Under that lock
what MPS itself can enforce follows the members:

**Per-client ceiling** (``mps_ceiling``). Measured on the H100 (docs/node.md "What MPS enforces"): a client's
own ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` is advisory (a job can raise it), but a limit given to the control
daemon binds every client, per client, whatever its environment says (a lower value of its own is kept):
``set_default_device_pinned_mem_limit <dev> <value>`` for servers started afterwards and
``set_device_pinned_mem_limit <server pid> <dev> <value>`` for clients that connect to a running server
afterwards. One daemon serves every job on its GPU (``-M``) or one user's jobs (per-user), so the strongest
ceiling that keeps every tenant's grant is the largest grant among the daemon's members: raised when a larger
grant arrives, lowered when the largest member leaves (it then binds only clients that connect afterwards; the
remaining tenants' grants are all below it).

**Compute mode** (``mps_compute_mode: exclusive-process``). When a GPU gets its first shard member the Prolog
records its compute mode in ``<root>/compute_mode.prev`` and sets ``EXCLUSIVE_PROCESS`` (before the daemon
starts: NVIDIA's MPS documentation), so only the MPS server can open a context; when the last member leaves,
the Epilog restores the recorded mode (only through ``slurm_coloc.nvml``).

Every failure is returned, never raised, so the job can run without MPS (time-slicing) and the node is not
drained.
"""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from slurm_coloc.atomic import write_atomic
from slurm_coloc.config import Config
from slurm_coloc.node.mps_daemon import (
    Control,
    MpsDaemon,
    MpsOutcome,
    control_sender,
    daemon_for,
    resolve_binary,
    root_dir,
    start,
    stop,
)

if TYPE_CHECKING:
    from slurm_coloc.nvml.reader import ComputeModes

log = logging.getLogger("slurm_coloc.node.mps")

CEILING_FILE = "ceiling_mib"
PREV_MODE_FILE = "compute_mode.prev"
MIB_PER_GIB = 1024


def limit_value(mib: int) -> str:
    """The limit as MPS writes it: ``<n>G`` for whole GiB (every shard grant), else ``<n>M``."""
    return f"{mib // MIB_PER_GIB}G" if mib % MIB_PER_GIB == 0 else f"{int(mib)}M"


def write_member(members_dir: Path, job_id: int, grant_mib: Optional[int]) -> None:
    """Write ``members/<job_id>`` (root-owned 0644): the grant in MiB, empty when None (the whole GPU).
    Raises OSError."""
    write_atomic(members_dir / str(int(job_id)), b"" if grant_mib is None else f"{int(grant_mib)}\n".encode(),
                 0o644)


def member_grants(members_dir: Path, full_mib: int) -> Dict[str, int]:
    """``{job id: grant MiB}`` of the daemon's members; an empty or unreadable file counts as ``full_mib``.
    Raises OSError: the directory cannot be listed."""
    out: Dict[str, int] = {}
    for p in members_dir.iterdir():
        if p.name.startswith("."):
            continue
        try:
            text = p.read_text().strip()
        except OSError:
            text = ""
        out[p.name] = int(text) if text.isdigit() else full_mib
    return out


def read_int(path: Path) -> Optional[int]:
    """An integer file of ours, None when absent or not an integer."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def plan_ceiling(grants: Dict[str, int], current_mib: Optional[int], joining: Optional[str]) -> Optional[int]:
    """The ceiling (MiB) to set now, or None to leave it; ``joining`` None: a member leaves. A join raises it
    to the largest grant, never lowers it (a running tenant may hold up to it); a leave lowers it to the
    largest remaining grant; no member left: left for the next Prolog."""
    if not grants:
        return None
    top = max(grants.values())
    if current_mib is None or (joining is not None and set(grants) == {joining}):
        return top if top != current_mib else None
    if joining is not None:
        return top if top > current_mib else None
    return top if top < current_mib else None


def apply_ceiling(control: Control, mib: int) -> Dict[str, Any]:
    """Send ``limit_value(mib)`` on device 0: the default for new servers, then each running server's limit;
    ``{"ceiling_mib", "sent": [commands], "errors": [...]}``. Never raises."""
    value = limit_value(mib)
    out: Dict[str, Any] = {"ceiling_mib": mib, "sent": [], "errors": []}

    def send(cmd: str) -> str:
        out["sent"].append(cmd)
        try:
            res = control(cmd)
        except (OSError, subprocess.TimeoutExpired, KeyError) as exc:
            out["errors"].append(f"{cmd}: {type(exc).__name__}: {exc}")
            return ""
        text = (res.stdout or "").strip()
        if res.returncode != 0 or "error" in text.lower() or "invalid" in text.lower():
            out["errors"].append(f"{cmd}: rc={res.returncode} {text[-200:]} "
                                 f"{(res.stderr or '').strip()[-200:]}")
        return text

    send(f"set_default_device_pinned_mem_limit 0 {value}")
    servers: List[str] = [s for s in send("get_server_list").split() if s.isdigit()]
    for pid in servers:
        send(f"set_device_pinned_mem_limit {pid} 0 {value}")
    return out


def set_exclusive(cfg: Config, root: Path, gpu_index: int, modes: Optional[ComputeModes]) -> Dict[str, Any]:
    """First shard member: record the compute mode in ``<root>/compute_mode.prev``, set ``EXCLUSIVE_PROCESS``
    (``modes`` None: NVML); the detail, {} when not configured. Never raises."""
    if cfg.mps_compute_mode != "exclusive-process":
        return {}
    try:
        modes = modes if modes is not None else _nvml_modes()
        prev = modes.get(gpu_index)
        if prev != "EXCLUSIVE_PROCESS":
            # the Epilog may not know the index
            (root / PREV_MODE_FILE).write_text(f"{int(gpu_index)} {prev}\n")
            modes.set(gpu_index, "EXCLUSIVE_PROCESS")
        return {"compute_mode": "EXCLUSIVE_PROCESS", "compute_mode_prev": prev}
    except Exception as exc:  # no NVML, no permission: MPS still runs, the check reports it
        log.warning("GPU %s: cannot set EXCLUSIVE_PROCESS: %s", gpu_index, exc)
        return {"compute_mode_error": f"{type(exc).__name__}: {exc}"}


def restore_mode(root: Path, modes: Optional[ComputeModes]) -> Dict[str, Any]:
    """Last shard member left: restore the mode (and GPU index) ``set_exclusive`` recorded, remove the record;
    the detail, {} when nothing was recorded. Never raises."""
    prev_path = root / PREV_MODE_FILE
    if not prev_path.exists():
        return {}
    gpu_index = "?"
    try:
        gpu_s, prev = prev_path.read_text().split()
        gpu_index = gpu_s
        modes = modes if modes is not None else _nvml_modes()
        modes.set(int(gpu_s), prev)
        prev_path.unlink()
        return {"compute_mode": prev}
    except Exception as exc:
        log.warning("GPU %s: cannot restore compute mode: %s", gpu_index, exc)
        return {"compute_mode_error": f"{type(exc).__name__}: {exc}"}


def _nvml_modes() -> ComputeModes:
    from slurm_coloc.nvml.reader import NvmlComputeModes
    return NvmlComputeModes()


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
    """Set the daemon's per-client ceiling to what ``plan_ceiling`` says (under the daemon's lock)."""
    if not cfg.mps_ceiling:
        return {}
    grants = member_grants(d.members_dir, cfg.gpu_mem_gib * MIB_PER_GIB)
    new = plan_ceiling(grants, read_int(d.root / CEILING_FILE), joining)
    if new is None:
        return {}
    res = apply_ceiling(control_sender(cfg, d, binary), new)
    if not res["errors"]:
        (d.root / CEILING_FILE).write_text(f"{new}\n")
    return {"ceiling": res}


def acquire(cfg: Config, job_id: int, gpu_index: int, uuid: Optional[str],
            env: Optional[Dict[str, str]] = None, uid: Optional[int] = None, grant_mib: Optional[int] = None,
            modes: Optional[ComputeModes] = None) -> MpsOutcome:
    """Make sure a daemon serves GPU ``gpu_index`` (``uid``'s in per-user mode); register ``job_id`` with its
    ``grant_mib`` (member file, ceiling). ``ok`` False: the job runs without MPS. Never raises."""
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
            guard = set_exclusive(cfg, d.root, d.gpu_index, modes) if first else {}
            out = start(cfg, d, binary)
            if out.ok:
                if out.event == "mps-start":  # a new daemon has no limit yet, whatever an old one had
                    (d.root / CEILING_FILE).unlink(missing_ok=True)
                write_member(d.members_dir, job_id, grant_mib)
                guard.update(_ceiling(cfg, d, binary, str(int(job_id))))
            elif first:
                guard.update(restore_mode(d.root, modes))  # time-sliced tenants need the old mode
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
            modes: Optional[ComputeModes] = None) -> List[MpsOutcome]:
    """Unregister ``job_id`` from its daemons (one outcome each): a daemon left with no member stops unless
    ``mps_keep_warm`` and gets its compute mode back; else the ceiling follows the members. Never raises."""
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
                out.detail.update(restore_mode(d.root, modes))
                outcomes.append(out)
        except Exception as exc:
            outcomes.append(MpsOutcome(False, "mps-error", d, {"error": f"{type(exc).__name__}: {exc}"}))
    return outcomes
