"""The HTTP server of the sampler's ``/metrics`` endpoint, bounded: the sampler runs as root and its watchdog
needs threads, so no client may make it hold unbounded threads or connections (any local user can connect to
127.0.0.1; ``prometheus_client.start_http_server`` serves each connection in its own thread, no timeout).

At most ``MAX_CONNECTIONS`` are served at once, each shut down ``CONNECTION_DEADLINE_S`` after its accept
whatever it sends (dripped bytes do not keep it alive), and one whose request has not fully arrived within
``REQUEST_DEADLINE_S`` is shut too. A scraper sends its request as it connects, so at the cap a new connection
replaces the oldest one still waiting for its request; only when every open connection is being answered is
the new one refused (one ``503`` line, no thread). Threads: at most ``MAX_CONNECTIONS`` open plus as many
evicted ones, which end as soon as their read sees the shutdown.

Answers are computed one at a time and reused for ``ANSWER_TTL_S``, keyed by what they depend on
(``answer_key``): OpenMetrics or text, gzip or not. A GET of any path but ``/favicon.ico`` is the metrics, the
query string dropped (``name[]`` filters are not served), so ``/metrics?r=N`` cannot force a collection per
request; other methods never reach the cache. Stdlib only (``wsgiref``); the WSGI app is the caller's.
"""
from __future__ import annotations

import logging
import socket
import threading
import time
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Set, Tuple
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

if TYPE_CHECKING:
    from _typeshed import OptExcInfo
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

log = logging.getLogger("slurm_coloc.sampler")

MAX_CONNECTIONS = 16  # a scrape takes milliseconds; Prometheus keeps one connection per target
CONNECTION_DEADLINE_S = 10.0
REQUEST_DEADLINE_S = 2.0  # a scraper's request arrives with its connection
READ_TIMEOUT_S = 5.0
ANSWER_TTL_S = 1.0  # Prometheus scrapes every 15-60 s; samples change every sampler interval (>= 0.5 s)
OPENMETRICS = "application/openmetrics-text"
BUSY = b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class _QuietHandler(WSGIRequestHandler):
    timeout = READ_TIMEOUT_S  # StreamRequestHandler: per-read timeout; the server's deadline bounds the total

    def log_message(self, format: str, *args: Any) -> None:  # the base class's name
        pass

    def parse_request(self) -> bool:
        """The base class's parse; a request that arrived whole makes its connection busy (not evictable)."""
        ok = super().parse_request()
        if ok and isinstance(self.server, BoundedWSGIServer):
            self.server.mark_busy(self.request)
        return ok


class BoundedWSGIServer(ThreadingMixIn, WSGIServer):
    """A WSGI server with a connection cap and a per-connection deadline (module docstring)."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = 64  # listen backlog (socketserver's 5 fills in a connect storm; SYNs then wait)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.lock = threading.Lock()
        self.open: Dict[Any, float] = {}  # connection -> accept time (monotonic s)
        self.busy: Set[Any] = set()  # connections whose request arrived whole
        self.closing: Set[Any] = set()  # evicted, their threads ending
        self.refused = 0
        self.evicted = 0
        self._last_log = 0.0
        super().__init__(*args, **kwargs)

    def mark_busy(self, request: Any) -> None:
        """The request arrived whole: the connection is no longer evictable."""
        with self.lock:
            if request in self.open:
                self.busy.add(request)

    def _evict_idle(self) -> bool:
        """Shut down the oldest open connection still waiting for its request (caller holds the lock);
        False when every open connection is busy or too many evicted ones are still ending."""
        idle = [(t0, id(r), r) for r, t0 in self.open.items() if r not in self.busy]
        if not idle or len(self.closing) >= MAX_CONNECTIONS:
            return False
        victim = min(idle)[2]
        self.open.pop(victim, None)
        self.closing.add(victim)
        self.evicted += 1
        try:
            victim.shutdown(socket.SHUT_RDWR)  # its handler's read ends at once, then its thread
        except OSError:
            pass
        return True

    def process_request(self, request: Any, client_address: Any) -> None:
        """Admit the connection to a handler thread (at the cap, in place of the oldest idle one), or answer
        503 and close it when every open connection is busy (logged at most once a minute)."""
        with self.lock:
            admit = len(self.open) < MAX_CONNECTIONS or self._evict_idle()
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
                log.warning("metrics: refused a connection (%d open, all busy, at most %d); %d refused so "
                            "far", len(self.open), MAX_CONNECTIONS, self.refused)
            return
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        """Forget the connection's deadline and close it."""
        with self.lock:
            self.open.pop(request, None)
            self.busy.discard(request)
            self.closing.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that timed out or went away: no traceback (clients must not fill the sampler's log)."""
        log.debug("metrics: dropped a client %s", client_address)

    def service_actions(self) -> None:
        """Each poll of ``serve_forever``: shut down connections past their deadline, or still without their
        request after ``REQUEST_DEADLINE_S`` (their thread then ends)."""
        now = time.monotonic()
        with self.lock:
            late = [r for r, t0 in self.open.items()
                    if now - t0 > (CONNECTION_DEADLINE_S if r in self.busy else REQUEST_DEADLINE_S)]
        for r in late:
            try:
                r.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def answer_key(environ: WSGIEnvironment) -> Optional[Tuple[bool, bool]]:
    """``(OpenMetrics asked, gzip accepted)`` (``Accept`` read as prometheus_client's ``choose_encoder``
    does), or None for a request that is not a GET of the metrics (never cached)."""
    if environ.get("REQUEST_METHOD", "GET") != "GET" or environ.get("PATH_INFO") == "/favicon.ico":
        return None
    accept = str(environ.get("HTTP_ACCEPT") or "")
    om = any(part.split(";")[0].strip().lower() == OPENMETRICS for part in accept.split(","))
    gz = "gzip" in str(environ.get("HTTP_ACCEPT_ENCODING") or "").lower()
    return om, gz


class CachedApp:
    """A WSGI app computed one request at a time, its answers reused for ``ANSWER_TTL_S`` per
    ``answer_key`` (at most 4 keys; module docstring)."""

    def __init__(self, app: WSGIApplication) -> None:
        self.app = app
        self.lock = threading.Lock()
        self.cache: Dict[Tuple[bool, bool], Tuple[float, str, List[Tuple[str, str]], bytes]] = {}

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> List[bytes]:
        key = answer_key(environ)
        if key is None:
            return list(self.app(environ, start_response))  # answered without a collection
        with self.lock:
            now = time.monotonic()
            hit = self.cache.get(key)
            if hit is None or now - hit[0] > ANSWER_TTL_S:
                got: Dict[str, Any] = {}

                def keep(status: str, headers: List[Tuple[str, str]],
                         exc_info: Optional[OptExcInfo] = None) -> Callable[[bytes], object]:
                    got["status"], got["headers"] = status, list(headers)
                    return lambda data: None

                canonical = {**environ, "PATH_INFO": "/metrics", "QUERY_STRING": "",
                             "HTTP_ACCEPT": f"{OPENMETRICS}; version=1.0.0" if key[0] else "",
                             "HTTP_ACCEPT_ENCODING": "gzip" if key[1] else ""}
                body = b"".join(self.app(canonical, keep))
                hit = (now, got["status"], got["headers"], body)
                self.cache[key] = hit
        start_response(hit[1], hit[2])
        return [hit[3]]


def serve(app: WSGIApplication, addr: str, port: int) -> Tuple[BoundedWSGIServer, threading.Thread]:
    """Serve ``app`` (through ``CachedApp``) on ``addr:port`` (IPv4 or IPv6) in a daemon thread. Raises
    OSError: the address cannot be bound or resolved (``socket.gaierror``)."""
    family, _, _, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM,
                                                   flags=socket.AI_PASSIVE)[0]

    class _Server(BoundedWSGIServer):
        address_family = family

    httpd = make_server(str(sockaddr[0]), port, CachedApp(app), _Server, handler_class=_QuietHandler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.5},
                              name="coloc-exporter-http", daemon=True)
    thread.start()
    return httpd, thread  # type: ignore[return-value]
