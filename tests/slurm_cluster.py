"""Test helper: a real local Slurm cluster (scripts/cluster.sh) owned by one pytest session.

Each cluster holds its own block of 3 ports (an ``flock`` on ``/tmp/coloc-test-locks/port-<base>.lock``,
held until the cluster stops, besides the bind check) and a fresh ``mkdtemp`` directory, with its own munged
(scripts/cluster.sh), so sessions running side by side (scripts/test.sh runs two Slurm versions at once) do
not collide. The Slurm version is ``COLOC_SLURM`` (22.05, 24.11, 26.05; default 22.05);
``Cluster.bin_dir`` holds that version's client commands and comes first on the cluster's PATH.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from slurm_coloc.slurm.parse import FINAL_STATES, job_state, number

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = REPO / ".venv" / "bin"
VERSIONS = REPO / "scripts" / "slurm_versions.sh"


@lru_cache(maxsize=None)
def slurm_version() -> str:
    """The Slurm version test clusters run: ``COLOC_SLURM``, else 22.05 (Debian 12's, from apt)."""
    return os.environ.get("COLOC_SLURM") or "22.05"


# data_parser fields (24.11+) that tests read as 22.05's plain numbers (``Cluster.squeue``).
_NUMBER_KEYS = ("submit_time", "start_time", "end_time", "time_limit", "array_job_id", "array_task_id",
                "node_count", "tasks", "cpus_per_task", "memory_per_node", "minimum_cpus_per_node",
                "priority")


def as_v0038(j: Dict[str, Any]) -> Dict[str, Any]:
    """A ``squeue --json`` job record of any release in 22.05's shape, for tests' own reading: ``job_state``
    the base state (24.11+'s flags go to ``job_state_flags``), number objects as numbers (0 when unset), exit
    codes as the wait status. Strings (``tres_per_node``: ``gres/`` on 24.11+, ``gres_detail``) are left as
    printed."""
    out = dict(j)
    out["job_state"], out["job_state_flags"] = job_state(j.get("job_state"))
    out["tres_per_node"] = str(j.get("tres_per_node") or "").replace("gres/", "gres:")
    for key in _NUMBER_KEYS:
        if isinstance(j.get(key), dict):
            v = number(j[key])
            out[key] = int(v) if v is not None else (None if key == "array_task_id" else 0)
    for key in ("exit_code", "derived_exit_code"):
        v = j.get(key)
        if isinstance(v, dict):
            rc, sig = number(v.get("return_code")), number((v.get("signal") or {}).get("id"))
            out[key] = (int(rc or 0) << 8) | int(sig or 0)
    return out


@lru_cache(maxsize=None)
def slurm_bin_dir(version: str) -> str:
    """Directory of the client commands (sbatch, scontrol, ...) of ``version`` (fetched if needed)."""
    out = subprocess.run([str(VERSIONS), "fetch", version], text=True, capture_output=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"Slurm {version} is not available: {out.stderr.strip()}")
    return out.stdout.strip()


def _ports_free(base: int) -> bool:
    for port in (base, base + 1, base + 2):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def pick_port_base() -> int:
    """A base port (multiple of 10 in 20000..39990) whose 3 ports are free, spread by pid (not reserved: a
    cluster of this module holds its ports with ``reserve_port_base``)."""
    start = 20000 + (os.getpid() * 10) % 20000
    for k in range(2000):
        base = 20000 + (start - 20000 + 10 * k) % 20000
        if _ports_free(base):
            return base
    raise RuntimeError("no free ports for a test cluster")


LOCK_DIR = Path("/tmp/coloc-test-locks")


def reserve_port_base() -> Tuple[int, int]:
    """(base, lock fd): a base port (multiple of 10 in 20000..39990, spread by pid) whose 3 ports are free and
    that no other live test process holds: an exclusive ``flock`` on ``LOCK_DIR/port-<base>.lock``, kept until
    ``os.close(fd)`` (or the process ends). The bind check alone let two sessions pick one base between the
    check and slurmctld's bind. Raises RuntimeError when no base is free."""
    LOCK_DIR.mkdir(mode=0o755, exist_ok=True)
    start = 20000 + (os.getpid() * 10) % 20000
    for k in range(2000):
        base = 20000 + (start - 20000 + 10 * k) % 20000
        fd = os.open(LOCK_DIR / f"port-{base}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        if _ports_free(base):
            return base, fd
        os.close(fd)
    raise RuntimeError("no free ports for a test cluster")


@contextmanager
def host_lock(name: str) -> Iterator[None]:
    """Hold ``LOCK_DIR/<name>.lock`` exclusively (waiting for it) while a test uses a host-wide resource that
    no per-session value replaces (a path whose name the test's subject fixes), so sessions side by side take
    turns."""
    LOCK_DIR.mkdir(mode=0o755, exist_ok=True)
    fd = os.open(LOCK_DIR / f"{name}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def new_cluster_dir(base: int, kind: str = "test") -> Path:
    """A fresh directory ``/tmp/coloc-<kind>-<base>-XXXXXXXX`` (``mkdtemp``: never another session's), mode
    0755 so job users reach its jobs directory."""
    path = Path(tempfile.mkdtemp(prefix=f"coloc-{kind}-{base}-", dir="/tmp"))
    path.chmod(0o755)
    return path


@dataclass
class Cluster:
    """A running local cluster. ``env`` is the environment for client commands (SLURM_CONF, COLOC_CONFIG)."""

    dir: Path
    port_base: int
    extra_env: Dict[str, str]
    version: str = "22.05"
    bin_dir: str = "/usr/bin"
    port_lock: Optional[int] = field(default=None, repr=False)  # reserve_port_base's fd, closed at stop

    @property
    def conf(self) -> Path:
        return self.dir / "etc" / "slurm.conf"

    @property
    def coloc_config(self) -> Path:
        return self.dir / "etc" / "coloc.yaml"

    @property
    def jobs_dir(self) -> Path:
        return self.dir / "jobs"

    @property
    def state_dir(self) -> Path:
        return self.dir / "coloc" / "state"

    @property
    def ctld_db(self) -> Path:
        return self.state_dir / "ctld.db"

    def node_db(self, node: str) -> Path:
        return self.state_dir / "nodes" / f"{node}.db"

    @property
    def env(self) -> Dict[str, str]:
        env = dict(os.environ)
        env.update({"SLURM_CONF": str(self.conf), "COLOC_CONFIG": str(self.coloc_config),
                    "PATH": f"{VENV_BIN}:{self.bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin",
                    "COLOC_EXAMPLES": str(REPO / "examples"), "COLOC_SLURM": self.version,
                    "COLOC_CLUSTER_DIR": str(self.dir), "COLOC_PORT_BASE": str(self.port_base)})
        env.update(self.extra_env)
        return env

    def owns_environ(self, environ: bytes) -> bool:
        """Whether a process environment (the bytes of ``/proc/<pid>/environ``) is of this cluster's jobs: its
        ``SLURM_CONF`` names this cluster's slurm.conf (the client exports it into the job). A job id alone
        does not tell: every cluster counts its jobs from 1, and clusters of other sessions run beside."""
        return f"SLURM_CONF={self.conf}".encode() in environ.split(b"\0")

    def script(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """Run scripts/cluster.sh with this cluster's settings."""
        return subprocess.run([str(REPO / "scripts" / "cluster.sh"), *args], env=self.env, text=True,
                              capture_output=True, check=check, timeout=120)

    def run(self, argv: Sequence[str], user: Optional[str] = "colocuser", cwd: Optional[Path] = None,
            env: Optional[Dict[str, str]] = None, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run ``argv`` as ``user`` (None: root) in ``cwd`` (default jobs dir) with the cluster env."""
        full_env = {**self.env, **(env or {})}
        if user:
            keep = ["SLURM_CONF", "COLOC_CONFIG", "PATH", "COLOC_EXAMPLES", *(env or {}).keys()]
            argv = ["runuser", "-u", user, "--", "env", *[f"{k}={full_env[k]}" for k in keep], *argv]
        return subprocess.run(list(argv), env=full_env, cwd=str(cwd or self.jobs_dir), text=True,
                              capture_output=True, timeout=timeout)

    def squeue(self) -> List[dict]:
        """All jobs slurmctld knows (``squeue --json --states=all``: 24.11+ apply squeue's default state
        filter to --json and leave finished jobs out; 22.05 ignores every filter), in 22.05's shape
        (``as_v0038``)."""
        out = subprocess.run(["squeue", "--json", "--states=all"], env=self.env, text=True,
                             capture_output=True,
                             check=True)
        return [as_v0038(j) for j in json.loads(out.stdout)["jobs"]]

    def job(self, job_id: int) -> Optional[dict]:
        return next((j for j in self.squeue() if j["job_id"] == job_id), None)

    def job_ids(self) -> List[int]:
        return sorted(j["job_id"] for j in self.squeue())

    def _poll_job(self, job_id: int, states: Sequence[str], timeout: float, poll_s: float) -> Optional[dict]:
        """Poll squeue until the job is in one of ``states``: its record, or None after ``timeout`` s."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            j = self.job(job_id)
            # 24.11+ show RUNNING while PrologSlurmctld/Prolog still run (CONFIGURING flag) and the final
            # state while the epilogs run (COMPLETING flag); 22.05 shows CONFIGURING / COMPLETING in place of
            # the state
            busy = {"CONFIGURING", "COMPLETING"} & set(j["job_state_flags"]) - set(states) if j else set()
            if j and j["job_state"] in states and not busy:
                return j
            time.sleep(poll_s)
        return None

    def wait_job(self, job_id: int, timeout: float = 120) -> dict:
        """Wait until the job is in a final state (and its epilogs ran); return its squeue record."""
        j = self._poll_job(job_id, FINAL_STATES, timeout, 0.5)
        if j is None:
            raise TimeoutError(f"job {job_id} not finished after {timeout} s: {self.job(job_id)}")
        return j

    def wait_state(self, job_id: int, states: Sequence[str], timeout: float = 60) -> dict:
        j = self._poll_job(job_id, states, timeout, 0.3)
        if j is None:
            raise TimeoutError(f"job {job_id} never reached {states}: {self.job(job_id)}")
        return j

    def node_states(self) -> Dict[str, str]:
        """``{"n1": "idle", ...}`` from sinfo (drained nodes show ``drain``/``drng``)."""
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env, text=True,
                             capture_output=True,
                             check=True).stdout
        return dict(line.split() for line in out.splitlines() if line.strip())

    def scontrol(self, *args: str) -> str:
        return subprocess.run(["scontrol", *args], env=self.env, text=True, capture_output=True,
                              check=True).stdout


def start_cluster(extra_env: Optional[Dict[str, str]] = None) -> Cluster:
    """Start a fresh cluster in a new directory (``new_cluster_dir``) on reserved free ports
    (``reserve_port_base``); the caller must ``stop_cluster``, which releases the ports."""
    version = slurm_version()
    bin_dir = slurm_bin_dir(version)
    base, lock = reserve_port_base()
    cluster = Cluster(new_cluster_dir(base), base, dict(extra_env or {}), version, bin_dir, lock)
    try:
        cluster.script("start")
    except BaseException:  # no daemon left behind; the directory keeps its logs
        cluster.script("stop", check=False)
        os.close(lock)
        raise
    return cluster


def stop_cluster(cluster: Cluster) -> None:
    """Stop the daemons and remove the directory (kept, with its logs, when COLOC_TEST_KEEP=1)."""
    try:
        cluster.script("stop", check=False)
        if os.environ.get("COLOC_TEST_KEEP") != "1":
            shutil.rmtree(cluster.dir, ignore_errors=True)
    finally:
        if cluster.port_lock is not None:
            os.close(cluster.port_lock)
            cluster.port_lock = None
