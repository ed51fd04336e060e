"""Fourth campaign, C1 and C5 (docs/reliability.md): connection floods against the sampler's ``/metrics`` endpoint.

Starts the endpoint as the sampler does (``node/exporter.start``, an empty live state) on a free port and prints
one table: threads of the process after N idle connections, with this project's bounded server and with
``prometheus_client.start_http_server`` (what the endpoint used before), then the worst extra delay of a 0.1 s
sleep loop in the serving process while another process scrapes it over 16 connections, and the time per scrape.

    .venv/bin/python -m benchmarks.metrics_flood [--idle 500]
"""
from __future__ import annotations

import argparse
import dataclasses
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from prometheus_client import CollectorRegistry, start_http_server

from slurm_coloc.config import Config
from slurm_coloc.node import exporter


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _idle_threads(port: int, n: int) -> int:
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
    time.sleep(1.0)
    count = threading.active_count()
    for s in held:
        s.close()
    return count


def _worst_delay(seconds: float) -> float:
    worst, end = 0.0, time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.monotonic()
        time.sleep(0.1)
        worst = max(worst, time.monotonic() - t - 0.1)
    return worst


FLOOD = """import threading, time, urllib.request, sys
def h():
    end = time.time() + float(sys.argv[2])
    while time.time() < end:
        try: urllib.request.urlopen(sys.argv[1], timeout=5).read()
        except Exception: pass
ts = [threading.Thread(target=h) for _ in range(16)]
[t.start() for t in ts]; [t.join() for t in ts]
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--idle", type=int, default=500, help="idle connections to open")
    args = ap.parse_args()
    d = tempfile.mkdtemp()
    cfg = dataclasses.replace(Config(), state_dir=d + "/s", run_dir=d + "/r", log_dir=d + "/l", exporter_port=_port())
    base = threading.active_count()
    _state, exp = exporter.start(cfg, "n1", 1.0)
    assert exp is not None
    time.sleep(0.3)
    ours = _idle_threads(cfg.exporter_port, args.idle)
    time.sleep(12)  # the held connections reach their deadline
    url = f"http://127.0.0.1:{cfg.exporter_port}/metrics"
    idle = _worst_delay(3)
    flood = subprocess.Popen([sys.executable, "-c", FLOOD, url, "6"])
    time.sleep(0.5)
    busy = _worst_delay(4)
    flood.wait()
    t0 = time.monotonic()
    for _ in range(50):
        urllib.request.urlopen(url).read()
    per_scrape_ms = (time.monotonic() - t0) / 50 * 1000
    exp.stop()
    port = _port()
    srv, _ = start_http_server(port, addr="127.0.0.1", registry=CollectorRegistry())
    theirs = _idle_threads(port, args.idle)
    srv.shutdown()
    print(f"| measure ({args.idle} idle connections; threads before: {base}) | value |")
    print("|---|---|")
    print(f"| threads, bounded server (node/metrics_server.py) | {ours} |")
    print(f"| threads, prometheus_client.start_http_server | {theirs} |")
    print(f"| worst extra delay of a 0.1 s loop, idle | {idle * 1000:.0f} ms |")
    print(f"| worst extra delay of a 0.1 s loop, 16-connection scrape flood | {busy * 1000:.0f} ms |")
    print(f"| time per scrape | {per_scrape_ms:.1f} ms |")


if __name__ == "__main__":
    main()
