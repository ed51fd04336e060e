"""The reader service's limits on real Unix sockets (N5: 1,000 slow connections of one user were
held by 1,002 threads): a connection cap, a per-uid cap (``SO_PEERCRED``), refusals at once with one line, and
whole-request / whole-answer deadlines for slow clients (report/reader.py).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from slurm_coloc.report import reader


@pytest.fixture()
def server(monkeypatch) -> Iterator[reader.ReaderServer]:
    monkeypatch.setattr(reader, "MAX_CONNECTIONS", 12)
    monkeypatch.setattr(reader, "MAX_PER_UID", 5)
    monkeypatch.setattr(reader, "REQUEST_TIMEOUT_S", 1.5)
    monkeypatch.setattr(reader, "SEND_TIMEOUT_S", 1.5)
    base = Path(tempfile.mkdtemp(prefix="coloc-reader-"))  # /tmp: other uids reach it (pytest's tmp is 0700)
    os.chmod(base, 0o755)
    path = base / "r.sock"

    def answer(request: Any, uid: int) -> Dict[str, Any]:
        if request.get("op") == "big":
            return {"ok": True, "blob": "x" * (8 << 20)}
        if request.get("op") == "slow":  # an expensive report (each reads every database)
            time.sleep(3)
        return {"ok": True, "uid": uid}

    srv = reader.ReaderServer(str(path), answer)
    os.chmod(path, 0o666)
    th = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    th.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        th.join(5)
        shutil.rmtree(base, ignore_errors=True)


def _idle(path: str, n: int) -> List[socket.socket]:
    out = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        out.append(s)
    return out


def _wait(cond, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def _recv_all(s: socket.socket, timeout: float = 3.0) -> bytes:
    s.settimeout(timeout)
    chunks = []
    while True:
        c = s.recv(65536)
        if not c:
            return b"".join(chunks)
        chunks.append(c)


AS_USER = """import json, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.settimeout(5); s.connect(sys.argv[1])
s.sendall(b'{"op": "x"}\\n'); s.shutdown(socket.SHUT_WR)
data = b''
while True:
    c = s.recv(65536)
    if not c: break
    data += c
print(data.decode().strip())
"""


def _ask_as(user: str, path: str) -> Dict[str, Any]:
    out = subprocess.run(["runuser", "-u", user, "--", sys.executable, "-c", AS_USER, path], text=True,
                         capture_output=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_one_uids_idle_connections_are_capped_and_the_excess_refused_at_once(
        server: reader.ReaderServer) -> None:
    path = server.server_address
    held = _idle(path, reader.MAX_PER_UID)
    try:
        assert _wait(lambda: server.active == reader.MAX_PER_UID)
        threads = threading.active_count()
        extra = _idle(path,
                      50)  # before: each held a thread until its 10 s recv timeout, and a drip renewed it
        t0 = time.monotonic()
        replies = [_recv_all(s) for s in extra]
        assert time.monotonic() - t0 < 2.0  # at once, not after a timeout
        assert all(r.count(b"\n") == 1 and json.loads(r)["ok"] is False and "busy" in json.loads(r)["error"]
                   for r in replies), replies[:2]
        assert server.active == reader.MAX_PER_UID and threading.active_count() <= threads + 1
        assert server.refused == 50
        if os.geteuid() == 0:  # another uid is still answered while this one is at its cap
            assert _ask_as("colocuser", path) == {"ok": True, "uid": 2001}
        for s in extra:
            s.close()
    finally:
        for s in held:
            s.close()
    assert _wait(lambda: server.active == 0 and not server.per_uid)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (runuser: connections of several uids)")
def test_the_total_cap_holds_across_uids(server: reader.ReaderServer) -> None:
    path = server.server_address
    held = _idle(path, reader.MAX_PER_UID)  # root: 5
    holder = subprocess.Popen(["runuser", "-u", "colocuser", "--", sys.executable, "-c",
                               "import socket,sys,time\nss=[]\nfor _ in range(5):\n"
                               "    s=socket.socket(socket.AF_UNIX);s.connect(sys.argv[1]);ss.append(s)\n"
                               "print('held',flush=True);time.sleep(30)", path], stdout=subprocess.PIPE,
                               text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert _wait(lambda: server.active == 10)
        more = _ask_as("colocuser2", path)  # 11th: admitted (cap 12), answered after its request
        assert more == {"ok": True, "uid": 2002}
        two = _idle(path, 2)  # root is at its per-uid cap: refused
        assert all(b"busy" in _recv_all(s) for s in two)
    finally:
        holder.kill()
        holder.wait()
        for s in held:
            s.close()
    assert _wait(lambda: server.active == 0)


def test_a_client_dripping_bytes_is_dropped_at_the_request_deadline(server: reader.ReaderServer) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(server.server_address)
    t0 = time.monotonic()
    dropped = None
    try:
        for _ in range(100):  # one byte every 0.1 s: each recv succeeds well inside any per-recv timeout
            s.sendall(b" ")
            time.sleep(0.1)
            if server.active == 0:
                dropped = time.monotonic() - t0
                break
    except OSError:
        dropped = time.monotonic() - t0
    finally:
        s.close()
    assert dropped is not None and dropped < reader.REQUEST_TIMEOUT_S + 1.0, dropped


def test_a_client_that_never_reads_its_answer_is_dropped_at_the_send_deadline(
        server: reader.ReaderServer) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(server.server_address)
    # 8 MiB answer, never read: before, sendall without a timeout held the thread
    s.sendall(b'{"op": "big"}\n')
    try:
        assert _wait(lambda: server.active == 1, 2)
        assert _wait(lambda: server.active == 0, reader.SEND_TIMEOUT_S + 3)
    finally:
        s.close()


def test_a_normal_request_is_answered(server: reader.ReaderServer) -> None:
    reply = reader.ask(Path(server.server_address), {"op": "x"}, timeout_s=5)
    assert reply == {"ok": True, "uid": os.geteuid()}


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (runuser: a second uid)")
def test_one_uids_expensive_requests_do_not_take_every_answer_slot(server: reader.ReaderServer) -> None:
    """Fourth campaign: four slow reports of one user took all ``MAX_CONCURRENT`` slots and every other user's
    request waited behind them; one uid now holds at most ``MAX_ANSWERS_PER_UID``."""
    slow = [threading.Thread(target=reader.ask, args=(Path(server.server_address), {"op": "slow"}, 20))
            for _ in range(reader.MAX_CONCURRENT)]
    for t in slow:
        t.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    assert _ask_as("colocuser", server.server_address) == {"ok": True, "uid": 2001}
    assert time.monotonic() - t0 < 2.5  # before: after the first slow answers (3 s)
    for t in slow:
        t.join(20)


def test_a_deeply_nested_request_is_one_line_of_error_and_the_service_goes_on(
        server: reader.ReaderServer) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(server.server_address)
    s.sendall(b"[" * 60000 + b"\n")
    reply = json.loads(_recv_all(s))
    s.close()
    assert reply["ok"] is False and reply["exit_code"] == 2 and "not one line of JSON" in reply["error"]
    assert reader.ask(Path(server.server_address), {"op": "x"}, timeout_s=5)["ok"] is True
