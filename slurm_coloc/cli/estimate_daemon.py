"""The warm estimate server process (``cli/estimate_server.py`` has its client and protocol).

``serve_main`` runs in the detached process ``estimate_server.ensure_started`` spawns: it takes the key's
lock, warms up (imports torch, traces a tiny CNN), listens on the unix socket, replaces an older server of the
same interpreter, and forks one child per request from the same uid (at most ``MAX_CHILDREN`` at once); the
child runs the request function with the client's cwd, environment, ``sys.path`` and umask and returns exit
code, stdout and stderr. The server exits after ``COLOC_ESTIMATE_SERVER_IDLE`` seconds without requests
(default ``IDLE_DEFAULT_S``) or on SIGTERM. Design: docs/reliability.md, "Warm estimate server". Stdlib only.
"""
from __future__ import annotations

import base64
import contextlib
import errno
import fcntl
import hashlib
import os
import signal
import socket
import sys
import time
from typing import IO, Callable, Dict, List, Optional

from slurm_coloc.cli import estimate_server
from slurm_coloc.cli.estimate_server import (
    ACK_TIMEOUT_S,
    BOOT,
    PROTO,
    RESULT_TIMEOUT_S,
    peer_uid,
    recv_frame,
    send_frame,
    server_key,
)

IDLE_DEFAULT_S = 900.0
MAX_CHILDREN = 8


class _Log:
    """One line per event in ``est-<key16>.log`` (truncated at start when over 1 MB)."""

    def __init__(self, path: str) -> None:
        with contextlib.suppress(OSError):
            if os.path.getsize(path) > (1 << 20):
                os.truncate(path, 0)
        self._fh = open(path, "a", buffering=1, encoding="utf-8")

    def __call__(self, msg: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._fh.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} pid={os.getpid()} {msg}\n")


def _prewarm() -> None:
    """Import torch, torchvision.models and the estimator; trace a tiny CNN once (cache off)."""
    import torch  # noqa: F401
    import torchvision.models  # noqa: F401

    from slurm_coloc.estimate import estimate_peak
    from slurm_coloc.estimate.spec import ModelSpec

    saved = os.environ.get("COLOC_ESTIMATE_CACHE")
    os.environ["COLOC_ESTIMATE_CACHE"] = "off"
    try:
        estimate_peak(ModelSpec(model="torchvision.models:resnet18", input_shape=(3, 16, 16), batch_size=2,
                                kwargs={"num_classes": 10}, optimizer="sgd"), "H100")
    finally:
        if saved is None:
            os.environ.pop("COLOC_ESTIMATE_CACHE", None)
        else:
            os.environ["COLOC_ESTIMATE_CACHE"] = saved


def _child(conn: socket.socket, key: str, run: Callable[..., None]) -> int:
    """Serve one request in the forked child; returns the exit status for ``os._exit``."""
    estimate_server.IN_SERVER = True
    conn.settimeout(ACK_TIMEOUT_S)
    req = recv_frame(conn)
    if req.get("proto") != PROTO or req.get("key") != key:
        send_frame(conn, {"ack": None, "error": "key mismatch"})
        return 1
    send_frame(conn, {"ack": key})
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    sys.path[:] = req["sys_path"]
    os.umask(int(req["umask"]))
    import importlib
    import io

    importlib.invalidate_caches()
    out_fd, err_fd = os.memfd_create("coloc-stdout"), os.memfd_create("coloc-stderr")
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding=req["stdout"][0],
                                  errors=req["stdout"][1])
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding=req["stderr"][0],
                                  errors=req["stderr"][1], line_buffering=True)
    code = 0
    try:
        run(**req["params"])
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # the interpreter would print it and exit 1
        import traceback

        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    out, err = os.pread(out_fd, os.fstat(out_fd).st_size, 0), os.pread(err_fd, os.fstat(err_fd).st_size, 0)
    conn.settimeout(RESULT_TIMEOUT_S)
    send_frame(conn, {"key": key, "exit": code, "stdout": base64.b64encode(out).decode(),
                 "stderr": base64.b64encode(err).decode()})
    return code


def _is_server(pid: int) -> bool:
    """True when ``pid`` is a running estimate server of this user (its command line is ``BOOT``'s)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
        return os.stat(f"/proc/{pid}").st_uid == os.getuid() and BOOT.encode() in argv
    except OSError:
        return False


def _replace_older(run_dir: str, log: Callable[[str], None]) -> None:
    """Make this server the only one of this user and interpreter: SIGTERM the one recorded before it.

    ``<run_dir>/py-<sha16 of sys.executable>.pid`` names the newest server of the interpreter; an
    older one (another key: the package, ``sys.path`` or environment changed since) would
    otherwise idle for ``COLOC_ESTIMATE_SERVER_IDLE`` seconds holding ~1 GiB.
    """
    owner = os.path.join(run_dir, f"py-{hashlib.sha256(sys.executable.encode()).hexdigest()[:16]}.pid")
    try:
        with open(owner, encoding="ascii") as fh:
            old = int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        old = 0
    if old and old != os.getpid() and _is_server(old):
        with contextlib.suppress(OSError):
            os.kill(old, signal.SIGTERM)
            log(f"replaced older server pid={old}")
    tmp = f"{owner}.{os.getpid()}.tmp"
    with contextlib.suppress(OSError):
        with open(tmp, "w", encoding="ascii") as fh:
            fh.write(f"{os.getpid()}\n")
        os.replace(tmp, owner)


def _reap(children: Dict[int, float], log: Callable[[str], None]) -> Optional[float]:
    """Collect the request children that ended (``children``: pid -> monotonic start); returns the monotonic
    time of the last one collected, or None when none ended."""
    last = None
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            children.clear()
            break
        if pid == 0:
            break
        started = children.pop(pid, time.monotonic())
        last = time.monotonic()
        log(f"served child={pid} exit={os.waitstatus_to_exitcode(status)} {last - started:.2f} s")
    return last


def _serve(listener: socket.socket, lock: IO[str], key: str, run: Callable[..., None], idle: float,
           stop: List[str],
           log: Callable[[str], None]) -> None:
    """Accept requests until ``stop`` holds a reason (SIGTERM) or ``idle`` seconds pass with no child running:
    each request from this uid is served by a forked child (at most ``MAX_CHILDREN`` at once)."""
    listener.settimeout(max(0.05, min(1.0, idle / 4)))
    children: Dict[int, float] = {}
    last = time.monotonic()
    while not stop:
        last = _reap(children, log) or last
        if not children and time.monotonic() - last > idle:
            stop.append("idle")
            break
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            continue
        except InterruptedError:
            continue
        with conn:
            uid = peer_uid(conn)
            if uid != os.getuid():
                log(f"refused uid={uid}")
                continue
            if len(children) >= MAX_CHILDREN:
                log("refused: busy")
                continue
            last = time.monotonic()
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    listener.close()
                    lock.close()
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    code = _child(conn, key, run)
                except BaseException:  # client falls back in-process
                    pass
                finally:
                    os._exit(code & 0xFF)
            children[pid] = last


def serve_main(key: str, path: str, run: Callable[..., None]) -> None:
    """Run the server (in the process ``estimate_server.ensure_started`` spawns): lock, warm up, listen, fork
    per request.

    Args:
        key: the spawner's :func:`server_key`; the server exits at once when its own differs.
        path: the socket path (``estimate_server.socket_path``); ``.lock`` and ``.log`` sit beside it.
        run: the request function; a forked child calls ``run(**params)`` with the client's params.
    """
    os.umask(0o077)
    lock = open(path[:-5] + ".lock", "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return  # another server for this key runs or starts
    log = _Log(path[:-5] + ".log")
    if server_key() != key:
        log(f"exit: key differs from the spawner's ({key[:16]})")
        return
    idle = float(os.environ.get("COLOC_ESTIMATE_SERVER_IDLE", IDLE_DEFAULT_S))
    # the trace may set variables (TORCHINDUCTOR_CACHE_DIR); the key is the spawner's
    environ = dict(os.environ)
    t0 = time.monotonic()
    log(f"warming key={key[:16]}")
    try:
        _prewarm()
    except Exception as exc:  # no server then; clients run in-process
        log(f"exit: prewarm failed: {exc!r}")
        return
    if server_key(environ) != key:  # sources edited while warming up: what was imported may not match the key
        log("exit: sources changed during warm-up")
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(tmp)
    listener.listen(32)
    os.rename(tmp, path)  # atomic: replaces a stale socket, never shows a half-ready one
    ino = os.stat(path).st_ino
    log(f"start key={key[:16]} warm-up {time.monotonic() - t0:.2f} s idle {idle:g} s python {sys.executable}")
    _replace_older(os.path.dirname(path), log)
    stop: List[str] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append("SIGTERM"))
    _serve(listener, lock, key, run, idle, stop, log)
    try:
        if os.stat(path).st_ino == ino:
            os.unlink(path)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise
    listener.close()
    log(f"exit: {stop[0] if stop else 'stop'}")
