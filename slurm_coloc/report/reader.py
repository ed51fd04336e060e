"""The reader service's socket: a Unix stream socket root serves, answering one JSON request per connection.

Why a service: the databases are readable by root and the admin group only (``store/db.py``); an ordinary
user's ``coloc-report`` asks this root process instead, which answers with that user's rows only. The
caller's identity is the kernel's (``SO_PEERCRED`` uid of the connecting process), never a field of the
request, so no setuid program and no trust in what the client sends. Run by ``coloc-report serve`` on every
host where users run coloc-report and the databases can be read (docs/admin.md).

Protocol: the client sends one JSON object on one line (at most ``MAX_REQUEST_BYTES``), then half-closes or
waits; the server writes one JSON object on one line and closes. Stdlib only.

Limits (any local user may connect, so none may hold the service): at most ``MAX_CONNECTIONS`` connections at
once and ``MAX_PER_UID`` per peer uid (``SO_PEERCRED``); a connection over either is refused at once, in the
accepting thread, with one JSON line (``BUSY``) and no thread of its own. A client has ``REQUEST_TIMEOUT_S``
in all to send its request (a client that drips bytes is dropped at that deadline, not kept alive by each
byte) and ``SEND_TIMEOUT_S`` in all to take the answer. At most ``MAX_CONCURRENT`` answers are computed at
once, at most ``MAX_ANSWERS_PER_UID`` of them for one uid.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import socketserver
import stat
import struct
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from slurm_coloc.config import Config
from slurm_coloc.errors import ColocError

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 64 * 1024
REQUEST_TIMEOUT_S = 10.0  # the whole request must arrive within this (from the accept)
SEND_TIMEOUT_S = 30.0  # the whole answer must be taken within this
MAX_CONCURRENT = 4  # answers computed at once (each reads every database); further clients wait
MAX_ANSWERS_PER_UID = 2  # of those, at most this many for one uid
MAX_CONNECTIONS = 64  # connections held at once (one thread each); more are refused at once
MAX_PER_UID = 8  # connections held at once for one peer uid
SOCKET_NAME = "report.sock"
BUSY = b'{"ok": false, "error": "the coloc-report reader is busy (too many connections): try again", ' \
       b'"exit_code": 1}\n'

Handler = Callable[[Any, int], Dict[str, Any]]
"""``(request JSON, peer uid) -> answer JSON`` (must not raise for bad requests)."""


def socket_path(cfg: Config) -> Path:
    """``report_socket_path``, else ``<run_dir>/report.sock``."""
    return Path(cfg.report_socket_path) if cfg.report_socket_path else Path(cfg.run_dir) / SOCKET_NAME


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a connected ``AF_UNIX`` stream socket (Linux
    ``SO_PEERCRED``).

    Raises:
        OSError: the socket has no peer credentials (not a connected Unix socket).
    """
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


def _read_line(sock: socket.socket, limit: int, deadline: float) -> bytes:
    """One line of at most ``limit`` bytes, all of it before ``deadline`` (``time.monotonic``).

    Raises:
        ColocError: longer than ``limit``. socket.timeout: the deadline passed.
    """
    buf = b""
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("request not complete within the deadline")
        sock.settimeout(left)
        chunk = sock.recv(65536)
        if not chunk:
            break
        buf += chunk
        if len(buf) > limit:
            raise ColocError(f"request longer than {limit} bytes")
    return buf.split(b"\n", 1)[0]


class ReaderServer(socketserver.UnixStreamServer):
    """The reader's server: one thread per admitted connection, within the limits of the module docstring."""

    allow_reuse_address = False

    def __init__(self, path: str, handler: Handler) -> None:
        self.answer = handler
        self.slots = threading.BoundedSemaphore(MAX_CONCURRENT)
        self.lock = threading.Lock()
        self.active = 0
        self.per_uid: Dict[int, int] = {}
        self.answering: Dict[int, threading.BoundedSemaphore] = {}
        self.refused = 0
        self._last_refusal_log = 0.0
        super().__init__(path, _Request)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Admit the connection (a thread) or refuse it at once with ``BUSY`` (no thread).

        Never raises: a connection whose uid cannot be read, or that finds no thread, is closed and logged.
        """
        try:
            uid = peer_uid(request)
        except OSError:
            self.shutdown_request(request)
            return
        with self.lock:
            admit = self.active < MAX_CONNECTIONS and self.per_uid.get(uid, 0) < MAX_PER_UID
            if admit:
                self.active += 1
                self.per_uid[uid] = self.per_uid.get(uid, 0) + 1
            else:
                self.refused += 1
        if not admit:
            with contextlib.suppress(OSError):
                request.setblocking(False)
                # one short line: fits the socket buffer, never blocks the accepting thread
                request.send(BUSY)
            self.shutdown_request(request)
            now = time.monotonic()
            if now - self._last_refusal_log > 10:
                self._last_refusal_log = now
                log.warning("refused a connection of uid %d: %d held (at most %d, %d per uid); %d refused so "
                            "far", uid, self.active, MAX_CONNECTIONS, MAX_PER_UID, self.refused)
            return
        try:
            threading.Thread(target=self._serve_one, args=(request, client_address, uid), daemon=True).start()
        except RuntimeError as exc:  # no thread to be had: the connection is not served, its count given back
            log.warning("cannot serve a client: %s", exc)
            self._release(uid)
            self.shutdown_request(request)

    def _release(self, uid: int) -> None:
        with self.lock:
            self.active -= 1
            self.per_uid[uid] -= 1
            if not self.per_uid[uid]:
                del self.per_uid[uid]

    def _serve_one(self, request: Any, client_address: Any, uid: int) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:  # one connection never stops the service
            log.exception("error while serving a client")
        finally:
            self.shutdown_request(request)
            self._release(uid)

    def answer_slot(self, uid: int) -> threading.BoundedSemaphore:
        """The semaphore bounding ``uid``'s answers computed at once (``MAX_ANSWERS_PER_UID``); the same for
        the same uid while it holds connections (pruned above 4096 uids).
        """
        with self.lock:
            if uid not in self.answering:
                if len(self.answering) > 4096:
                    self.answering = {u: s for u, s in self.answering.items() if u in self.per_uid}
                self.answering[uid] = threading.BoundedSemaphore(MAX_ANSWERS_PER_UID)
            return self.answering[uid]


class _Request(socketserver.BaseRequestHandler):
    server: ReaderServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        deadline = time.monotonic() + REQUEST_TIMEOUT_S
        try:
            uid = peer_uid(sock)
            raw = _read_line(sock, MAX_REQUEST_BYTES, deadline)
            try:
                request = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
                reply: Dict[str, Any] = {"ok": False, "error": "bad request: not one line of JSON",
                                         "exit_code": 2}
            else:
                with self.server.answer_slot(uid), self.server.slots:
                    reply = self.server.answer(request, uid)
            sock.settimeout(SEND_TIMEOUT_S)  # total for sendall (Python >= 3.5)
            sock.sendall(json.dumps(reply, default=str).encode() + b"\n")
            log.info("answered uid %d: %s", uid, "ok" if reply.get("ok") else reply.get("error"))
        except (OSError, ColocError) as exc:
            log.warning("dropped a client: %s", exc)
        except Exception:  # one bad answer must not stop the service
            log.exception("error while answering a client")
            with contextlib.suppress(OSError):
                sock.sendall(b'{"ok": false, "error": "internal error in the reader (see its log)", '
                             b'"exit_code": 1}\n')


def _prepare(path: Path) -> None:
    """Create the socket's directory (0755) and remove a stale socket; refuse to replace anything else."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ColocError(f"{path} exists and is not a socket: refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink()  # nobody listens: left by a killed server
        return
    finally:
        probe.close()
    raise ColocError(f"a reader already listens at {path}")


def serve(path: Path, handler: Handler, ready: Optional[Callable[[], None]] = None) -> None:
    """Listen at ``path`` (mode 0666: any local user may connect; the answer depends on their uid; directory
    created 0755) until SIGTERM/SIGINT, answering each connection with ``handler``; the socket is removed on
    exit. ``ready`` is called once it listens.

    Raises:
        ColocError: the path holds something else or another reader listens there.
        OSError: the socket cannot be created.
    """
    _prepare(path)
    old = os.umask(0o111)
    try:
        server = ReaderServer(str(path), handler)
    finally:
        os.umask(old)
    os.chmod(path, 0o666)

    def stop(_sig: int, _frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if ready:
        ready()
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def ask(path: Path, request: Dict[str, Any], timeout_s: float = 300.0) -> Dict[str, Any]:
    """The answer object (``ok``, ``exit_code``, and the view or ``error``) of the reader at ``path`` to
    ``request``; ``timeout_s`` (s) bounds each connect, send and receive.

    Raises:
        ColocError: no reader listens there, it did not answer within ``timeout_s``, the connection was lost,
            or the answer is not one JSON object.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        try:
            sock.connect(str(path))
        except OSError as exc:
            raise ColocError(f"no coloc-report reader answers at {path}: {exc.strerror or exc}",
                             hint="the databases are readable by root and the admin group only; ask your "
                                  "admin "
                                  "to run `coloc-report serve` on this host (docs/admin.md)") from None
        sock.sendall(json.dumps(request).encode() + b"\n")
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    except socket.timeout:
        raise ColocError(f"the coloc-report reader at {path} did not answer within {timeout_s:g} s") from None
    except OSError as exc:
        raise ColocError(f"lost the coloc-report reader at {path}: {exc}") from None
    finally:
        sock.close()
    try:
        reply = json.loads(b"".join(chunks).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ColocError(f"the coloc-report reader at {path} sent no answer") from None
    if not isinstance(reply, dict):
        raise ColocError(f"the coloc-report reader at {path} sent a malformed answer")
    return reply
