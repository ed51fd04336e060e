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
import urllib.request
from typing import Iterator, List

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


def test_idle_connections_hold_a_bounded_number_of_threads_and_expire(endpoint: int) -> None:
    assert b"coloc_sampler" in _scrape(endpoint)
    before = threading.active_count()
    held: List[socket.socket] = [socket.create_connection(("127.0.0.1", endpoint)) for _ in range(100)]
    try:
        time.sleep(0.5)
        assert threading.active_count() <= before + metrics_server.MAX_CONNECTIONS  # before: + 100
        time.sleep(metrics_server.CONNECTION_DEADLINE_S + 1.0)
        assert threading.active_count() <= before + metrics_server.MAX_CONNECTIONS
        ends = []
        for s in held:  # each one refused at once with one 503 line, or admitted and shut at its deadline
            s.settimeout(5)
            ends.append(s.recv(200))
        assert all(e.startswith(b"HTTP/1.0 503") or e == b"" for e in ends), {e[:20] for e in ends}
        assert ends.count(b"") >= 1 and sum(e.startswith(b"HTTP/1.0 503") for e in ends) >= 1
        assert _wait_threads(before + 1)  # every held connection shut at its deadline
        # the endpoint serves again while the idle sockets stay open
        assert b"coloc_sampler" in _scrape(endpoint)
    finally:
        for s in held:
            s.close()


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
    assert odd == b""  # a filter naming no metric: an empty answer, no error
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
    """C5: each scrape ran the collectors; now 200 requests within the TTL make one collection, per query."""
    calls = []

    def app(environ, start_response):
        calls.append(environ.get("QUERY_STRING"))
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"m 1\n"]

    cached = metrics_server.CachedApp(app)
    got = []
    for q in ["", "name[]=a"] * 100:
        got.append(b"".join(cached({"PATH_INFO": "/metrics", "QUERY_STRING": q}, lambda s, h: None)))
    assert calls == ["", "name[]=a"] and set(got) == {b"m 1\n"}
    time.sleep(metrics_server.ANSWER_TTL_S + 0.1)
    cached({"PATH_INFO": "/metrics", "QUERY_STRING": ""}, lambda s, h: None)
    assert len(calls) == 3
