"""The warm estimate server (slurm_coloc/cli/estimate_server.py, estimate_daemon.py): real processes and unix
sockets.

Every test gets its own short ``XDG_RUNTIME_DIR``/``XDG_CACHE_HOME`` (so its own server) and kills the
servers it started (by the pids in their logs). ``PYTEST_CURRENT_TEST`` is removed from the CLI's
environment, since the server is off inside pytest otherwise.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

pytestmark = pytest.mark.slow  # real probe/torch/subprocess work: left out of the fast command

EXE = str(Path(sys.executable).parent / "coloc-estimate")
MODEL = """import torch.nn as nn


def build(width=64):
    return nn.Sequential(nn.Linear(16, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 10))
"""
SMALL = ["--model", "mymodel.py:build", "--input-shape", "16", "--batch-size", "4", "--optimizer", "adam",
         "--json", "--no-cache"]


class Env:
    """One test's isolated user environment: dirs, env, a model file, the server's logs and pids."""

    def __init__(self, root: Path, idle: float = 120) -> None:
        self.root = root
        self.run_dir = root / "run"
        self.run_dir.mkdir(mode=0o700)
        self.work = root / "work"
        self.work.mkdir()
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("PYTEST_CURRENT_TEST", "COLOC_ESTIMATE_SERVER")}
        self.env.update(XDG_RUNTIME_DIR=str(self.run_dir), XDG_CACHE_HOME=str(root / "cache"),
                        COLOC_ESTIMATE_SERVER_IDLE=str(idle))
        self.write_model(64)

    def write_model(self, width: int) -> None:
        (self.work / "mymodel.py").write_text(MODEL.replace("WIDTH", str(width)))

    def est(self, *args: str, extra: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
        return subprocess.run([EXE, *args], cwd=self.work, env={**self.env, **(extra or {})},
                              capture_output=True,
                              text=True, timeout=120)

    @property
    def sdir(self) -> Path:
        return self.run_dir / "slurm-coloc"

    def log(self) -> str:
        return "".join(p.read_text() for p in self.sdir.glob("*.log")) if self.sdir.exists() else ""

    def served(self) -> int:
        return self.log().count(" served child=")

    def pids(self) -> List[int]:
        return sorted({int(m) for m in re.findall(r"pid=(\d+) warming", self.log())})

    def socket(self, timeout: float = 60) -> Path:
        """Wait until a server listens (its socket exists and its log says 'start')."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            socks = list(self.sdir.glob("*.sock")) if self.sdir.exists() else []
            if socks and " start key=" in self.log():
                return socks[0]
            time.sleep(0.1)
        raise AssertionError(f"no server started; log: {self.log()!r}")

    def kill(self) -> None:
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


@pytest.fixture
def user() -> Iterator[Env]:
    root = Path(tempfile.mkdtemp(prefix="cs-", dir="/tmp"))  # short: unix socket paths are <= 107 bytes
    env = Env(root)
    try:
        yield env
    finally:
        env.kill()
        shutil.rmtree(root, ignore_errors=True)


def _same(a: subprocess.CompletedProcess, b: subprocess.CompletedProcess) -> None:
    assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr)


def test_served_same_output_fresh_user_code_and_bad_input(user: Env) -> None:
    first = user.est(*SMALL)  # no server yet: in-process, then starts one
    assert first.returncode == 0, first.stderr
    user.socket()
    assert user.served() == 0
    served = user.est(*SMALL)
    assert user.served() == 1 or _wait_served(user, 1)
    _same(served, first)
    _same(served, user.est(*SMALL, "--no-server"))
    _same(served, user.est(*SMALL, extra={"COLOC_ESTIMATE_SERVER": "0"}))
    assert user.served() == 1

    # a real torchvision model and an AMP spec (FakeTensorMode + dynamo in the child): same bytes
    for args in (["--model", "torchvision.models:resnet18", "--input-shape", "3,32,32", "--batch-size", "8",
                  "--optimizer", "sgd", "--json", "--no-cache"],
                 [*SMALL, "--amp"]):
        _same(user.est(*args), user.est(*args, "--no-server"))
    _wait_served(user, 3)

    # the user's file is imported afresh per request
    user.write_model(256)
    edited = user.est(*SMALL)
    _wait_served(user, 4)
    assert json.loads(edited.stdout)["estimate_mib"] != json.loads(first.stdout)["estimate_mib"] or \
        json.loads(edited.stdout)["detail"] != json.loads(first.stdout)["detail"]
    _same(edited, user.est(*SMALL, "--no-server"))

    # bad input through the server: one line, exit 2, no traceback
    bad = user.est("--model", "mymodel.py:nosuch", "--input-shape", "16", "--batch-size", "4", "--json")
    _wait_served(user, 5)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "nosuch" in bad.stderr
    assert "Traceback" not in bad.stderr and bad.stdout == ""
    _same(bad, user.est("--model", "mymodel.py:nosuch", "--input-shape", "16", "--batch-size", "4", "--json",
                        "--no-server"))

    # a cache hit never needs the server; Slurm prolog/epilog context never uses it
    n = user.served()
    cached = [a for a in SMALL if a != "--no-cache"]
    user.est(*cached)
    hit = user.est(*cached)
    assert hit.returncode == 0 and json.loads(hit.stdout)["detail"].get("cached") is True
    _same(user.est(*SMALL, extra={"SLURM_SCRIPT_CONTEXT": "prolog_slurmd"}), edited)
    time.sleep(1.2)
    assert user.served() == n + 1  # only the first cached call (a miss) went to the server


def _wait_served(user: Env, n: int, timeout: float = 5) -> bool:
    """The parent logs a request when it reaps the child (within its ~1 s accept timeout)."""
    end = time.monotonic() + timeout
    while user.served() < n and time.monotonic() < end:
        time.sleep(0.1)
    assert user.served() == n, user.log()
    return True


def test_stale_and_garbage_sockets_fall_back(user: Env) -> None:
    want = user.est(*SMALL, "--no-server")
    assert want.returncode == 0, want.stderr
    assert not user.sdir.exists() or not list(user.sdir.glob("*.sock"))  # --no-server starts nothing
    _same(user.est(*SMALL), want)
    sock = user.socket()
    (pid,) = user.pids()
    os.kill(pid, signal.SIGKILL)  # leaves a stale socket file behind
    _wait_gone(pid)
    assert sock.exists()
    _same(user.est(*SMALL), want)  # connection refused -> in-process, and a new server is spawned
    pids = _wait_pids(user, 2)
    user.socket()
    end = time.monotonic() + 60
    while " start key=" not in user.log().split(f"pid={pids[-1]} warming")[-1] and time.monotonic() < end:
        time.sleep(0.1)
    os.kill(pids[-1], signal.SIGKILL)
    _wait_gone(pids[-1])

    # a listener that answers garbage: protocol error -> in-process
    sock.unlink()
    fake = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fake.bind(str(sock))
    fake.listen(4)
    child = os.fork()
    if child == 0:  # pragma: no cover - the fake server
        try:
            conn, _ = fake.accept()
            conn.recv(1 << 20)
            conn.sendall(b"\x00\x00\x00\x05hello")
            time.sleep(2)
        finally:
            os._exit(0)
    try:
        _same(user.est(*SMALL), want)
    finally:
        os.waitpid(child, 0)
        fake.close()


def _wait_gone(pid: int, timeout: float = 10) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} still alive")


def _wait_pids(user: Env, n: int, timeout: float = 30) -> List[int]:
    end = time.monotonic() + timeout
    while len(user.pids()) < n and time.monotonic() < end:
        time.sleep(0.1)
    assert len(user.pids()) >= n, user.log()
    return user.pids()


def test_idle_exit_and_other_uid_refused(user: Env) -> None:
    user.env["COLOC_ESTIMATE_SERVER_IDLE"] = "2"
    assert user.est(*SMALL).returncode == 0
    sock = user.socket()
    (pid,) = user.pids()
    other = _other_uid_probe(user, sock)
    _wait_gone(pid, timeout=15)  # 2 s idle (+ the 0.5 s accept poll)
    assert "exit: idle" in user.log() and not sock.exists()
    if other is not None:
        uid, answer = other
        assert answer == b"" and f"refused uid={uid}" in user.log(), (answer, user.log())
    else:
        pytest.skip("not root or no user colocuser (uid 2001): SO_PEERCRED refusal not exercised")


def _other_uid_probe(user: Env, sock: Path) -> "Tuple[int, bytes] | None":
    """As colocuser (setpriv), connect to this uid's server and send a request; (uid, what came back)."""
    import pwd

    try:
        uid = pwd.getpwnam("colocuser").pw_uid
    except KeyError:
        return None
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        return None
    # open the file-system gate (0700 dir, 0700 socket) so that only SO_PEERCRED stands in the way
    os.chmod(user.root, 0o755)
    os.chmod(user.run_dir, 0o755)
    os.chmod(user.sdir, 0o755)
    os.chmod(sock, 0o777)
    probe = ("import socket, struct, sys, json\n"
             "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.settimeout(5); "
             "s.connect(sys.argv[1])\n"
             "d = json.dumps({'proto': 1, 'key': 'x', 'params': {}}).encode()\n"
             "try:\n    s.sendall(struct.pack('>I', len(d)) + d); r = s.recv(100)\n"
             "except OSError:\n    r = b''\n"
             "sys.stdout.write(r.hex())\n")
    out = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "/usr/bin/python3",
                          "-c", probe, str(sock)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return uid, bytes.fromhex(out.stdout.strip())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_three_directories_share_one_server_and_a_newer_one_replaces_it(user: Env) -> None:
    """``python -m slurm_coloc estimate`` puts the working directory on ``sys.path``: still one server."""
    def est_in(d: Path, extra: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
        d.mkdir(exist_ok=True)
        shutil.copy(user.work / "mymodel.py", d / "mymodel.py")
        return subprocess.run([sys.executable, "-m", "slurm_coloc", "estimate", *SMALL], cwd=d,
                              env={**user.env, **(extra or {})}, capture_output=True, text=True, timeout=120)

    dirs = [user.root / n for n in ("a", "b", "c")]
    assert est_in(dirs[0]).returncode == 0
    user.socket()
    for i, d in enumerate(dirs * 2):
        r = est_in(d)
        assert r.returncode == 0, r.stderr
        _wait_served(user, i + 1)
    time.sleep(1)
    assert len(user.pids()) == 1, user.log()
    assert len(list(user.sdir.glob("*.sock"))) == 1
    (first,) = user.pids()
    # another import-time environment is another key: its server ends the older one of this interpreter
    assert est_in(dirs[1], {"TORCH_SHOW_CPP_STACKTRACES": "1"}).returncode == 0
    pids = _wait_pids(user, 2, timeout=90)
    end = time.monotonic() + 90
    while _alive(first) and time.monotonic() < end:
        time.sleep(0.2)
    assert not _alive(first) and f"replaced older server pid={first}" in user.log()
    assert _alive(pids[-1])
