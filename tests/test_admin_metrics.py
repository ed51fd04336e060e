"""``coloc-admin check``'s metrics-endpoint check against a real sampler daemon (replaying the H100
recording)."""
from __future__ import annotations

import dataclasses
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from slurm_coloc.admin.host_checks import check_metrics
from slurm_coloc.config import Config
from slurm_coloc.node.sampler_daemon import running_pid

REPO = Path(__file__).resolve().parents[1]
REC = REPO / "tests" / "data" / "nvml" / "h100_mps_2jobs.jsonl"


def _cfg(tmp_path: Path, port: int) -> Config:
    return dataclasses.replace(Config(), state_dir=str(tmp_path / "state"), run_dir=str(tmp_path / "run"),
                               log_dir=str(tmp_path / "log"), exporter_port=port,
                               exporter_bind_address="127.0.0.1")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def sampler(tmp_path: Path) -> Iterator[Config]:
    cfg = _cfg(tmp_path, _free_port())
    conf = tmp_path / "c.yaml"
    conf.write_text("".join(f"{k}: {json.dumps(getattr(cfg, k))}\n" for k in
                            ("state_dir", "run_dir", "log_dir", "exporter_port", "exporter_bind_address")))
    p = subprocess.Popen([sys.executable, "-m", "slurm_coloc.cli.sampler", "run", "--node", "a1", "--replay",
                          str(REC), "--interval-s", "0.1", "--foreground-log"],
                         env={**os.environ, "COLOC_CONFIG": str(conf)}, cwd=REPO, stderr=subprocess.PIPE,
                         text=True)
    try:
        for _ in range(100):
            if running_pid(cfg, "a1") == p.pid:
                break
            time.sleep(0.05)
        time.sleep(0.5)
        yield cfg
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=20)


def test_check_passes_when_the_sampler_serves(sampler: Config) -> None:
    [res] = check_metrics(sampler, no_gpu=False, node="a1")
    assert res.status == "pass", res
    assert f"http://127.0.0.1:{sampler.exporter_port}/metrics answers" in res.what


def test_check_fails_when_the_sampler_runs_but_nothing_answers(sampler: Config) -> None:
    other = dataclasses.replace(sampler, exporter_port=_free_port())  # the config names a port nobody serves
    [res] = check_metrics(other, no_gpu=False, node="a1")
    assert res.status == "fail" and "does not answer" in res.what and "sampler-a1.log" in res.fix, res


def test_check_fails_when_another_program_holds_the_port(tmp_path: Path) -> None:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        cfg = _cfg(tmp_path, srv.server_address[1])
        from slurm_coloc.node.sampler_daemon import take_lock
        fd = take_lock(cfg, "a2")  # this test process stands in for a sampler that could not bind the port
        assert fd is not None
        [res] = check_metrics(cfg, no_gpu=False, node="a2")
        os.close(fd)
    finally:
        srv.shutdown()
        srv.server_close()
    assert res.status == "fail" and "is not slurm-coloc's sampler endpoint" in res.what, res


def test_check_skips_without_sampler_gpu_or_port(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, _free_port())
    assert [r.status for r in check_metrics(cfg, no_gpu=False, node="nobody")] == ["skip"]
    assert [r.status for r in check_metrics(cfg, no_gpu=True)] == ["skip"]
    assert [r.status
            for r in check_metrics(dataclasses.replace(cfg, exporter_port=0), no_gpu=False)] == ["skip"]
