"""The sampler's Prometheus endpoint (node/livestate.py, node/exporter.py) on the H100 NVML recording.

No GPU here: frames come from ``tests/data/nvml/h100_mps_2jobs.jsonl`` (recorded on the H100, labelled there),
the job rows from a real node database written by the store functions the Prolog and Epilog use. The recorded
processes are attributed to jobs 9101 and 9102 as their Slurm environment said on the recording machine.
"""
from __future__ import annotations

import dataclasses
import logging
import socket
import time
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from slurm_coloc.config import Config
from slurm_coloc.node import exporter, livestate
from slurm_coloc.node.livestate import GIB, LiveState
from slurm_coloc.node.sampler import Sampler
from slurm_coloc.nvml import ReplayReader
from slurm_coloc.nvml.readings import Frame, GpuReading
from slurm_coloc.store import jobs as store_jobs
from slurm_coloc.store.db import open_node_db
from slurm_coloc.store.samples import ProcSample

REC = Path(__file__).parent / "data" / "nvml" / "h100_mps_2jobs.jsonl"
JOB_OF_PID = {2340: 9101, 2342: 9102}  # the recording's header: job 9101 -> pid 2340, 9102 -> 2342


def _cfg(tmp_path: Path, **kw) -> Config:
    return dataclasses.replace(Config(), state_dir=str(tmp_path / "state"), run_dir=str(tmp_path / "run"),
                               log_dir=str(tmp_path / "log"), **kw)


def _start(cfg: Config, job_id: int, shards, gpus: str = "0", user: str = "colocuser") -> None:
    db = open_node_db(cfg.node_db_path("e1"))
    store_jobs.record_node_start(db, store_jobs.JobStart(job_id=job_id, node="e1", user_name=user, uid=2001,
                                                         gpus=gpus, shards=shards, gres="",
                                                         start_ts=time.time()))


def _end(cfg: Config, job_id: int) -> None:
    db = open_node_db(cfg.node_db_path("e1"))
    store_jobs.record_node_end(db, store_jobs.JobEnd(job_id=job_id, node="e1", end_ts=time.time(),
                                                     state="COMPLETED", exit_code=0, signal=None))


def _feed(state: LiveState, n: int, drop_jobs: Tuple[int, ...] = ()) -> List[Frame]:
    """Observe the last ``n`` frames that hold both recorded processes, stamped 0.5 s apart ending now."""
    reader = ReplayReader(str(REC))
    frames = [reader.read() for _ in range(len(reader.frames))]
    both = [f for f in frames if {p.pid for p in f.procs} >= set(JOB_OF_PID)][-n:]
    t0 = time.time() - 0.5 * len(both)
    for i, f in enumerate(both):
        f.ts = t0 + 0.5 * i
        procs = [ProcSample(p, JOB_OF_PID.get(p.pid)) for p in f.procs
                 if JOB_OF_PID.get(p.pid) not in drop_jobs]
        state.observe(f, procs)
    return both


def _scrape(state: LiveState, names: str = "coloc", collector=None) -> Dict[str, List]:
    reg = exporter.CollectorRegistry(auto_describe=False)
    reg.register(collector or exporter.ColocCollector(state, names))
    text = generate_latest(reg).decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def _state(cfg: Config) -> LiveState:
    return LiveState(cfg, "e1", livestate.node_job_rows(cfg, "e1"), interval_s=0.5)


@pytest.mark.slow
def test_job_series_carry_labels_grant_and_energy_share_then_vanish(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    _start(cfg, 9101, 2)
    _start(cfg, 9102, 4)
    state = _state(cfg)
    frames = _feed(state, 6)
    m = _scrape(state)
    used = {s.labels["jobid"]: s for s in m["coloc_job_gpu_memory_used_bytes"]}
    assert set(used) == {"9101", "9102"}
    assert used["9102"].labels == {"node": "e1", "gpu": "0", "jobid": "9102", "user": "colocuser",
                                   "mode": "shard"}
    rec_mem = sum(p.used_mem_mib for p in frames[-1].procs if p.pid == 2342) * (1 << 20)
    assert used["9102"].value == pytest.approx(rec_mem)
    granted = {s.labels["jobid"]: s.value for s in m["coloc_job_gpu_memory_granted_bytes"]}
    assert granted == {"9101": 2 * GIB, "9102": 4 * GIB}
    # Energy: the GPU's counter difference over the frames, split by memory (MPS clients report no SM util).
    energy = {s.labels["jobid"]: s.value for s in m["coloc_job_gpu_energy_joules"]}
    gpu_de = frames[-1].gpus[0].energy_j - frames[0].gpus[0].energy_j
    assert 0 < energy["9101"] < energy["9102"] and energy["9101"] + energy["9102"] == pytest.approx(gpu_de)
    assert "coloc_job_gpu_sm_utilization_ratio" not in m or not m["coloc_job_gpu_sm_utilization_ratio"]
    gpu = {s.name: s.value for fam in ("coloc_gpu_tenants", "coloc_gpu_mps_enabled") for s in m[fam]}
    assert gpu == {"coloc_gpu_tenants": 2.0, "coloc_gpu_mps_enabled": 1.0}
    # Job 9101 ends: Epilog row closed and its process gone -> its series and its accumulator go.
    _end(cfg, 9101)
    time.sleep(2.1)  # the running-jobs cache (JOB_ROWS_TTL_S)
    _feed(state, 1, drop_jobs=(9101,))
    m = _scrape(state)
    assert {s.labels["jobid"] for s in m["coloc_job_gpu_memory_used_bytes"]} == {"9102"}
    assert all(k[0] != 9101 for k in state._energy)
    assert [s.value for s in m["coloc_gpu_tenants"]] == [1.0]


def test_a_running_job_without_a_process_yet_has_zero_use_on_its_granted_gpu(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, gpu_mem_gib=80)
    _start(cfg, 77, None, gpus="0,1")  # gpu:2 (whole GPUs), nothing on the GPUs yet
    state = _state(cfg)
    _feed(state, 2, drop_jobs=(9101, 9102))
    m = _scrape(state)
    rows = {(s.labels["jobid"], s.labels["gpu"], s.labels["mode"]): s.value
            for s in m["coloc_job_gpu_memory_used_bytes"]}
    assert rows == {("77", "0", "whole"): 0.0, ("77", "1", "whole"): 0.0}
    granted = {s.labels["gpu"]: s.value for s in m["coloc_job_gpu_memory_granted_bytes"]}
    assert granted["0"] == pytest.approx(81559.0 * (1 << 20)) and granted["1"] == 80 * GIB  # GPU 1: not read


def test_jobstats_names_answer_jobstats_queries_per_job_on_a_shared_gpu(tmp_path: Path) -> None:
    """jobstats selects a job's GPU series with ``X and nvidia_gpu_jobId == J`` (same label set)."""
    cfg = _cfg(tmp_path)
    _start(cfg, 9101, 2)
    _start(cfg, 9102, 4)
    state = _state(cfg)
    frames = _feed(state, 4)
    m = _scrape(state, "jobstats")
    job_series = [s for s in m["nvidia_gpu_jobId"] if s.value == 9102]
    assert len(job_series) == 1
    key = job_series[0].labels
    assert set(key) == {"minor_number", "name", "uuid", "jobid"} and key["minor_number"] == "0"
    pick = {n: next(s.value for s in m[n] if s.labels == key) for n in
            ("nvidia_gpu_memory_used_bytes", "nvidia_gpu_memory_total_bytes", "nvidia_gpu_duty_cycle")}
    assert pick["nvidia_gpu_memory_total_bytes"] == 4 * GIB
    assert pick["nvidia_gpu_memory_used_bytes"] == pytest.approx(
        sum(p.used_mem_mib for p in frames[-1].procs if p.pid == 2342) * (1 << 20))
    shares = [next(s.value for s in m["nvidia_gpu_duty_cycle"] if s.labels["jobid"] == j)
              for j in ("9101", "9102")]
    assert sum(shares) == pytest.approx(frames[-1].gpus[0].util_pct)  # the GPU's utilization, split by share
    assert [s.value for s in m["nvidia_gpu_num_devices"]] == [1.0]


def test_dcgm_names_give_one_series_per_job_with_hpc_job(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    _start(cfg, 9101, 2)
    _start(cfg, 9102, 4)
    state = _state(cfg)
    frames = _feed(state, 4)
    m = _scrape(state, "dcgm")
    sm = {s.labels["hpc_job"]: s for s in m["DCGM_FI_PROF_SM_ACTIVE"]}
    assert set(sm) == {"9101", "9102"}
    assert set(sm["9102"].labels) == {"gpu", "UUID", "device", "modelName", "Hostname", "hpc_job"}
    assert sm["9102"].labels["Hostname"] == "e1" and sm["9102"].labels["device"] == "nvidia0"
    assert sum(s.value for s in sm.values()) == pytest.approx(frames[-1].gpus[0].smact_pct / 100)
    fb = {s.labels["hpc_job"]: s.value for s in m["DCGM_FI_DEV_FB_FREE"]}
    used = {s.labels["hpc_job"]: s.value for s in m["DCGM_FI_DEV_FB_USED"]}
    assert fb["9102"] == pytest.approx(4096 - used["9102"])


def test_unreadable_node_database_is_one_log_line_and_gpu_series_stay(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = _cfg(tmp_path)
    path = cfg.node_db_path("e1")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"this is not a SQLite database" * 100)
    state = _state(cfg)
    sampler = Sampler(cfg, "e1", ReplayReader(str(REC)), db_path=tmp_path / "other.db", interval_s=0.1,
                      live=state)
    with caplog.at_level(logging.ERROR, logger="slurm_coloc"):
        for _ in range(3):
            assert sampler.step()
            m = _scrape(state)
            state._rows_at = -1e9  # re-read at every scrape: still one line
    lines = [r.getMessage() for r in caplog.records if "running jobs" in r.getMessage()]
    assert len(lines) == 1 and "cannot read the running jobs of e1" in lines[0]
    assert [s.value for s in m["coloc_exporter_job_rows_ok"]] == [0.0]
    assert m["coloc_gpu_power_watts"] and sampler.frames == 3 and sampler.flush()


def test_a_bad_reading_fails_the_scrape_softly_and_never_the_sampler(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    cfg = _cfg(tmp_path)
    state = _state(cfg)
    bad = Frame(ts=time.time(), gpus=[GpuReading(index=0, util_pct="n/a", energy_j=1.0)])  # type: ignore[arg-type]
    state.observe(bad, [])
    collector = exporter.ColocCollector(state)
    with caplog.at_level(logging.ERROR, logger="slurm_coloc"):
        m = _scrape(state, collector=collector)
        m = _scrape(state, collector=collector)
    assert [s.value for s in m["coloc_exporter_collect_errors"]] == [2.0]
    assert "coloc_gpu_power_watts" not in m
    assert len([r for r in caplog.records if "cannot build the scrape" in r.getMessage()]) == 1


def test_port_in_use_is_one_line_and_the_sampler_samples(tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg = _cfg(tmp_path, exporter_port=port, exporter_bind_address="127.0.0.1")
        with caplog.at_level(logging.INFO, logger="slurm_coloc"):
            live, endpoint = exporter.start(cfg, "e1", 0.1)
            assert endpoint is not None and endpoint.server is None
            s = Sampler(cfg, "e1", ReplayReader(str(REC)), interval_s=0.1, live=live)
            s.run(max_frames=5)
            endpoint.stop()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and f"cannot serve http://127.0.0.1:{port}/metrics" in errors[0], errors
    assert s.frames == 5 and s.flushes >= 1


def test_port_zero_turns_the_endpoint_off(tmp_path: Path) -> None:
    assert exporter.start(_cfg(tmp_path, exporter_port=0), "e1") == (None, None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_scrapes_during_a_sampler_restart_answer_whole_or_are_refused(tmp_path: Path) -> None:
    """Scrape every 50 ms while the sampler daemon is stopped (SIGTERM) and started again: each scrape is a
    complete exposition or a refused (or reset) connection, never an error page or a half answer; the new
    sampler serves."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import threading
    import urllib.request

    port = _free_port()
    cfg = _cfg(tmp_path, exporter_port=port, exporter_bind_address="127.0.0.1")
    conf = tmp_path / "c.yaml"
    conf.write_text("".join(f"{k}: {json.dumps(getattr(cfg, k))}\n" for k in
                            ("state_dir", "run_dir", "log_dir", "exporter_port", "exporter_bind_address")))
    argv = [sys.executable, "-m", "slurm_coloc.cli.sampler", "run", "--node", "r1", "--replay", str(REC),
            "--interval-s", "0.1", "--foreground-log"]
    env = {**os.environ, "COLOC_CONFIG": str(conf)}
    outcomes: List[str] = []
    starts: set = set()
    stop = threading.Event()

    def scrape() -> None:
        while not stop.is_set():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
                fams = {f.name: f for f in text_string_to_metric_families(text)}
                starts.update(s.value for s in fams["coloc_sampler_start_time_seconds"].samples)
                outcomes.append("ok" if "coloc_exporter_collect_errors" in fams else "partial")
            except (ConnectionError, urllib.error.URLError) as exc:
                text = str(exc).lower()  # refused (nobody listens) or reset (accepted as the server closed)
                outcomes.append("refused" if "refused" in text or "reset" in text else f"error {exc}")
            time.sleep(0.05)

    procs = [subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)]
    t = threading.Thread(target=scrape)
    t.start()
    try:
        time.sleep(2.0)
        procs[0].send_signal(signal.SIGTERM)
        procs[0].wait(timeout=20)
        procs.append(subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True))
        time.sleep(3.0)
    finally:
        stop.set()
        t.join()
        for p in procs:
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=20)
    assert set(outcomes) <= {"ok", "refused"}, sorted(set(outcomes))
    # both samplers served; the second after the first stopped
    assert outcomes[-1] == "ok" and len(starts) == 2
    assert "Traceback" not in procs[0].stderr.read() + procs[1].stderr.read()  # type: ignore[union-attr]
