"""Warm estimate server for ``coloc-estimate``: a per-user process that keeps torch imported.

Client side (:func:`wanted`, :func:`request`, :func:`ensure_started`) and server side (:func:`serve_main`)
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
import errno
import fcntl
import hashlib
import importlib.machinery
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

PROTO = 1
IDLE_DEFAULT_S = 900.0
CONNECT_TIMEOUT_S = 1.0
ACK_TIMEOUT_S = 5.0
RESULT_TIMEOUT_S = 1800.0
MAX_CHILDREN = 8
MAX_FRAME = 64 << 20
_SUN_PATH_MAX = 107
_PREIMPORTED = ("torch", "torchvision", "numpy", "sympy", "click")
_ENV_PREFIXES = ("PYTHON", "TORCH", "PYTORCH", "CUDA", "OMP_", "MKL", "KMP_", "OPENBLAS", "NUMPY", "LD_")
_PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the slurm_coloc directory
# argv: sys.path (JSON), key, socket path, entry module; that module's ``serve(key, path)`` runs the server.
_BOOT = ("import sys, json, importlib; sys.path[:] = json.loads(sys.argv[1]); "
         "importlib.import_module(sys.argv[4]).serve(sys.argv[2], sys.argv[3])")

#: True in a forked request child: the CLI then runs in-process (never recurses into the server).
IN_SERVER = False


# ---------------------------------------------------------------------------------------- shared parts

def wanted(no_server: bool = False) -> bool:
    """Whether this process may use (and start) a server.

    False with ``no_server``, inside a request child, with ``COLOC_ESTIMATE_SERVER`` off/0/no/false,
    inside pytest (``PYTEST_CURRENT_TEST``), in Slurm prolog/epilog context (``SLURM_SCRIPT_CONTEXT``),
    in setuid processes, and without unix sockets or ``fork``.

    Args:
        no_server: ``--no-server``: never use a server.

    Returns:
        True when a server may be used. Never raises.
    """
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


def _sha_file(h: Any, path: str) -> None:
    try:
        with open(path, "rb") as fh:
            h.update(fh.read())
    except OSError:
        h.update(b"-")


def server_path(path: Optional[List[str]] = None) -> List[str]:
    """``sys.path`` without the entries that name the working directory (``''``, relative paths, the cwd).

    ``python -m`` and ``PYTHONPATH=.`` put the working directory on ``sys.path``; the server imports
    nothing from it (it is spawned with this list) and each request child gets the client's full
    ``sys.path``, so one server serves every directory.

    Args:
        path: the entries to filter; None: ``sys.path``.

    Returns:
        The kept entries, in order. Never raises (an unreadable working directory filters only the relative
        entries).
    """
    try:
        cwd = os.path.realpath(os.getcwd())
    except OSError:
        cwd = ""
    out = []
    for p in sys.path if path is None else path:
        if not p or not os.path.isabs(p) or os.path.realpath(p) == cwd:
            continue
        out.append(p)
    return out


def server_key(environ: Optional[Dict[str, str]] = None) -> str:
    """Hex sha256 naming the server this process may talk to: one per user, host and interpreter setup.

    Hashes the estimator's identity (``cache.estimator_identity``: sources and weights), every
    ``.py`` of the package, the Python executable and version, :func:`server_path` (``sys.path``
    less the working directory), the host, uid, the files the pre-imported packages resolve to on
    the full ``sys.path`` (so a directory that shadows torch or numpy gets a server of its own) and
    the import-time environment variables (``_ENV_PREFIXES``), so a changed package, venv or
    environment never reaches a stale server and a changed working directory reaches the same one.

    Args:
        environ: the environment whose import-time variables count (default ``os.environ``).
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
    """``<runtime_dir>/est-<key16>.sock``, or None without a usable directory or when too long.

    Args:
        key: the server key (hex; its first 16 characters name the socket).

    Returns:
        The socket path (at most the ``sun_path`` limit in bytes), or None.
    """
    d = runtime_dir()
    if d is None:
        return None
    path = os.path.join(d, f"est-{key[:16]}.sock")
    return path if len(path.encode()) <= _SUN_PATH_MAX else None


def _send(sock: socket.socket, obj: Dict[str, Any]) -> None:
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


def _recv(sock: socket.socket) -> Dict[str, Any]:
    (n,) = struct.unpack(">I", _recv_exact(sock, 4))
    if n > MAX_FRAME:
        raise ValueError(f"frame of {n} bytes")
    obj = json.loads(_recv_exact(sock, n))
    if not isinstance(obj, dict):
        raise ValueError("frame is not a JSON object")
    return obj


def _peer_uid(sock: socket.socket) -> int:
    _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                          struct.calcsize("3i")))
    return int(uid)


# ---------------------------------------------------------------------------------------------- client

def request(params: Dict[str, Any]) -> Optional[Tuple[int, bytes, bytes]]:
    """Run the server's request function (``coloc-estimate``'s ``run(**params)``) on the warm server.

    Args:
        params: ``run``'s keyword arguments (JSON values); the request also carries this process's working
            directory, environment, ``sys.path`` and umask.

    Returns:
        ``(exit code, stdout bytes, stderr bytes)``, or None ("run in-process instead") on no server, a stale
        socket, another uid, a wrong key, a protocol error or a timeout (``COLOC_ESTIMATE_SERVER_TIMEOUT`` s,
        default 1800). Prints nothing, never raises.
    """
    try:
        key = server_key()
        path = socket_path(key)
        if path is None:
            return None
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(CONNECT_TIMEOUT_S)
            sock.connect(path)
            if _peer_uid(sock) != os.getuid():
                return None
            umask = os.umask(0o22)
            os.umask(umask)
            _send(sock, {"proto": PROTO, "key": key, "params": params, "cwd": os.getcwd(),
                         "env": dict(os.environ), "sys_path": sys.path, "umask": umask,
                         "stdout": [getattr(sys.stdout, "encoding", None) or "utf-8",
                                    getattr(sys.stdout, "errors", None) or "strict"],
                         "stderr": [getattr(sys.stderr, "encoding", None) or "utf-8",
                                    getattr(sys.stderr, "errors", None) or "backslashreplace"]})
            sock.settimeout(ACK_TIMEOUT_S)
            ack = _recv(sock)
            if ack.get("ack") != key:
                return None
            sock.settimeout(float(os.environ.get("COLOC_ESTIMATE_SERVER_TIMEOUT", RESULT_TIMEOUT_S)))
            res = _recv(sock)
            code = res["exit"]
            if res.get("key") != key or not isinstance(code, int) or isinstance(code, bool):
                return None
            return code, base64.b64decode(res["stdout"]), base64.b64decode(res["stderr"])
    except (OSError, ValueError, KeyError, TypeError, struct.error, ImportError):
        return None


def ensure_started(entry_module: str) -> bool:
    """Spawn a detached server for this process's key unless one is running or starting. True if spawned.

    Args:
        entry_module: importable module whose ``serve(key, path)`` runs :func:`serve_main` with its
            request function (``slurm_coloc.cli.estimate``).
    """
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
        argv = [sys.executable, "-c", _BOOT, json.dumps(server_path()), key, path, entry_module]
        subprocess.Popen(argv, cwd="/",
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         close_fds=True, start_new_session=True)
        return True
    except (OSError, ValueError, ImportError):
        return False


# ---------------------------------------------------------------------------------------------- server

class _Log:
    """One line per event in ``est-<key16>.log`` (truncated at start when over 1 MB)."""

    def __init__(self, path: str) -> None:
        try:
            if os.path.getsize(path) > (1 << 20):
                os.truncate(path, 0)
        except OSError:
            pass
        self._fh = open(path, "a", buffering=1, encoding="utf-8")

    def __call__(self, msg: str) -> None:
        try:
            self._fh.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} pid={os.getpid()} {msg}\n")
        except (OSError, ValueError):
            pass


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
    global IN_SERVER
    IN_SERVER = True
    conn.settimeout(ACK_TIMEOUT_S)
    req = _recv(conn)
    if req.get("proto") != PROTO or req.get("key") != key:
        _send(conn, {"ack": None, "error": "key mismatch"})
        return 1
    _send(conn, {"ack": key})
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
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    out, err = os.pread(out_fd, os.fstat(out_fd).st_size, 0), os.pread(err_fd, os.fstat(err_fd).st_size, 0)
    conn.settimeout(RESULT_TIMEOUT_S)
    _send(conn, {"key": key, "exit": code, "stdout": base64.b64encode(out).decode(),
                 "stderr": base64.b64encode(err).decode()})
    return code


def _is_server(pid: int) -> bool:
    """True when ``pid`` is a running estimate server of this user (its command line is ``_BOOT``'s)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
        return os.stat(f"/proc/{pid}").st_uid == os.getuid() and _BOOT.encode() in argv
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
        try:
            os.kill(old, signal.SIGTERM)
            log(f"replaced older server pid={old}")
        except OSError:
            pass
    tmp = f"{owner}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="ascii") as fh:
            fh.write(f"{os.getpid()}\n")
        os.replace(tmp, owner)
    except OSError:
        pass


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


def _serve(listener: socket.socket, lock: Any, key: str, run: Callable[..., None], idle: float,
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
            uid = _peer_uid(conn)
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
    """Run the server (in the process :func:`ensure_started` spawns): lock, warm up, listen, fork per request.

    Args:
        key: the spawner's :func:`server_key`; the server exits at once when its own differs.
        path: the socket path (:func:`socket_path`); ``.lock`` and ``.log`` sit beside it.
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
