"""The sampler's ``/metrics`` endpoint under connection floods, on real TCP sockets (node/metrics_server.py).

Fourth campaign (docs/reliability.md): with ``prometheus_client.start_http_server`` 500 idle connections to
127.0.0.1 (any local user, a job included) held 500 threads in the root sampler, with no timeout.
"""
from __future__ import annotations

import dataclasses
import socket
import tempfile
import threading
import time
import urllib.error
import urllib.request
from typing import Dict, Iterator, List, Optional

import pytest

from slurm_coloc.config import Config
from slurm_coloc.node import exporter, metrics_server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def endpoint(monkeypatch) -> Iterator[int]:
    monkeypatch.setattr(metrics_server, "MAX_CONNECTIONS", 8)
    monkeypatch.setattr(metrics_server, "CONNECTION_DEADLINE_S", 1.5)
    d = tempfile.mkdtemp()
    cfg = dataclasses.replace(Config(), state_dir=d + "/s", run_dir=d + "/r", log_dir=d + "/l",
                              exporter_port=_free_port())
    _state, exp = exporter.start(cfg, "n1", 1.0)
    assert exp is not None and exp.server is not None
    try:
        yield cfg.exporter_port
    finally:
        exp.stop()


def _wait_threads(limit: int, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end and threading.active_count() > limit:
        time.sleep(0.1)
    return threading.active_count() <= limit


def _scrape(port: int) -> bytes:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()


@pytest.mark.slow
def test_idle_connections_hold_a_bounded_number_of_threads_and_expire(endpoint: int) -> None:
    assert b"coloc_sampler" in _scrape(endpoint)
    before = threading.active_count()
    held: List[socket.socket] = [socket.create_connection(("127.0.0.1", endpoint)) for _ in range(100)]
    try:
        time.sleep(0.5)
        assert threading.active_count() <= before + metrics_server.MAX_CONNECTIONS  # before: + 100
        time.sleep(metrics_server.REQUEST_DEADLINE_S + 1.0)
        ends = []
        for s in held:  # each one evicted by a newer one or shut at its request deadline: no answer
            s.settimeout(5)
            ends.append(s.recv(200))
        assert set(ends) == {b""}, {e[:20] for e in ends}
        assert _wait_threads(before + 1)  # every held connection shut
        # the endpoint serves again while the idle sockets stay open
        assert b"coloc_sampler" in _scrape(endpoint)
    finally:
        for s in held:
            s.close()


def _scrapes_answered(port: int, n: int, pause_s: float) -> int:
    """How many of ``n`` scrapes, ``pause_s`` apart, returned the sampler's metrics."""
    ok = 0
    for _ in range(n):
        try:
            ok += b"coloc_sampler" in _scrape(port)
        except OSError:
            pass
        time.sleep(pause_s)
    return ok


@pytest.mark.slow
def test_idle_connections_never_starve_a_scraper() -> None:
    """F3, at the real cap of 16: before, 16 idle connections of a local user (re-opened as the
    server shut them) made 14 of 20 Prometheus scrapes fail with 503. Now a new connection takes the place of
    the oldest idle one: 20 of 20 scrapes answered while the 16 are held."""
    port = _free_port()
    d = tempfile.mkdtemp()
    cfg = dataclasses.replace(Config(), state_dir=d + "/s", run_dir=d + "/r", log_dir=d + "/l",
                              exporter_port=port)
    _state, exp = exporter.start(cfg, "n1", 1.0)
    assert exp is not None
    stop = threading.Event()
    held: List[socket.socket] = []

    def hold() -> None:  # keep 16 idle connections open, re-opening each one the server shuts
        while not stop.is_set():
            for i, s in enumerate(list(held)):
                s.setblocking(False)
                try:
                    gone = s.recv(1) == b""
                except BlockingIOError:
                    gone = False
                except OSError:
                    gone = True
                if gone:
                    s.close()
                    held[i] = socket.create_connection(("127.0.0.1", port))
            while len(held) < metrics_server.MAX_CONNECTIONS:
                held.append(socket.create_connection(("127.0.0.1", port)))
            time.sleep(0.02)

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    try:
        time.sleep(0.5)
        ok = _scrapes_answered(port, 20, 0.1)
        assert ok == 20, ok
    finally:
        stop.set()
        t.join(5)
        for s in held:
            s.close()
        exp.stop()


@pytest.mark.slow
def test_connections_dripping_their_headers_never_starve_a_scraper() -> None:
    """Fifth campaign A5 (slowloris at the cap): 16 connections that send a request line and then one
    header line every 0.1 s, re-opened when shut. Before: 8 of 20 scrapes answered. Now a request still
    arriving is idle (evictable) and cut at ``REQUEST_DEADLINE_S``: 20 of 20."""
    port = _free_port()
    d = tempfile.mkdtemp()
    cfg = dataclasses.replace(Config(), state_dir=d + "/s", run_dir=d + "/r", log_dir=d + "/l",
                              exporter_port=port)
    _state, exp = exporter.start(cfg, "n1", 1.0)
    assert exp is not None
    stop = threading.Event()

    def opened() -> socket.socket:
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /metrics HTTP/1.1\r\n")
        return s

    def drip() -> None:
        socks = [opened() for _ in range(metrics_server.MAX_CONNECTIONS)]
        while not stop.is_set():
            for i, s in enumerate(socks):
                try:
                    s.sendall(b"X-a: b\r\n")
                except OSError:
                    s.close()
                    socks[i] = opened()
            time.sleep(0.1)
        for s in socks:
            s.close()

    t = threading.Thread(target=drip, daemon=True)
    t.start()
    try:
        time.sleep(0.5)
        ok = _scrapes_answered(port, 20, 0.2)
        assert ok == 20, ok
    finally:
        stop.set()
        t.join(5)
        exp.stop()


def test_a_connection_over_the_cap_is_refused_only_when_every_open_one_is_busy() -> None:
    """The bound stays: 16 requests being answered (an app that blocks) hold 16 threads; the 17th
    connection gets one 503 line at once, no thread."""
    gate = threading.Event()

    def slow(environ, start_response):
        gate.wait(10)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"m 1\n"]

    port = _free_port()
    httpd, _t = metrics_server.serve(slow, "127.0.0.1", port)
    busy = [socket.create_connection(("127.0.0.1", port)) for _ in range(metrics_server.MAX_CONNECTIONS)]
    try:
        for s in busy:
            s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        time.sleep(1.0)
        with socket.create_connection(("127.0.0.1", port)) as extra:
            extra.settimeout(3)
            assert extra.recv(100).startswith(b"HTTP/1.0 503")
        gate.set()
        for s in busy:
            s.settimeout(5)
            got = b""
            while True:  # wsgiref writes the status line, headers and body separately
                part = s.recv(4096)
                if not part:
                    break
                got += part
            assert got.startswith(b"HTTP/1.0 200") and got.endswith(b"m 1\n"), got
    finally:
        gate.set()
        for s in busy:
            s.close()
        httpd.shutdown()


@pytest.mark.slow
def test_a_client_dripping_its_request_is_cut_at_the_deadline(endpoint: int) -> None:
    s = socket.create_connection(("127.0.0.1", endpoint))
    t0 = time.monotonic()
    cut = None
    try:
        for _ in range(60):  # one header byte every 0.1 s: each read succeeds within the read timeout
            s.sendall(b"X")
            time.sleep(0.1)
    except OSError:
        cut = time.monotonic() - t0
    else:
        s.settimeout(1)
        try:
            cut = time.monotonic() - t0 if s.recv(10) == b"" else None
        except OSError:
            cut = time.monotonic() - t0
    finally:
        s.close()
    assert cut is not None and cut < metrics_server.CONNECTION_DEADLINE_S + 5.0


def test_a_scrape_still_works_and_a_bad_request_changes_nothing(endpoint: int) -> None:
    with socket.create_connection(("127.0.0.1", endpoint)) as s:
        s.sendall(b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n")  # request line over wsgiref's 65,536
        s.settimeout(3)
        assert s.recv(100).startswith(b"HTTP/1.0 414")
    odd = urllib.request.urlopen(f"http://127.0.0.1:{endpoint}/metrics?name[]=" + "%FF" * 10,
                                 timeout=5).read()
    assert b"coloc_sampler" in odd  # the query string is dropped (F4): the whole answer
    assert b"coloc_sampler" in _scrape(endpoint)


def test_clients_that_reset_mid_request_leave_no_traceback(endpoint: int, capfd) -> None:
    """Fourth campaign: prometheus_client's server printed a 15-line traceback to the sampler's stderr for
    each client that reset its connection mid-request (3 resets, 3 tracebacks): any local user could fill the
    log."""
    import struct

    for _ in range(5):
        s = socket.create_connection(("127.0.0.1", endpoint))
        s.sendall(b"GET /metr")
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    time.sleep(1)
    assert "Traceback" not in capfd.readouterr().err
    assert b"coloc_sampler" in _scrape(endpoint)


def test_a_scrape_flood_costs_one_collection_per_ttl() -> None:
    """C5: each scrape ran the collectors; now 200 requests within the TTL make one collection, whatever the
    query string (F4: before, one per query string)."""
    calls = []

    def app(environ, start_response):
        calls.append(environ.get("QUERY_STRING"))
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"m 1\n"]

    cached = metrics_server.CachedApp(app)
    got = []
    for q in ["", "name[]=a"] * 100:
        got.append(b"".join(cached({"PATH_INFO": "/metrics", "QUERY_STRING": q}, lambda s, h: None)))
    assert calls == [""] and set(got) == {b"m 1\n"}
    time.sleep(metrics_server.ANSWER_TTL_S + 0.1)
    cached({"PATH_INFO": "/metrics", "QUERY_STRING": ""}, lambda s, h: None)
    assert len(calls) == 2


def _get(port: int, path: str, method: str = "GET", headers: Optional[Dict[str, str]] = None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_new_query_strings_paths_and_accept_headers_never_bypass_the_cache() -> None:
    """F4 on the real server with prometheus_client's real app: before, ``/metrics?r=N`` made 305
    collections in 305 requests (one per query string); a new ``Accept`` header or path per request did the
    same (fifth campaign). Now at most one collection per canonical key (OpenMetrics or text, gzip or not)
    per TTL."""
    from prometheus_client import CollectorRegistry, make_wsgi_app
    from prometheus_client.core import GaugeMetricFamily

    collections = []

    class Counting:
        def collect(self):
            collections.append(time.monotonic())
            yield GaugeMetricFamily("coloc_probe", "test gauge", value=1.0)

    registry = CollectorRegistry()
    registry.register(Counting())
    collections.clear()
    port = _free_port()
    httpd, _t = metrics_server.serve(make_wsgi_app(registry), "127.0.0.1", port)
    try:
        t0 = time.monotonic()
        n = 0
        while time.monotonic() - t0 < 0.6:  # well inside one TTL
            n += 1
            variants = [(f"/metrics?r={n}", {}), (f"/x{n}", {}),
                        ("/metrics", {"Accept": f"text/plain;version=0.0.{n}"}),
                        ("/metrics", {"Accept": f"application/openmetrics-text;version=1.0.{n};q=0.{n % 9}"})]
            for path, headers in variants:
                status, _h, body = _get(port, path, headers=headers)
                assert status == 200 and b"coloc_probe" in body, (path, headers, status, body[:80])
        assert n >= 5 and len(collections) <= 2, (n, len(collections))  # text + OpenMetrics
    finally:
        httpd.shutdown()


def test_other_methods_and_gzip_never_poison_the_cached_answer() -> None:
    """Fifth campaign: the cache key had neither the method nor ``Accept-Encoding``: a local user's ``POST``
    (405) or ``OPTIONS`` with Prometheus's exact ``Accept`` header was then served to Prometheus's GET within
    the TTL, and a gzip request's compressed body to a client that does not take gzip."""
    from prometheus_client import CollectorRegistry, make_wsgi_app
    from prometheus_client.core import GaugeMetricFamily

    class One:
        def collect(self):
            yield GaugeMetricFamily("coloc_probe", "test gauge", value=1.0)

    registry = CollectorRegistry()
    registry.register(One())
    port = _free_port()
    httpd, _t = metrics_server.serve(make_wsgi_app(registry), "127.0.0.1", port)
    prom = {"Accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"}
    try:
        for method in ("POST", "OPTIONS", "HEAD", "PUT"):
            _get(port, "/metrics", method=method, headers=prom)
            status, _h, body = _get(port, "/metrics", headers=prom)
            assert status == 200 and b"coloc_probe" in body, (method, status, body[:80])
        status, headers, _b = _get(port, "/metrics", headers={"Accept-Encoding": "gzip"})
        assert status == 200 and headers.get("Content-Encoding") == "gzip"
        status, headers, body = _get(port, "/metrics", headers={"Accept-Encoding": "identity"})
        assert "Content-Encoding" not in headers and b"coloc_probe" in body
    finally:
        httpd.shutdown()
