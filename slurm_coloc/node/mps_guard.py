"""What MPS itself can enforce on a shared GPU, applied by the Prolog/Epilog under the daemon's lock
(node/mps.py).

**Per-client ceiling** (``mps_ceiling``). Measured on the H100 (docs/node.md "What MPS enforces"): a client's
own ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` is advisory (a job can raise it), but a limit given to the control
daemon binds every client, per client, whatever its environment says (a lower value of its own is kept):
``set_default_device_pinned_mem_limit <dev> <value>`` for servers started afterwards and
``set_device_pinned_mem_limit <server pid> <dev> <value>`` for clients that connect to a running server
afterwards. One daemon serves every job on its GPU (``-M``) or one user's jobs (per-user), so the strongest
ceiling that keeps every tenant's grant is the largest grant among the daemon's members: raised when a larger
grant arrives, lowered when the largest member leaves (it then binds only clients that connect afterwards; the
remaining tenants' grants are all below it). Each member file ``members/<job_id>`` holds its grant in MiB.

**Compute mode** (``mps_compute_mode: exclusive-process``). When a GPU gets its first shard member the Prolog
records its compute mode in ``<root>/compute_mode.prev`` and sets ``EXCLUSIVE_PROCESS`` (before the daemon
starts: NVIDIA's MPS documentation), so only the MPS server can open a context; when the last member leaves,
the Epilog restores the recorded mode. Only through ``slurm_coloc.nvml``; failures are returned, never raised.
"""
from __future__ import annotations

import logging
import subprocess
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from slurm_coloc.atomic import write_atomic
from slurm_coloc.config import Config

log = logging.getLogger("slurm_coloc.node.mps")

CEILING_FILE = "ceiling_mib"
PREV_MODE_FILE = "compute_mode.prev"
MIB_PER_GIB = 1024


def limit_value(mib: int) -> str:
    """The limit as MPS writes it: ``<n>G`` for whole GiB (every shard grant), else ``<n>M``."""
    return f"{mib // MIB_PER_GIB}G" if mib % MIB_PER_GIB == 0 else f"{int(mib)}M"


def write_member(members_dir: Path, job_id: int, grant_mib: Optional[int]) -> None:
    """Write ``members/<job_id>`` (root-owned 0644): the grant in MiB, empty when None (counts as the whole
    GPU).

    Raises:
        OSError: the file cannot be written.
    """
    write_atomic(members_dir / str(int(job_id)), b"" if grant_mib is None else f"{int(grant_mib)}\n".encode(),
                 0o644)


def member_grants(members_dir: Path, full_mib: int) -> Dict[str, int]:
    """``{job id: grant MiB}`` of the daemon's members; an empty or unreadable file counts as ``full_mib``.

    Raises:
        OSError: the directory cannot be listed.
    """
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
    """The ceiling (MiB) to set now, or None to leave it (pure); ``joining`` None: a member leaves.

    None set yet (``current_mib`` None), or the joining job is the only member -> its grant; a member joins ->
    raise to the largest grant, never lower (a running tenant may hold up to the current ceiling); a member
    leaves -> the largest remaining grant when lower; no member left -> leave it (the next Prolog sets it).
    """
    if not grants:
        return None
    top = max(grants.values())
    if current_mib is None or (joining is not None and set(grants) == {joining}):
        return top if top != current_mib else None
    if joining is not None:
        return top if top > current_mib else None
    return top if top < current_mib else None


Control = Callable[[str], "subprocess.CompletedProcess[str]"]


def apply_ceiling(control: Control, mib: int) -> Dict[str, Any]:
    """Send ``limit_value(mib)`` on device 0: the default for new servers, then each running server's limit.

    Returns ``{"ceiling_mib", "sent": [commands], "errors": [...]}``; never raises.
    """
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


def set_exclusive(cfg: Config, root: Path, gpu_index: int, modes: Any) -> Dict[str, Any]:
    """First shard member: record the compute mode in ``<root>/compute_mode.prev``, set ``EXCLUSIVE_PROCESS``.

    ``modes`` None: NVML. Returns ``{"compute_mode", "compute_mode_prev"}``, ``{"compute_mode_error"}`` or {}
    (not configured); never raises.
    """
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


def restore_mode(root: Path, modes: Any) -> Dict[str, Any]:
    """Last shard member left: restore the mode (and GPU index) ``set_exclusive`` recorded, then remove the
    record.

    Returns ``{"compute_mode"}``, ``{"compute_mode_error"}`` or {} (nothing recorded); never raises.
    """
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


def _nvml_modes() -> Any:
    from slurm_coloc.nvml.control import NvmlComputeModes
    return NvmlComputeModes()
