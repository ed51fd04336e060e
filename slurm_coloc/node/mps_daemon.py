"""CUDA MPS control daemons for shared GPUs: layout, start, stop, pid checks (root, through node/mps.py).

``mps_mode: multi-user``: one daemon per GPU, run by root with ``-M``, under the root-owned
``<run_dir>/mps/<key>/``, ``key`` the GPU UUID (``idx<N>`` without NVML, e.g. the fake-GPU test cluster).
``mps_mode: per-user``: one daemon per (GPU, job uid), run *as that user* (uid, primary gid and
supplementary groups from the passwd/group databases, never from the job), under the root-owned
``<run_dir>/mps/<key>.uid<uid>/``.

In both, ``pipe/`` is CUDA_MPS_PIPE_DIRECTORY (holding ``nvidia-cuda-mps-control.pid``) and ``log/``
CUDA_MPS_LOG_DIRECTORY; ``members/<job_id>`` (one file per shared job using the daemon, node/mps.py)
and ``lock`` (flock serialising that daemon's Prologs/Epilogs) stay root-owned. Multi-user: ``pipe/`` and
``log/`` are root-owned 0755 (every user's clients must reach the one daemon: docs/admin.md). Per-user: owned
by the uid, 0700, so only that user (and root) reaches the daemon; root never writes into them (the pid file
is read without following symlinks and its pid must be a process of that uid).

The daemon runs with ``CUDA_VISIBLE_DEVICES=<uuid or index>``, so clients see that GPU as device 0 (NVIDIA
MPS docs, "CUDA_VISIBLE_DEVICES"). Nothing here changes compute mode, clocks or MIG. Every failure is
returned, never raised, so the job can run without MPS (time-slicing) and the node is not drained.
"""
from __future__ import annotations

import logging
import os
import pwd
import shutil
import signal
import stat as stat_mod
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from slurm_coloc.atomic import make_dirs
from slurm_coloc.config import Config

log = logging.getLogger("slurm_coloc.node.mps")
Control = Callable[[str], "subprocess.CompletedProcess[str]"]  # one control command -> its answer

PID_FILE = "nvidia-cuda-mps-control.pid"
EXTRA_BIN_DIRS = ("/usr/bin", "/usr/local/bin", "/usr/local/nvidia/bin", "/usr/local/cuda/bin", "/bin")


@dataclass(frozen=True)
class MpsDaemon:
    """Where the daemon of one GPU lives (module layout); ``visible``: its ``CUDA_VISIBLE_DEVICES``; ``uid``
    None: root (multi-user)."""

    key: str
    gpu_index: int
    visible: str
    root: Path
    uid: Optional[int] = None

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


def daemon_for(cfg: Config, gpu_index: int, uuid: Optional[str], uid: Optional[int] = None) -> MpsDaemon:
    """The daemon layout for GPU ``gpu_index``: keyed by ``uuid``, or by index when None or not [A-Za-z0-9_-];
    ``uid`` only in ``per-user`` mode. Raises ValueError: per-user mode without a valid uid."""
    key = uuid if uuid and all(c.isalnum() or c in "-_" for c in uuid) else f"idx{int(gpu_index)}"
    owner: Optional[int] = None
    if cfg.mps_mode == "per-user":
        if uid is None or int(uid) < 0:
            raise ValueError("mps_mode per-user needs the job's uid (SLURM_JOB_UID missing)")
        owner = int(uid)
    name = key if owner is None else f"{key}.uid{owner}"
    return MpsDaemon(key=key, gpu_index=int(gpu_index), visible=uuid if key == uuid else str(int(gpu_index)),
                     root=Path(cfg.run_dir) / "mps" / name, uid=owner)


def resolve_binary(cfg: Config, env: Optional[Dict[str, str]] = None) -> Optional[str]:
    """Absolute path of ``mps_control_bin`` (``env``'s PATH, then ``EXTRA_BIN_DIRS``), or None."""
    name = cfg.mps_control_bin
    if "/" in name:
        return name if os.access(name, os.X_OK) else None
    path = ":".join([(env or os.environ).get("PATH", ""), *EXTRA_BIN_DIRS])
    return shutil.which(name, path=path)


def root_dir(path: Path, mode: int = 0o755) -> None:
    """Create ``path`` (parents 0755) with ``mode``; check it is ours and not group/other-writable. Raises
    PermissionError (another's, group/other-writable, or a symlink), OSError."""
    make_dirs(path, mode)
    st = path.lstat()
    if st.st_uid != os.geteuid() or st.st_mode & 0o022 or path.is_symlink():
        raise PermissionError(f"{path} is not owned by us or is group/other-writable")


def _user_dir(path: Path, uid: int, gid: int) -> None:
    """Make ``path`` (in a root-owned, not user-writable parent) a real directory owned by ``uid:gid``, 0700.
    Raises PermissionError: a symlink, not a directory, or owned by another non-root user."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat_mod.S_ISDIR(st.st_mode):
        raise PermissionError(f"{path} is not a directory (symlink?)")
    if st.st_uid not in (uid, os.geteuid()):
        raise PermissionError(f"{path} is owned by uid {st.st_uid}, not {uid}")
    if (st.st_uid, st.st_gid) != (uid, gid):
        os.chown(path, uid, gid, follow_symlinks=False)
    if stat_mod.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)  # the parent is root-owned: the entry cannot be swapped under us


def _identity(uid: int) -> Dict[str, Any]:
    """``subprocess`` keyword arguments running a command as ``uid`` (passwd/group databases, not the job's
    env). Raises KeyError: no passwd entry."""
    pw = pwd.getpwuid(uid)
    try:
        groups = os.getgrouplist(pw.pw_name, pw.pw_gid)
    except OSError:
        groups = [pw.pw_gid]
    return {"user": uid, "group": pw.pw_gid, "extra_groups": groups}


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (a daemon whose parent never reaps it stays one)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _proc_uid(pid: int) -> Optional[int]:
    """Real uid of ``pid`` from ``/proc/<pid>/status``, None when gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _read_pid_file(path: Path) -> Optional[int]:
    """The pid in ``path``: a regular file opened without following symlinks (it may sit in a user's
    directory)."""
    try:
        fd = os.open(str(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat_mod.S_ISREG(os.fstat(fd).st_mode):
            return None
        text = os.read(fd, 64).decode("ascii", errors="replace").split()
    finally:
        os.close(fd)
    return int(text[0]) if text and text[0].isdigit() else None


def daemon_pid(d: MpsDaemon, binary_name: str = "nvidia-cuda-mps-control") -> Optional[int]:
    """Pid of ``d``'s running control daemon, else None: the pid file must name a live ``binary_name``
    process of ``d.uid`` (else our euid), so a planted pid file cannot make root signal another's process."""
    pid = _read_pid_file(d.pipe_dir / PID_FILE)
    if pid is None:
        return None
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return None
    owner = d.uid if d.uid is not None else os.geteuid()
    ok = os.path.basename(cmd) == os.path.basename(binary_name) and pid_alive(pid) and _proc_uid(pid) == owner
    return pid if ok else None


def _daemon_env(d: MpsDaemon) -> Dict[str, str]:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CUDA_VISIBLE_DEVICES": d.visible,
           "CUDA_MPS_PIPE_DIRECTORY": str(d.pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(d.log_dir)}
    if os.environ.get("LD_LIBRARY_PATH"):
        env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]  # slurmd's own (root-set), e.g. driver libs
    return env


def start(cfg: Config, d: MpsDaemon, binary: str) -> MpsOutcome:
    """Start ``d``'s daemon unless it runs (multi-user: root, ``-M``; per-user: ``d.uid``); wait
    (``mps_start_timeout_s``) for its pid file. ``mps-running``, ``mps-start`` (``start_ms``) or
    ``mps-start-failed``. Raises KeyError (no passwd entry), PermissionError (a pipe/log directory unsafe)."""
    pid = daemon_pid(d, binary)
    if pid:
        return MpsOutcome(True, "mps-running", d, {"pid": pid})
    who: Dict[str, Any] = {}
    if d.uid is None:
        for p in (d.pipe_dir, d.log_dir):
            root_dir(p)
    else:
        who = _identity(d.uid)
        for p in (d.pipe_dir, d.log_dir):
            _user_dir(p, d.uid, who["group"])
    (d.pipe_dir / PID_FILE).unlink(missing_ok=True)  # unlink never follows a symlink
    argv = [binary, "-d"] + (["-M"] if d.uid is None else [])
    t0 = time.monotonic()
    try:
        res = subprocess.run(argv, env=_daemon_env(d), stdin=subprocess.DEVNULL, capture_output=True,
                             text=True,
                             timeout=cfg.mps_start_timeout_s, start_new_session=True, cwd="/", **who)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return MpsOutcome(False, "mps-start-failed", d,
                          {"error": f"{type(exc).__name__}: {exc}", "argv": argv})
    if res.returncode != 0:
        return MpsOutcome(False, "mps-start-failed", d,
                          {"rc": res.returncode, "stderr": res.stderr.strip()[-500:], "argv": argv})
    while time.monotonic() - t0 < cfg.mps_start_timeout_s:
        pid = daemon_pid(d, binary)
        if pid:
            return MpsOutcome(True, "mps-start", d,
                              {"pid": pid, "argv": argv, "mode": cfg.mps_mode, "uid": d.uid,
                               "start_ms": round((time.monotonic() - t0) * 1000, 1)})
        time.sleep(0.02)
    return MpsOutcome(False, "mps-start-failed", d, {"error": "no daemon pid file after start", "argv": argv})


def stop(cfg: Config, d: MpsDaemon, binary: str) -> MpsOutcome:
    """``echo quit | nvidia-cuda-mps-control`` as ``d``'s user, SIGTERM if alive after
    ``mps_start_timeout_s``: ``mps-not-running``, ``mps-stop`` (``stop_ms``) or ``mps-stop-forced``."""
    pid = daemon_pid(d, binary)
    if not pid:
        return MpsOutcome(True, "mps-not-running", d)
    t0 = time.monotonic()
    try:
        who = _identity(d.uid) if d.uid is not None else {}
        subprocess.run([binary], input="quit\n", env=_daemon_env(d), capture_output=True, text=True,
                       timeout=cfg.mps_start_timeout_s, cwd="/", **who)
    except (OSError, KeyError, subprocess.TimeoutExpired) as exc:
        log.warning("MPS %s: quit failed: %s", d.key, exc)
    while time.monotonic() - t0 < cfg.mps_start_timeout_s:
        if daemon_pid(d, binary) is None and not pid_alive(pid):
            return MpsOutcome(True, "mps-stop", d,
                              {"pid": pid, "stop_ms": round((time.monotonic() - t0) * 1000, 1)})
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError:
        pass
    return MpsOutcome(False, "mps-stop-forced", d, {"pid": pid, "error": "daemon ignored quit; sent SIGTERM"})


def control_sender(cfg: Config, d: MpsDaemon, binary: str) -> Control:
    """``send(cmd) -> CompletedProcess`` to ``d``'s daemon as its user, within ``mps_start_timeout_s``."""
    who = _identity(d.uid) if d.uid is not None else {}

    def send(cmd: str) -> "subprocess.CompletedProcess[str]":
        return subprocess.run([binary], input=cmd + "\n", env=_daemon_env(d), capture_output=True, text=True,
                              timeout=cfg.mps_start_timeout_s, cwd="/", **who)
    return send
