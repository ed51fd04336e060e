"""Warm estimate server for ``coloc-estimate``: a per-user process that keeps torch imported.

Client side (:func:`wanted`, :func:`request`, :func:`ensure_started`) and what the server process
(``cli/estimate_daemon.py``, its ``serve_main``) shares with it (the server key, the socket path, the frames)
of one protocol: length-prefixed JSON frames (4-byte big-endian length, at most ``MAX_FRAME`` bytes) over a
unix socket ``<runtime_dir>/est-<key16>.sock`` in a 0700 per-user directory. The server checks the peer's
``SO_PEERCRED`` uid and forks one child per request; the child runs the request function it was given
(``coloc-estimate``'s ``run``) with the client's cwd, environment, ``sys.path`` and umask and returns exit
code, stdout and stderr. Any failure on the client side returns None and the CLI runs in-process. The
server exits after ``COLOC_ESTIMATE_SERVER_IDLE`` seconds without requests (default 900) or on SIGTERM.
Design and the failures it guards against: docs/reliability.md, "Warm estimate server". Stdlib only.
"""
from __future__ import annotations

import base64
import fcntl
import hashlib
import importlib.machinery
import json
import os
import socket
import struct
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

PROTO = 1
CONNECT_TIMEOUT_S = 1.0
ACK_TIMEOUT_S = 5.0
RESULT_TIMEOUT_S = 1800.0
MAX_FRAME = 64 << 20
_SUN_PATH_MAX = 107
_PREIMPORTED = ("torch", "torchvision", "numpy", "sympy", "click")
_ENV_PREFIXES = ("PYTHON", "TORCH", "PYTORCH", "CUDA", "OMP_", "MKL", "KMP_", "OPENBLAS", "NUMPY", "LD_")
_PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the slurm_coloc directory
#: The server's ``python -c`` program. argv: sys.path (JSON), key, socket path, entry module; that module's
#: ``serve(key, path)`` runs the server.
BOOT = ("import sys, json, importlib; sys.path[:] = json.loads(sys.argv[1]); "
         "importlib.import_module(sys.argv[4]).serve(sys.argv[2], sys.argv[3])")

#: True in a forked request child (``estimate_daemon`` sets it): the CLI then runs in-process (never recurses
#: into the server).
IN_SERVER = False


# ---------------------------------------------------------------------------------------- shared parts

def wanted(no_server: bool = False) -> bool:
    """Whether this process may use (and start) a server: not with ``no_server``, inside a request child,
    with ``COLOC_ESTIMATE_SERVER`` off/0/no/false, inside pytest, in Slurm prolog/epilog context
    (``SLURM_SCRIPT_CONTEXT``), in setuid processes, nor without unix sockets or ``fork``."""
    if no_server or IN_SERVER:
        return False
    if os.environ.get("COLOC_ESTIMATE_SERVER", "on").strip().lower() in ("0", "off", "no", "false"):
        return False
    if "PYTEST_CURRENT_TEST" in os.environ or "SLURM_SCRIPT_CONTEXT" in os.environ:
        return False
    return hasattr(socket, "AF_UNIX") and hasattr(os, "fork") and os.getuid() == os.geteuid()


def runtime_dir() -> Optional[str]:
    """The 0700 per-user directory (created if needed), or None when none is safe to use."""
    base = os.environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(base) and os.path.isdir(base):
        path = os.path.join(base, "slurm-coloc")
    else:
        from slurm_coloc.estimate.cache import cache_path

        path = os.path.dirname(cache_path())
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
        if st.st_uid != os.getuid() or not os.path.isdir(path) or os.path.islink(path):
            return None
        if st.st_mode & 0o077:
            os.chmod(path, 0o700)
    except OSError:
        return None
    return path


def _sha_file(h: "hashlib._Hash", path: str) -> None:
    try:
        with open(path, "rb") as fh:
            h.update(fh.read())
    except OSError:
        h.update(b"-")


def server_path(path: Optional[List[str]] = None) -> List[str]:
    """``path`` (default ``sys.path``) without the entries that name the working directory (``''``, relative
    paths, the cwd): the server imports nothing from it, and each request child gets the client's full
    ``sys.path``, so one server serves every directory. Never raises."""
    try:
        cwd = os.path.realpath(os.getcwd())
    except OSError:
        cwd = ""
    return [p for p in (sys.path if path is None else path)
            if p and os.path.isabs(p) and os.path.realpath(p) != cwd]


def server_key(environ: Optional[Dict[str, str]] = None) -> str:
    """Hex sha256 naming the server this process may talk to: one per user, host and interpreter setup.

    Hashes the estimator's identity (``cache.estimator_identity``: sources and weights), every
    ``.py`` of the package, the Python executable and version, :func:`server_path` (``sys.path``
    less the working directory), the host, uid, the files the pre-imported packages resolve to on
    the full ``sys.path`` (so a directory that shadows torch or numpy gets a server of its own) and
    the import-time environment variables (``_ENV_PREFIXES``) of ``environ``, so a changed package, venv
    or environment never reaches a stale server and a changed working directory reaches the same one.
    """
    from slurm_coloc.estimate import cache

    h = hashlib.sha256()
    for root, dirs, files in os.walk(_PKG_ROOT):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(root, name)
            h.update(os.path.relpath(path, _PKG_ROOT).encode() + b"\0")
            _sha_file(h, path)
    deps = {}
    for name in _PREIMPORTED:
        spec = importlib.machinery.PathFinder.find_spec(name, sys.path)
        origin = spec.origin if spec is not None else None
        try:
            st = os.stat(origin) if origin else None
        except OSError:
            st = None
        deps[name] = [origin, st.st_mtime_ns if st else None, st.st_size if st else None]
    blob = {"proto": PROTO, "exe": sys.executable, "py": sys.version, "host": socket.gethostname(),
            "uid": os.getuid(), "sys_path": server_path(), "estimator": cache.estimator_identity(),
            "sources": h.hexdigest(), "deps": deps,
            "env": sorted((k, v) for k, v in (os.environ if environ is None else environ).items()
                          if k.startswith(_ENV_PREFIXES))}
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()


def socket_path(key: str) -> Optional[str]:
    """``<runtime_dir>/est-<key16>.sock``, or None without a usable directory or when over ``sun_path``."""
    d = runtime_dir()
    if d is None:
        return None
    path = os.path.join(d, f"est-{key[:16]}.sock")
    return path if len(path.encode()) <= _SUN_PATH_MAX else None


def send_frame(sock: socket.socket, obj: Dict[str, Any]) -> None:
    """Send a 4-byte big-endian length, then ``obj`` as JSON; OSError when the peer is gone."""
    data = json.dumps(obj).encode()
    sock.sendall(struct.pack(">I", len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ConnectionError("peer closed the connection")
        buf += chunk
    return bytes(buf)


def recv_frame(sock: socket.socket) -> Dict[str, Any]:
    """Receive one ``send_frame`` frame of at most ``MAX_FRAME`` bytes.

    Raises:
        ConnectionError: the peer closed mid-frame; ValueError: too large, or not a JSON object; OSError.
    """
    (n,) = struct.unpack(">I", _recv_exact(sock, 4))
    if n > MAX_FRAME:
        raise ValueError(f"frame of {n} bytes")
    obj = json.loads(_recv_exact(sock, n))
    if not isinstance(obj, dict):
        raise ValueError("frame is not a JSON object")
    return obj


def peer_uid(sock: socket.socket) -> int:
    """The peer's uid (``SO_PEERCRED``, set by the kernel); OSError without peer credentials."""
    _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                          struct.calcsize("3i")))
    return int(uid)


# ---------------------------------------------------------------------------------------------- client

@dataclass(frozen=True)
class Reply:
    """What the request function did on the server: its exit code and its stdout and stderr bytes."""

    exit_code: int
    stdout: bytes
    stderr: bytes


def request(params: Dict[str, Any]) -> Optional[Reply]:
    """``coloc-estimate``'s ``run(**params)`` on the warm server, with this process's working directory,
    environment, ``sys.path`` and umask. None ("run in-process instead") on no server, a stale socket,
    another uid, a wrong key, a protocol error or a timeout (``COLOC_ESTIMATE_SERVER_TIMEOUT`` s, default
    1800). Prints nothing, never raises."""
    try:
        key = server_key()
        path = socket_path(key)
        if path is None:
            return None
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(CONNECT_TIMEOUT_S)
            sock.connect(path)
            if peer_uid(sock) != os.getuid():
                return None
            umask = os.umask(0o22)
            os.umask(umask)
            send_frame(sock, {"proto": PROTO, "key": key, "params": params, "cwd": os.getcwd(),
                         "env": dict(os.environ), "sys_path": sys.path, "umask": umask,
                         "stdout": [getattr(sys.stdout, "encoding", None) or "utf-8",
                                    getattr(sys.stdout, "errors", None) or "strict"],
                         "stderr": [getattr(sys.stderr, "encoding", None) or "utf-8",
                                    getattr(sys.stderr, "errors", None) or "backslashreplace"]})
            sock.settimeout(ACK_TIMEOUT_S)
            ack = recv_frame(sock)
            if ack.get("ack") != key:
                return None
            sock.settimeout(float(os.environ.get("COLOC_ESTIMATE_SERVER_TIMEOUT", RESULT_TIMEOUT_S)))
            res = recv_frame(sock)
            code = res["exit"]
            if res.get("key") != key or not isinstance(code, int) or isinstance(code, bool):
                return None
            return Reply(code, base64.b64decode(res["stdout"]), base64.b64decode(res["stderr"]))
    except (OSError, ValueError, KeyError, TypeError, struct.error, ImportError):
        return None


def ensure_started(entry_module: str) -> bool:
    """Spawn a detached server for this process's key unless one is running or starting; True if spawned.
    ``entry_module``'s ``serve(key, path)`` runs it (``slurm_coloc.cli.estimate``)."""
    try:
        key = server_key()
        path = socket_path(key)
        if path is None:
            return False
        with open(path[:-5] + ".lock", "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return False  # a server holds the lock: running or warming up
            fcntl.flock(lock, fcntl.LOCK_UN)
        argv = [sys.executable, "-c", BOOT, json.dumps(server_path()), key, path, entry_module]
        subprocess.Popen(argv, cwd="/",
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         close_fds=True, start_new_session=True)
        return True
    except (OSError, ValueError, ImportError):
        return False
