"""The GPU watchdog (node/watchdog.py) without Slurm: its rule on NVML data recorded on the H100, real
processes signalled through the real /proc, events in real SQLite.

Recorded inputs: ``tests/data/nvml/h100_mps_2jobs.jsonl`` (two honest MPS clients, one of them dying of an
honest OOM under its fence), the process lists of the hostile run in
``benchmarks/device/results/h100-mps-limits/mps_limits.json`` (an MPS client that raised its fence and one
that left MPS, each at 21,092 MiB, beside a 9,158 MiB neighbour) and the measured peaks of the collocated GPU
runs of docs/benchmarks.md (``benchmarks/device/results/*/report.txt``).
"""
from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import time
from pathlib import Path
from typing import Dict, Optional

import pytest

from slurm_coloc.config import Config
from slurm_coloc.node import lifecycle
from slurm_coloc.node.attribution import JobAttributor
from slurm_coloc.node.sampler import Sampler
from slurm_coloc.node.watchdog import (
    Tenant,
    Watchdog,
    WatchdogEvidence,
    find_violations,
    near_grant,
    user_message,
    verdict,
)
from slurm_coloc.nvml import ReplayReader
from slurm_coloc.nvml.readings import Frame, ProcLists
from slurm_coloc.store import jobs as store_jobs
from slurm_coloc.store import oom as store_oom
from slurm_coloc.store.db import open_node_db

REPO = Path(__file__).resolve().parents[1]
REC = REPO / "tests" / "data" / "nvml" / "h100_mps_2jobs.jsonl"
LIMITS = REPO / "benchmarks" / "device" / "results" / "h100-mps-limits" / "mps_limits.json"
REPORTS = sorted((REPO / "benchmarks" / "device" / "results").glob("*/report.txt"))


def _hostile_lists() -> ProcLists:
    """GPU 0's process lists at the offenders' peak, from the H100 run (max MiB per pid over the run)."""
    row = next(r for r in json.loads(LIMITS.read_text())["rows"] if r["scenario"] == "escape_kill")
    return ProcLists(0, tuple((int(p), float(m)) for p, m in row["compute_list_pids"].items()),
                     tuple((int(p), float(m)) for p, m in row["mps_list_pids"].items()))


def test_hostile_run_rule_finds_both_offenders_not_the_neighbour() -> None:
    lists = _hostile_lists()
    assert dict(lists.compute or ())[1110] == 21092 and 1110 not in dict(lists.mps
                                                                         or ())  # the escaper, as measured
    job_of = {1080: 1, 1110: 2, 1132: 3, 1101: None}  # 1101: the MPS server (66 MiB), no job
    tenants = {1: Tenant(1, 0, 10240, "mps"), 2: Tenant(2, 0, 2048, "mps"), 3: Tenant(3, 0, 2048, "mps")}
    found = {(f.job_id, f.reason): f for f in find_violations([lists], job_of, tenants, 512)}
    assert set(found) == {(2, "over-grant"), (2, "outside-mps"), (3, "over-grant")}
    assert found[(3, "over-grant")].used_mib == 21092 and found[(2, "outside-mps")].pids == (1110,)
    assert "21,092 MiB" in user_message(found[(3, "over-grant")], 512, "stop")


def test_the_verdict_confirms_in_the_second_frame_exempts_the_mps_server_and_paces() -> None:
    """The pure verdict on the hostile H100 lists: no act in the first frame (fast pace), one act per job in
    the second with its kill pids and stderr line; a finding made of MPS server pids is no finding."""
    lists = _hostile_lists()
    job_of = {1080: 1, 1110: 2, 1132: 3, 1101: None}
    tenants = {1: Tenant(1, 0, 10240, "mps"), 2: Tenant(2, 0, 2048, "mps"), 3: Tenant(3, 0, 2048, "mps")}
    ev = WatchdogEvidence([lists], job_of, tenants, frozenset(), frozenset(), frozenset(), "stop", 512, 90,
                          1.0, 0.5, 0.1)
    first = verdict(ev)
    assert first.acts == () and first.next_interval_s == 0.1
    assert first.pending == {(2, 0, "over-grant"), (2, 0, "outside-mps"), (3, 0, "over-grant")}
    second = verdict(dataclasses.replace(ev, pending=first.pending, acted={3}))
    (act,) = second.acts  # job 2 once (its first finding), job 3 already acted on
    assert (act.finding.key, act.kill_pids) == ((2, 0, "over-grant"), (1110,)) and second.pending == set()
    assert act.message == user_message(act.finding, 512, "stop") and act.message.startswith(
        "slurm-coloc: job 2 stopped by the GPU watchdog: its processes used 21,092 MiB of shared GPU 0")
    recorded = verdict(dataclasses.replace(ev, pending=first.pending, action="record"))
    assert [a.kill_pids for a in recorded.acts] == [(), ()] and "job 2 recorded" in recorded.acts[0].message
    exempt = verdict(dataclasses.replace(ev, job_of={**job_of, 1101: 3}, tenants={3: tenants[3]},
                                         mps_server_pids={1101}))
    assert exempt.pending == {(3, 0, "over-grant")}  # 1132 is not only a server pid: still a finding
    assert verdict(dataclasses.replace(ev, job_of={1101: 3}, tenants={3: tenants[3]},
                                       mps_server_pids={1101})).pending == set()
    assert verdict(dataclasses.replace(ev, tenants={})).next_interval_s == 1.0


def test_outside_mps_needs_the_mps_list_and_applies_to_mps_jobs_only() -> None:
    lists = _hostile_lists()
    job_of = {1110: 2}
    mps_tenant = {2: Tenant(2, 0, 40960, "mps")}  # a grant large enough: only the escape is left
    assert [f.reason for f in find_violations([lists], job_of, mps_tenant, 512)] == ["outside-mps"]
    unread = dataclasses.replace(lists, mps=None)  # MPS list query failed: no verdict on MPS membership
    assert find_violations([unread], job_of, mps_tenant, 512) == []
    timeslice = {2: Tenant(2, 0, 40960, "timeslice")}  # a job that runs without MPS by design
    assert find_violations([lists], job_of, timeslice, 512) == []


def test_memory_on_a_gpu_without_a_grant_counts_against_zero() -> None:
    lists = [ProcLists(0, ((10, 900.0),), ((10, 900.0),)), ProcLists(1, ((11, 3000.0),), ())]
    found = find_violations(lists, {10: 5, 11: 5}, {5: Tenant(5, 0, 2048, "mps")}, 512)
    assert [(f.gpu_index, f.reason, f.grant_mib) for f in found] == [(1, "over-grant", 0.0)]


def test_recorded_honest_jobs_give_no_finding() -> None:
    """Every frame of the H100 recording (job 9101 fenced at 2 GiB, OOM'd under its fence; 9102 at 4 GiB)."""
    r = ReplayReader(str(REC))
    pids = {int(v): int(k) for k, v in r.header["pids"].items()}
    tenants = {9101: Tenant(9101, 0, 2048, "mps"), 9102: Tenant(9102, 0, 4096, "mps")}
    n = 0
    for _ in range(len(r.frames)):
        f = r.read()
        assert f.lists and f.lists[0].derived
        assert find_violations(f.lists, pids, tenants, 0) == []  # not even without tolerance
        n += 1
    assert n == 56


def _report_rows():
    """(job, request MiB, peak MiB) of shard rows in the rendered coloc-report tables of the GPU runs."""
    unit = {"MiB": 1, "GiB": 1024}
    for path in REPORTS:
        for line in path.read_text().splitlines():
            cells = [c.strip() for c in line.split("│")]
            if len(cells) < 9 or not cells[1].isdigit() or cells[4] != "shard":
                continue
            req, peak = re.fullmatch(r"([\d.]+) (MiB|GiB)", cells[5]), re.fullmatch(r"([\d.]+) (MiB|GiB)",
                                                                                    cells[7])
            if req and peak:
                yield (path.parent.name, int(cells[1]), float(req[1]) * unit[req[2]],
                       float(peak[1]) * unit[peak[2]])


def test_measured_peaks_of_the_gpu_runs_are_within_grant() -> None:
    """The watchdog's rule on each collocated job's measured peak (the report's rounding: at most 0.05
    GiB)."""
    rows = list(_report_rows())
    assert len(rows) >= 20, rows
    cfg = Config()
    for run, job, req, peak in rows:
        lists = [ProcLists(0, ((1000 + job, peak),), ((1000 + job, peak),))]
        assert find_violations(lists, {1000 + job: job}, {job: Tenant(job, 0, req, "mps")},
                               cfg.watchdog_tolerance_mib) == [], (run, job, req, peak)
        assert peak <= req + 52, (run, job, req, peak)  # within the grant itself, up to the report's rounding


# --- the Watchdog object: tenants from env files + job_runs, real processes, real SQLite
# ---------------------------


def _cfg(tmp_path: Path, **kw: object) -> Config:
    return dataclasses.replace(Config(), state_dir=str(tmp_path / "state"), run_dir=str(tmp_path / "run"),
                               log_dir=str(tmp_path / "log"), slurm_bin_dir=str(tmp_path / "no-slurm"),
                               mps_control_bin="/nonexistent/nvidia-cuda-mps-control", **kw)  # type: ignore[arg-type]


def _tenant(cfg: Config, node: str, job: int, gpu: int, shards: int, share: str = "mps") -> None:
    fence = [("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", f"0={shards}G")] if share == "mps" else []
    pairs = [("COLOC_SHARE", share)] + fence
    lifecycle.write_env(cfg, job, pairs)
    db = open_node_db(cfg.node_db_path(node))
    store_jobs.record_node_start(db, store_jobs.JobStart(job, node, "colocuser", 2001, str(gpu), shards,
                                                         f"gres:shard:{shards}", time.time()))


def _proc(job: Optional[int]) -> subprocess.Popen:
    env = {"PATH": "/usr/bin:/bin", **({"SLURM_JOB_ID": str(job)} if job is not None else {})}
    return subprocess.Popen(["sleep", "60"], env=env)


def _frame(pairs: Dict[int, float], mps: Dict[int, float]) -> Frame:
    return Frame(ts=time.time(), lists=[ProcLists(0, tuple(pairs.items()), tuple(mps.items()))])


def test_stop_needs_two_frames_kills_only_the_offender_and_records(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    _tenant(cfg, "n1", 71, 0, 2)
    _tenant(cfg, "n1", 72, 0, 10)  # the neighbour's fence in the H100 run
    bad, good, server = _proc(71), _proc(72), _proc(None)
    try:
        wd = Watchdog(cfg, "n1", cfg.node_db_path("n1"), JobAttributor())
        job_of = {bad.pid: 71, good.pid: 72, server.pid: None}
        frame = _frame({bad.pid: 21092.0, good.pid: 9158.0, server.pid: 66.0},
                       {bad.pid: 21092.0, good.pid: 9158.0})
        assert wd.tick(frame, job_of, 1.0) == cfg.watchdog_fast_interval_s  # suspicion: read again soon
        assert bad.poll() is None and wd.events == []
        frame.ts = time.time()
        wd.tick(frame, job_of, 1.0)
        assert bad.wait(5) == -9 and good.poll() is None and server.poll() is None
        wd.join()
        (ev,) = store_oom.load_events(open_node_db(cfg.node_db_path("n1")), 71)
        assert (ev.reason, ev.share, ev.grant_mib, ev.used_mib, ev.action) == ("over-grant", "mps", 2048,
                                                                               21092, "stop")
        # no Slurm here
        assert ev.outcome["killed"] == [bad.pid] and ev.outcome["scancel"].startswith("failed")
        assert "not rerun" in ev.message
        assert store_oom.stopped_by_watchdog(open_node_db(cfg.node_db_path("n1")), 71)
        assert not store_oom.stopped_by_watchdog(open_node_db(cfg.node_db_path("n1")), 72)
        frame.ts = time.time()
        wd.tick(frame, job_of, 1.0)  # acted once: no second event
        assert len(store_oom.load_events(open_node_db(cfg.node_db_path("n1")))) == 1
        _report_and_admin_comment_name_the_stop(cfg)
    finally:
        for p in (bad, good, server):
            p.kill()
            p.wait()


def _report_and_admin_comment_name_the_stop(cfg: Config) -> None:
    """coloc-report's job view and the AdminComment summary carry the watchdog's reason for job 71, not for
    72."""
    from slurm_coloc.hooks.figures import summary_dict
    from slurm_coloc.report.summarize import JobView, Report
    from slurm_coloc.report.usage import add_usage

    report = Report()
    report.node_dbs["n1"] = open_node_db(cfg.node_db_path("n1"))
    views = {j: add_usage(JobView(job_id=j, user="u", name="x", nodes="n1", gpus="n1:0", shards=2,
                                  share_mode="shard",
                                  estimate_mib=1000, estimate_method="trace", state="CANCELLED", exit_code=0,
                                  signal=9, start_ts=None, end_ts=None), report, cfg) for j in (71, 72)}
    assert views[71].watchdog == "stopped: over its grant (20.6 GiB of 2.0 GiB) on n1 GPU 0", \
        views[71].watchdog
    assert views[72].watchdog is None
    assert summary_dict(views[71])["watchdog"].startswith("stopped: over its grant")
    assert "watchdog" not in summary_dict(views[72]) and views[71].to_json()["watchdog"]


def test_the_grant_is_the_recorded_shards_and_the_env_file_is_read_checked(tmp_path: Path) -> None:
    """The grant comes from ``job_runs.shards`` (never from the fence text, here edited to 700 MiB); an env
    file another user could write is not trusted for its ``COLOC_SHARE`` (``lifecycle.read_env``)."""
    cfg = _cfg(tmp_path)
    _tenant(cfg, "n1", 91, 0, 3)
    lifecycle.write_env(cfg, 91, [("COLOC_SHARE", "mps"), ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=700M")])
    _tenant(cfg, "n1", 92, 0, 5)
    lifecycle.env_path(cfg, 92).chmod(0o666)
    wd = Watchdog(cfg, "n1", cfg.node_db_path("n1"), JobAttributor())
    tenants = wd.refresh_tenants(force=True)
    assert tenants[91] == Tenant(91, 0, 3072.0, "mps", 2001)
    assert tenants[92] == Tenant(92, 0, 5120.0, "timeslice", 2001)
    assert lifecycle.read_env(cfg, 92) == [] and dict(lifecycle.read_env(cfg, 91))["COLOC_SHARE"] == "mps"


def test_a_pid_that_no_longer_belongs_to_the_job_is_not_signalled(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    _tenant(cfg, "n1", 81, 0, 2)
    other = _proc(99)  # the pid now runs job 99's process
    try:
        wd = Watchdog(cfg, "n1", cfg.node_db_path("n1"), JobAttributor())
        done, skipped = wd.kill(81, [other.pid])
        assert done == [] and "no longer" in skipped[other.pid] and other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_record_mode_and_off_never_signal(tmp_path: Path) -> None:
    for action in ("record", "off"):
        cfg = _cfg(tmp_path / action, watchdog_action=action)
        _tenant(cfg, "n1", 91, 0, 2)
        p = _proc(91)
        try:
            wd = Watchdog(cfg, "n1", cfg.node_db_path("n1"), JobAttributor())
            for _ in range(3):
                wd.tick(_frame({p.pid: 5000.0}, {p.pid: 5000.0}), {p.pid: 91}, 1.0)
            assert p.poll() is None
            evs = store_oom.load_events(open_node_db(cfg.node_db_path("n1")), 91)
            assert [e.action for e in evs] == (["record"] if action == "record" else [])
        finally:
            p.kill()
            p.wait()


def test_pacing_follows_tenants_and_their_grants(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    wd = Watchdog(cfg, "n1", cfg.node_db_path("n1"), JobAttributor())
    assert wd.tick(_frame({}, {}), {}, 1.0) == 1.0  # no shard job on the node: the sampler's own interval
    _tenant(cfg, "n1", 61, 0, 4)
    assert wd.tick(_frame({5: 1000.0}, {5: 1000.0}), {5: 61}, 1.0) == cfg.watchdog_interval_s
    assert wd.tick(_frame({5: 3900.0}, {5: 3900.0}), {5: 61}, 1.0) == cfg.watchdog_fast_interval_s  # > 90 %
    assert near_grant([ProcLists(0, ((5, 3600.0),), ())], {5: 61}, wd.tenants, 90) is False


def test_sampler_rows_cover_the_shortened_tick(tmp_path: Path) -> None:
    """With a tenant on the node the sampler ticks at ``watchdog_interval_s`` and its rows say so
    (``res_s``)."""
    cfg = _cfg(tmp_path, sampler_interval_s=1.0)
    _tenant(cfg, "n1", 9102, 0, 4)
    s = Sampler(cfg, "n1", ReplayReader(str(REC)))
    t0 = time.monotonic()
    s.run(max_frames=4)
    assert 1.2 <= time.monotonic() - t0 < 3.0  # 3 waits of 0.5 s, not of 1 s
    assert {r["res_s"] for r in open_node_db(cfg.node_db_path("n1"))["gpu_samples"].rows} == {0.5}
    assert s.watchdog.events == []


def test_frame_lists_round_trip_through_a_recording() -> None:
    f = Frame(ts=100.0, lists=[ProcLists(0, ((1, 2.5), (2, None)), None)])
    back = Frame.from_json(json.loads(json.dumps(f.to_json(t0=90.0))), ts=100.0)
    assert back.lists == f.lists and not back.lists[0].derived


def test_stderr_target_from_recorded_squeue_json() -> None:
    import dataclasses

    from slurm_coloc.errors import SlurmError
    from slurm_coloc.slurm.jobinfo import parse_squeue_json
    from slurm_coloc.slurm.jobs import parse_stderr_target
    jobs = parse_squeue_json((REPO / "tests" / "data" / "slurm-22.05" / "squeue_json_running.json")
                             .read_text())
    job = next(j for j in jobs if j.stderr_path)
    t = parse_stderr_target(job)
    assert t.path == job.stderr_path and t.path.startswith("/")
    assert (t.uid, t.gid) == (job.uid, job.gid)
    with pytest.raises(SlurmError):
        parse_stderr_target(dataclasses.replace(job, uid=None))
