"""The HTTP server of the sampler's ``/metrics`` endpoint, bounded: the sampler runs as root and its watchdog
needs threads, so no client may make it hold unbounded threads or connections (any local user can connect to
127.0.0.1).

``prometheus_client.start_http_server`` serves each connection in its own thread with no timeout: 500 idle TCP
connections held 500 threads in the sampler (docs/reliability.md, fourth campaign). Here at most
``MAX_CONNECTIONS`` are served at once; a connection over the cap gets one ``503`` line at once and is closed
in the accepting thread; every connection is shut down ``CONNECTION_DEADLINE_S`` after its accept, whatever it
sends (a client that drips bytes is not kept alive by them). Answers are computed one at a time and reused for
``ANSWER_TTL_S`` (per query string and ``Accept`` header, at most ``MAX_CACHED`` of them), so a scrape flood
costs the sampler one collection per second, not one per request. Stdlib only (``wsgiref``); the WSGI app is
the caller's.
"""
from __future__ import annotations

import logging
import socket
import threading
import time
from socketserver import ThreadingMixIn
from typing import Any, Callable, Dict, List, Tuple
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

log = logging.getLogger("slurm_coloc.sampler")

MAX_CONNECTIONS = 16  # a scrape takes milliseconds; Prometheus keeps one connection per target
CONNECTION_DEADLINE_S = 10.0
READ_TIMEOUT_S = 5.0
ANSWER_TTL_S = 1.0  # Prometheus scrapes every 15-60 s; samples change every sampler interval (>= 0.5 s)
MAX_CACHED = 8
BUSY = b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class _QuietHandler(WSGIRequestHandler):
    timeout = READ_TIMEOUT_S  # StreamRequestHandler: per-read timeout; the server's deadline bounds the total

    def log_message(self, format: str, *args: Any) -> None:  # the base class's name
        pass


class BoundedWSGIServer(ThreadingMixIn, WSGIServer):
    """A WSGI server with a connection cap and a per-connection deadline (module docstring)."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.lock = threading.Lock()
        self.open: Dict[Any, float] = {}
        self.refused = 0
        self._last_log = 0.0
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Admit the connection to a handler thread, or answer 503 and close it when ``MAX_CONNECTIONS``
        are open (logged at most once a minute).

        Args:
            request: the accepted socket.
            client_address: the peer's address.
        """
        with self.lock:
            admit = len(self.open) < MAX_CONNECTIONS
            if admit:
                self.open[request] = time.monotonic()
            else:
                self.refused += 1
        if not admit:
            try:
                request.setblocking(False)
                request.send(BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            now = time.monotonic()
            if now - self._last_log > 60:
                self._last_log = now
                log.warning("metrics: refused a connection (%d open, at most %d); %d refused so far",
                            len(self.open), MAX_CONNECTIONS, self.refused)
            return
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        """Forget the connection's deadline and close it.

        Args:
            request: the connection's socket.
        """
        with self.lock:
            self.open.pop(request, None)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that timed out or went away: no traceback (clients must not fill the sampler's log).

        Args:
            request: the connection's socket.
            client_address: the peer's address (logged at debug level).
        """
        log.debug("metrics: dropped a client %s", client_address)

    def service_actions(self) -> None:
        """Each poll of ``serve_forever``: shut down connections past their deadline (their thread then
        ends)."""
        now = time.monotonic()
        with self.lock:
            late = [r for r, t0 in self.open.items() if now - t0 > CONNECTION_DEADLINE_S]
        for r in late:
            try:
                r.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class CachedApp:
    """A WSGI app computed one request at a time, its answers reused for ``ANSWER_TTL_S`` (module
    docstring)."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app
        self.lock = threading.Lock()
        self.cache: Dict[Tuple[str, str, str], Tuple[float, str, List[Tuple[str, str]], bytes]] = {}

    def __call__(self, environ: Dict[str, Any], start_response: Callable[..., Any]) -> List[bytes]:
        key = (str(environ.get("PATH_INFO", "")), str(environ.get("QUERY_STRING", "")),
               str(environ.get("HTTP_ACCEPT", "")))
        with self.lock:
            now = time.monotonic()
            hit = self.cache.get(key)
            if hit is None or now - hit[0] > ANSWER_TTL_S:
                got: Dict[str, Any] = {}

                def keep(status: str, headers: List[Tuple[str, str]], exc_info: Any = None) -> Callable[...,
                                                                                                        Any]:
                    got["status"], got["headers"] = status, list(headers)
                    return lambda data: None

                body = b"".join(self.app(environ, keep))
                hit = (now, got["status"], got["headers"], body)
                if len(self.cache) >= MAX_CACHED:
                    self.cache = {k: v for k, v in self.cache.items() if now - v[0] <= ANSWER_TTL_S}
                if len(self.cache) < MAX_CACHED:
                    self.cache[key] = hit
        start_response(hit[1], hit[2])
        return [hit[3]]


def serve(app: Callable[..., Any], addr: str, port: int) -> Tuple[BoundedWSGIServer, threading.Thread]:
    """Serve ``app`` (through ``CachedApp``) on ``addr:port`` in a daemon thread (IPv4 or IPv6 as ``addr``
    resolves).

    Args:
        app: the WSGI app (prometheus-client's ``make_wsgi_app``).
        addr: the bind address or host name.
        port: the TCP port.

    Returns:
        The server (``shutdown()`` stops it) and its thread.

    Raises:
        OSError: the address cannot be bound (in use, not local) or resolved (``socket.gaierror``).
    """
    family, _, _, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM,
                                                   flags=socket.AI_PASSIVE)[0]

    class _Server(BoundedWSGIServer):
        address_family = family

    httpd = make_server(str(sockaddr[0]), port, CachedApp(app), _Server, handler_class=_QuietHandler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.5},
                              name="coloc-exporter-http", daemon=True)
    thread.start()
    return httpd, thread  # type: ignore[return-value]
