"""One CUDA MPS control daemon per shared GPU, started and stopped by the node Prolog/Epilog (runs as root).

Layout under the root-owned ``<run_dir>/mps/<key>/`` where ``key`` is the GPU UUID (``idx<N>`` where NVML is
absent, e.g. the fake-GPU test cluster): ``pipe/`` (CUDA_MPS_PIPE_DIRECTORY; the daemon writes
``nvidia-cuda-mps-control.pid`` there), ``log/`` (CUDA_MPS_LOG_DIRECTORY), ``members/<job_id>`` (one empty file
per shared job using the daemon) and ``lock`` (flock serialising concurrent Prologs/Epilogs of that GPU).

The daemon is started with ``CUDA_VISIBLE_DEVICES=<uuid or index>``, so MPS clients see that GPU as device 0
(MPS remaps devices: NVIDIA MPS docs, "CUDA_VISIBLE_DEVICES"). ``-M`` (multi-user) unless ``mps_mode`` is
``per-user``. Nothing here changes compute mode, clocks or MIG. Every failure is returned, never raised, so the
job can run without MPS (time-slicing) and the node is not drained.
"""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from slurm_coloc.config import Config

log = logging.getLogger("slurm_coloc.node.mps")

PID_FILE = "nvidia-cuda-mps-control.pid"
EXTRA_BIN_DIRS = ("/usr/bin", "/usr/local/bin", "/usr/local/nvidia/bin", "/usr/local/cuda/bin", "/bin")


@dataclass(frozen=True)
class MpsDaemon:
    """Where the daemon of one GPU lives.

    Attributes:
        key: directory name (GPU UUID, or ``idx<N>`` when NVML is unavailable).
        gpu_index: global GPU index on the node; visible: value for the daemon's CUDA_VISIBLE_DEVICES.
        root: ``<run_dir>/mps/<key>``.
    """

    key: str
    gpu_index: int
    visible: str
    root: Path

    @property
    def pipe_dir(self) -> Path:
        return self.root / "pipe"

    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    @property
    def members_dir(self) -> Path:
        return self.root / "members"


@dataclass
class MpsOutcome:
    """What happened: ``ok`` (a daemon serves the GPU), ``event`` kind for the node event log, details."""

    ok: bool
    event: str
    daemon: Optional[MpsDaemon] = None
    detail: Dict[str, object] = field(default_factory=dict)


def daemon_for(cfg: Config, gpu_index: int, uuid: Optional[str]) -> MpsDaemon:
    """The daemon layout for GPU ``gpu_index`` (keyed by ``uuid`` when known, else ``idx<N>``)."""
    key = uuid if uuid and all(c.isalnum() or c in "-_" for c in uuid) else f"idx{int(gpu_index)}"
    return MpsDaemon(key=key, gpu_index=int(gpu_index), visible=uuid if key == uuid else str(int(gpu_index)),
                     root=Path(cfg.run_dir) / "mps" / key)


def resolve_binary(cfg: Config, env: Optional[Dict[str, str]] = None) -> Optional[str]:
    """Absolute path of the MPS control binary, or None when it is not installed."""
    name = cfg.mps_control_bin
    if "/" in name:
        return name if os.access(name, os.X_OK) else None
    path = ":".join([(env or os.environ).get("PATH", ""), *EXTRA_BIN_DIRS])
    return shutil.which(name, path=path)


def _mkdir(path: Path, mode: int = 0o755) -> None:
    old = os.umask(0o022)
    try:
        path.mkdir(parents=True, exist_ok=True, mode=mode)
    finally:
        os.umask(old)
    st = path.lstat()
    if st.st_uid != os.geteuid() or st.st_mode & 0o022 or path.is_symlink():
        raise PermissionError(f"{path} is not owned by us or is group/other-writable")


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


def pid_alive(pid: int) -> bool:
    """True when ``pid`` exists and is not a zombie (a daemon whose parent never reaps it stays a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def daemon_pid(d: MpsDaemon, binary_name: str = "nvidia-cuda-mps-control") -> Optional[int]:
    """Pid of the running control daemon of ``d`` (pid file + a live process of that name), else None."""
    try:
        pid = int((d.pipe_dir / PID_FILE).read_text().split()[0])
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except (OSError, ValueError, IndexError):
        return None
    ok = os.path.basename(cmd) == os.path.basename(binary_name) and pid_alive(pid)
    return pid if ok else None


def _daemon_env(d: MpsDaemon) -> Dict[str, str]:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CUDA_VISIBLE_DEVICES": d.visible,
           "CUDA_MPS_PIPE_DIRECTORY": str(d.pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(d.log_dir)}
    if os.environ.get("LD_LIBRARY_PATH"):
        env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]  # slurmd's own (root-set), e.g. driver libs
    return env


def start(cfg: Config, d: MpsDaemon, binary: str) -> MpsOutcome:
    """Start the daemon of ``d`` unless it runs; wait until its pid file names a live daemon."""
    pid = daemon_pid(d, binary)
    if pid:
        return MpsOutcome(True, "mps-running", d, {"pid": pid})
    for p in (d.pipe_dir, d.log_dir):
        _mkdir(p)
    (d.pipe_dir / PID_FILE).unlink(missing_ok=True)
    argv = [binary, "-d"] + (["-M"] if cfg.mps_mode == "multi-user" else [])
    t0 = time.monotonic()
    try:
        res = subprocess.run(argv, env=_daemon_env(d), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                             timeout=cfg.mps_start_timeout_s, start_new_session=True)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return MpsOutcome(False, "mps-start-failed", d, {"error": f"{type(exc).__name__}: {exc}", "argv": argv})
    if res.returncode != 0:
        return MpsOutcome(False, "mps-start-failed", d, {"rc": res.returncode, "stderr": res.stderr.strip()[-500:],
                                                         "argv": argv})
    while time.monotonic() - t0 < cfg.mps_start_timeout_s:
        pid = daemon_pid(d, binary)
        if pid:
            return MpsOutcome(True, "mps-start", d, {"pid": pid, "argv": argv, "mode": cfg.mps_mode,
                                                     "start_ms": round((time.monotonic() - t0) * 1000, 1)})
        time.sleep(0.02)
    return MpsOutcome(False, "mps-start-failed", d, {"error": "no daemon pid file after start", "argv": argv})


def stop(cfg: Config, d: MpsDaemon, binary: str) -> MpsOutcome:
    """``echo quit | nvidia-cuda-mps-control`` for ``d``; SIGTERM if it is still alive after the timeout."""
    pid = daemon_pid(d, binary)
    if not pid:
        return MpsOutcome(True, "mps-not-running", d)
    t0 = time.monotonic()
    try:
        subprocess.run([binary], input="quit\n", env=_daemon_env(d), capture_output=True, text=True,
                       timeout=cfg.mps_start_timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("MPS %s: quit failed: %s", d.key, exc)
    while time.monotonic() - t0 < cfg.mps_start_timeout_s:
        if daemon_pid(d, binary) is None and not pid_alive(pid):
            return MpsOutcome(True, "mps-stop", d, {"pid": pid, "stop_ms": round((time.monotonic() - t0) * 1000, 1)})
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError:
        pass
    return MpsOutcome(False, "mps-stop-forced", d, {"pid": pid, "error": "daemon ignored quit; sent SIGTERM"})


def acquire(cfg: Config, job_id: int, gpu_index: int, uuid: Optional[str],
            env: Optional[Dict[str, str]] = None) -> MpsOutcome:
    """Make sure a daemon serves GPU ``gpu_index`` and register ``job_id`` as one of its users.

    Returns an outcome with ``ok`` False (event ``mps-missing`` / ``mps-start-failed`` / ``mps-error``) when the
    job must run without MPS; never raises.
    """
    d = daemon_for(cfg, gpu_index, uuid)
    binary = resolve_binary(cfg, env)
    if binary is None:
        return MpsOutcome(False, "mps-missing", d, {"binary": cfg.mps_control_bin})
    try:
        _mkdir(d.root)
        _mkdir(d.members_dir)
        with _Lock(d.root / "lock", cfg.mps_start_timeout_s):
            out = start(cfg, d, binary)
            if out.ok:
                (d.members_dir / str(int(job_id))).touch(mode=0o644)
            out.detail["key"] = d.key
            return out
    except Exception as exc:  # noqa: BLE001 - MPS trouble must never fail the job or drain the node
        return MpsOutcome(False, "mps-error", d, {"error": f"{type(exc).__name__}: {exc}"})


def job_daemons(cfg: Config, job_id: int) -> List[MpsDaemon]:
    """Daemons that list ``job_id`` as a member (the Epilog needs no NVML to find them)."""
    base = Path(cfg.run_dir) / "mps"
    out = []
    for member in sorted(base.glob(f"*/members/{int(job_id)}")):
        root = member.parent.parent
        key = root.name
        index = int(key[3:]) if key.startswith("idx") and key[3:].isdigit() else -1
        out.append(MpsDaemon(key=key, gpu_index=index, visible=key if index < 0 else str(index), root=root))
    return out


def release(cfg: Config, job_id: int, env: Optional[Dict[str, str]] = None) -> List[MpsOutcome]:
    """Unregister ``job_id`` from its daemons; stop a daemon left with no member unless ``mps_keep_warm``."""
    outcomes = []
    binary = resolve_binary(cfg, env) or cfg.mps_control_bin
    for d in job_daemons(cfg, job_id):
        try:
            with _Lock(d.root / "lock", cfg.mps_start_timeout_s):
                (d.members_dir / str(int(job_id))).unlink(missing_ok=True)
                left = [p.name for p in d.members_dir.iterdir()]
                if left:
                    outcomes.append(MpsOutcome(True, "mps-kept", d, {"members": len(left), "key": d.key}))
                elif cfg.mps_keep_warm:
                    outcomes.append(MpsOutcome(True, "mps-kept-warm", d, {"key": d.key}))
                else:
                    out = stop(cfg, d, binary)
                    out.detail["key"] = d.key
                    outcomes.append(out)
        except Exception as exc:  # noqa: BLE001
            outcomes.append(MpsOutcome(False, "mps-error", d, {"error": f"{type(exc).__name__}: {exc}"}))
    return outcomes
