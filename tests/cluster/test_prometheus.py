"""A real Prometheus server (Debian's ``prometheus``, installed by scripts/install.sh) scrapes the samplers of
the local cluster's two nodes while real Slurm jobs run; its HTTP API shows the job labels and values, and
shows them gone once the jobs end.

No GPU here: each node's sampler replays the H100 NVML recording (tests/data/nvml, labelled there) with a
recorded MPS client's pid replaced by the live pid of the job's process, so attribution through /proc, the
Prolog's job rows and the Epilog's end are the real ones.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest

from slurm_coloc import config as config_mod
from slurm_coloc.node.sampler_daemon import running_pid
from tests.slurm_cluster import Cluster

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
REC = REPO / "tests" / "data" / "nvml" / "h100_mps_2jobs.jsonl"
GIB = 1 << 30


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError:
        return
    for _ in range(100):
        if not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            return
        time.sleep(0.1)


def _job_pid(c: Cluster, job_id: int) -> int:
    """The pid of the job's ``sleep`` (its environment names the job, and this cluster: another session's
    cluster may run a job of the same id)."""
    for _ in range(100):
        for p in Path("/proc").iterdir():
            if p.name.isdigit():
                try:
                    env = (p / "environ").read_bytes()
                    if (p / "cmdline").read_bytes().startswith(b"sleep\0") and \
                            f"SLURM_JOB_ID={job_id}".encode() in env.split(b"\0") and c.owns_environ(env):
                        return int(p.name)
                except OSError:
                    continue
        time.sleep(0.1)
    raise AssertionError(f"no process of job {job_id} in /proc")


def _query(base: str, expr: str) -> List[dict]:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(url, timeout=5) as r:
        data = json.loads(r.read())
    assert data["status"] == "success", data
    return data["data"]["result"]


def _until(base: str, expr: str, pred, timeout: float = 40) -> List[dict]:
    deadline = time.time() + timeout
    res: List[dict] = []
    while time.time() < deadline:
        res = _query(base, expr)
        if pred(res):
            return res
        time.sleep(0.5)
    raise AssertionError(f"{expr}: {res}")


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Dict[str, object]]:
    """Ports for the two samplers and a running Prometheus scraping them every second."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is not installed: run scripts/install.sh")
    ports = {"n1": _free_port(), "n2": _free_port()}
    conf = tmp_path / "prometheus.yml"
    targets = [{"targets": [f"127.0.0.1:{p}"], "labels": {"slurm_node": n}} for n, p in ports.items()]
    conf.write_text(json.dumps({"global": {"scrape_interval": "1s", "scrape_timeout": "900ms"},
                                "scrape_configs": [{"job_name": "slurm-coloc", "static_configs": targets}]}))
    web = _free_port()
    proc = subprocess.Popen([binary, f"--config.file={conf}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{web}"], stdout=subprocess.DEVNULL,
                            stderr=open(tmp_path / "prometheus.log", "w"), start_new_session=True)
    base = f"http://127.0.0.1:{web}"
    try:
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"{base}/-/ready", timeout=1):
                    break
            except OSError:
                time.sleep(0.2)
        else:
            raise AssertionError(f"prometheus not ready: {(tmp_path / 'prometheus.log').read_text()[-2000:]}")
        yield {"base": base, "ports": ports}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _sampler(c: Cluster, node: str, port: int, pid_map: str, log: Path) -> subprocess.Popen:
    env = {**c.env, "COLOC_EXPORTER_PORT": str(port), "COLOC_EXPORTER_BIND_ADDRESS": "127.0.0.1",
           "COLOC_SAMPLER_INTERVAL_S": "0.2"}
    return subprocess.Popen([sys.executable, "-m", "slurm_coloc.cli.sampler", "run", "--node", node,
                             "--replay",
                             str(REC), "--pid-map", pid_map, "--foreground-log"], env=env, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=open(log, "w"), start_new_session=True)


def _own_sampler(c: Cluster, cfg: config_mod.Config, node: str, port: int, pid_map: str,
                 tmp_path: Path) -> subprocess.Popen:
    """Our replaying sampler holding the node's lock. The Prolog may have started one (no NVML here: it takes
    the lock, fails and exits); while it holds the lock ours would exit at once, so stop it or start ours
    again."""
    for _ in range(20):
        old: Optional[int] = running_pid(cfg, node)
        if old and old > 0:
            _stop(old)
        p = _sampler(c, node, port, pid_map, tmp_path / f"sampler-{node}.log")
        for _ in range(100):
            if running_pid(cfg, node) == p.pid:
                return p
            if p.poll() is not None:
                break
            time.sleep(0.1)
        p.terminate()
        p.wait(timeout=20)
    raise AssertionError(f"our sampler never held the lock of {node}")


def test_prometheus_sees_job_labels_while_jobs_run_and_not_after(slurm_cluster: Cluster, prometheus,
                                                                 tmp_path: Path) -> None:
    c = slurm_cluster
    cfg = config_mod.load(str(c.coloc_config), environ={})
    base, ports = prometheus["base"], prometheus["ports"]
    jobs: Dict[str, int] = {}
    for node, gres in (("n1", "--gres=shard:4"), ("n2", "--gres=gpu:1")):
        res = c.run(["sbatch", "--parsable", "-w", node, gres, "-t", "3", "-o", "/dev/null", "--wrap",
                     "sleep 120"])
        assert res.returncode == 0, res.stderr
        jobs[node] = int(res.stdout.strip().split(";")[0])
    samplers: List[subprocess.Popen] = []
    try:
        for node, job in jobs.items():
            c.wait_state(job, ["RUNNING"])
            pid = _job_pid(c, job)
            recorded = "2342" if node == "n1" else "2340"
            samplers.append(_own_sampler(c, cfg, node, ports[node], f"{recorded}={pid}", tmp_path))
        _until(base, "up", lambda r: len(r) == 2 and all(x["value"][1] == "1" for x in r))
        j1, j2 = jobs["n1"], jobs["n2"]
        res = _until(base, f'coloc_job_gpu_memory_granted_bytes{{jobid="{j1}"}}', lambda r: len(r) == 1)
        labels = res[0]["metric"]
        assert (labels["node"], labels["user"], labels["mode"], labels["slurm_node"]) == \
            ("n1", "colocuser", "shard", "n1")
        assert float(res[0]["value"][1]) == 4 * GIB
        res = _until(base, f'coloc_job_gpu_memory_granted_bytes{{jobid="{j2}"}}', lambda r: len(r) == 1)
        assert (res[0]["metric"]["node"], res[0]["metric"]["mode"]) == ("n2", "whole")
        # The replayed client's memory reaches the job through its live pid (frames with it recur every ~11
        # s).
        _until(base, f'max_over_time(coloc_job_gpu_memory_used_bytes{{jobid="{j1}"}}[30s])',
               lambda r: len(r) == 1 and float(r[0]["value"][1]) >= 552 * (1 << 20))
        _until(base, f'coloc_job_gpu_energy_joules_total{{jobid="{j1}"}}',
               lambda r: len(r) == 1 and float(r[0]["value"][1]) > 0)
        tenants = _query(base, 'coloc_gpu_tenants{node="n1",gpu="0"}')
        assert [float(t["value"][1]) for t in tenants] == [1.0]
        for job in jobs.values():
            c.run(["scancel", str(job)], user=None)
        for job in jobs.values():
            c.wait_job(job)
        # Gone: the Epilog closed the rows and the processes are gone; Prometheus marks the series stale.
        _until(base, '{__name__=~"coloc_job_.*", jobid=~"%d|%d"}' % (j1, j2), lambda r: r == [], timeout=30)
        assert _query(base, "coloc_gpu_power_watts")  # the GPUs are still published
        assert not any(s.startswith(("drain", "drng")) for s in c.node_states().values())
    finally:
        for job in jobs.values():
            c.run(["scancel", str(job)], user=None)
        for p in samplers:
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=20)
    for node in jobs:
        text = (tmp_path / f"sampler-{node}.log").read_text()
        assert "Traceback" not in text and "serving http://127.0.0.1" in text, text[-2000:]


HOLD_IDLE = """
import socket, sys, time
port, n, until = int(sys.argv[1]), int(sys.argv[2]), time.time() + float(sys.argv[3])
held = []
while time.time() < until:
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
    while len(held) < n:
        held.append(socket.create_connection(("127.0.0.1", port)))
    time.sleep(0.02)
"""


def test_idle_connections_of_a_local_user_do_not_fail_prometheus_scrapes(prometheus, tmp_path: Path) -> None:
    """F3 with a real Prometheus (scraping every 1 s, 900 ms timeout): colocuser holds 16 idle
    connections to the sampler's endpoint, re-opening each one the server shuts. Before: 14 of 20 scrapes
    failed. Now every scrape of the window succeeds (``up`` is 1 in each)."""
    import dataclasses

    from slurm_coloc.node import exporter, metrics_server

    port = prometheus["ports"]["n1"]
    cfg = dataclasses.replace(config_mod.Config(), state_dir=str(tmp_path / "s"), run_dir=str(tmp_path / "r"),
                              log_dir=str(tmp_path / "l"), exporter_port=port)
    _state, exp = exporter.start(cfg, "n1", 1.0)
    assert exp is not None
    base = str(prometheus["base"])
    try:
        _until(base, 'up{slurm_node="n1"} == 1', lambda r: len(r) == 1)
        attacker = subprocess.Popen(["runuser", "-u", "colocuser", "--", "/usr/bin/python3", "-c", HOLD_IDLE,
                                     str(port), str(metrics_server.MAX_CONNECTIONS), "22"])
        try:
            time.sleep(21)
            assert attacker.poll() is None, "the attacker stopped early"
            total = _query(base, 'count_over_time(up{slurm_node="n1"}[18s])')
            good = _query(base, 'sum_over_time(up{slurm_node="n1"}[18s])')
        finally:
            attacker.terminate()
            attacker.wait(10)
        n_total, n_good = int(float(total[0]["value"][1])), int(float(good[0]["value"][1]))
        assert n_total >= 12 and n_good == n_total, (n_good, n_total)
    finally:
        exp.stop()

