"""coloc-report on real SQLite files written by the package's own writers (no Slurm needed)."""
from __future__ import annotations

import csv
import io
import json
import os
import random
import subprocess
from pathlib import Path

import pytest

from slurm_coloc import config as config_mod
from slurm_coloc.hooks import ctld as ctld_hooks
from slurm_coloc.hooks import figures
from slurm_coloc.nvml.readings import GpuReading
from slurm_coloc.report import views
from slurm_coloc.report.query import parse_when
from slurm_coloc.report.summarize import load_report
from slurm_coloc.store import jobs as store_jobs
from slurm_coloc.store import oom as store_oom
from slurm_coloc.store import report_queries as rq
from slurm_coloc.store import samples, summaries
from slurm_coloc.store.db import open_ctld_db, open_node_db, open_readonly
from tests.slurm_cluster import VENV_BIN

T0 = 1_700_000_000.0  # sample times; jobs: A [T0, T0+600] and B [T0+300, T0+900] share n1 GPU 0


def _job(ctld, node, job_id, user, gpu, shards, est, start, end, state="COMPLETED", mode="shard"):
    store_jobs.record_submission(ctld, store_jobs.JobSubmission(
        job_id=job_id, user_name=user, job_name=f"j{job_id}", shards_req=shards, share_mode=mode,
        estimate_mib=est,
        estimate_method="analytic" if est else None, submit_ts=start - 1))
    store_jobs.record_ctld_end(ctld,
                               store_jobs.JobEnd(job_id, end, state, 0 if state == "COMPLETED" else 1, 0),
                               node_list="n1", start_ts=start)
    store_jobs.record_node_start(node, store_jobs.JobStart(job_id, "n1", user, None, str(gpu), shards,
                                                           f"gres:shard:{shards}", start))
    store_jobs.record_node_end(node, store_jobs.JobEnd(job_id, end, state, 0, 0, "n1"))


@pytest.fixture()
def state(tmp_path: Path) -> Path:
    """ctld.db + nodes/n1.db (samples, summaries) + a corrupt nodes/n9.db, and a config pointing at them."""
    st = tmp_path / "state"
    ctld = open_ctld_db(st / "ctld.db")
    node = open_node_db(st / "nodes" / "n1.db")
    _job(ctld, node, 11, "alice", 0, 8, 6000, T0, T0 + 600)
    _job(ctld, node, 12, "bob", 0, 4, 3000, T0 + 300, T0 + 900, state="FAILED")
    _job(ctld, node, 13, "bob", 1, 80, None, T0 + 2000, T0 + 2400, mode="whole-gpu")
    _job(ctld, node, 14, "carol", 1, 2, 1500, T0 + 1500, T0 + 1600)  # no summary: figures from samples
    summaries.record_summary(node, summaries.JobSummary(11, "n1", "0", T0, T0 + 600, 2048.0, 5.0, 9.0, 3.0,
                                                        4.0, 36000.0, 600.0, 600))
    summaries.record_summary(node,
                             summaries.JobSummary(12, "n1", "0", T0 + 300, T0 + 900, 4096.0, 60.0, 80.0, 40.0,
                                                    50.0, 72000.0, 600.0, 600))
    store_oom.claim_retry(ctld,
                          store_oom.OomRecord(job_id=12, ts=T0 + 900, user_name="bob", share_mode="shard",
                                                    shards=4, fence_mib=4096, retry_status="submitted",
                                                    retry_job_id=13, retry_state="COMPLETED"))
    rows = []
    for k in range(1700):  # 1 Hz on GPU 0 and 1: util 100 %, SM activity k % 100 on GPU 0, 20 % on GPU 1
        ts = T0 + k
        rows += samples.gpu_rows(ts,
                                 [GpuReading(index=0, util_pct=100.0, mem_used_mib=1000.0 + k, power_w=200.0,
                                                 energy_j=200.0 * k, smact_pct=float(k % 100),
                                                 smocc_pct=10.0),
                                      GpuReading(index=1, util_pct=50.0, mem_used_mib=500.0, power_w=100.0,
                                                 energy_j=None, smact_pct=20.0, smocc_pct=None)], 1.0)
    samples.write_rows(node, rows, [], [GpuReading(index=0, mem_total_mib=81559.0),
                                        GpuReading(index=1, mem_total_mib=81559.0)])
    (st / "nodes" / "n9.db").write_bytes(b"not a database" * 50)
    (tmp_path / "coloc.yaml").write_text(f"state_dir: {st}\ngpu_mem_gib: 80\n"
                                         "report_waste_min_runtime_s: 60\n")
    return tmp_path


def _cfg(state: Path):
    return config_mod.load(str(state / "coloc.yaml"), environ={})


def _report(state: Path, *args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(VENV_BIN / "coloc-report"), *args, "--config", str(state / "coloc.yaml")],
                          capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=60)


def test_job_figures_and_corrupt_node_file_skipped(state: Path):
    cfg = _cfg(state)
    report = load_report(cfg)
    assert any("n9.db" in p for p in report.problems)
    jobs = {j.job_id: j for j in views.select_jobs(report, cfg, views.Filters(), views.Viewer("root", True))}
    a, b, c, d = jobs[11], jobs[12], jobs[13], jobs[14]
    assert a.requested_mib == 8192 and a.peak_mem_mib == 2048 and a.unused_mib == 8192 - 2048
    assert a.estimate_error_mib == 6000 - 2048 and round(a.estimate_error_pct) == round(100 * 3952 / 2048)
    assert a.util_mean == pytest.approx(100.0) and a.smact_mean == 5.0 and a.smact_p95 == 9.0
    assert a.energy_kwh == pytest.approx(36000 / 3.6e6) and a.gpu_hours == pytest.approx(8 / 80 * 600 / 3600)
    assert len(a.waste) == 2 and "low SM activity" in a.waste[0] and "75% unused" in a.waste[1]
    assert b.oom and b.retry_job_id == 13 and b.retry_outcome == "COMPLETED" and not b.waste
    assert c.retry_of == 12 and c.requested_mib == 80 * 1024 and "no samples recorded for this job" in c.notes
    assert c.gpu_hours == pytest.approx(400 / 3600)
    # no summary: read from the samples of its span on GPU 1 (SM activity 20 %, util 50 %, no SM occupancy)
    assert d.smact_mean == pytest.approx(20.0) and d.util_mean == pytest.approx(50.0) and d.smocc_mean is None
    assert any("no Epilog summary" in n for n in d.notes)


def test_gpu_view_collocation_and_percentiles(state: Path):
    cfg = _cfg(state)
    report = load_report(cfg)
    flt = views.Filters(since=T0, until=T0 + 1699)
    jobs = views.select_jobs(report, cfg, flt, views.Viewer("root", True), with_util=False)
    rows = {(r["node"], r["gpu"]): r
            for r in views.gpu_rows(report, jobs, flt, views.Viewer("root", True), T0)}
    g0 = rows[("n1", 0)]
    assert g0["jobs"] == 2 and g0["busy_hours"] == pytest.approx(900 / 3600, abs=1e-3)
    assert g0["collocation_factor"] == pytest.approx(1200 / 900, abs=0.01)
    assert g0["smact_mean"] == pytest.approx(sum(k % 100 for k in range(1700)) / 1700, abs=0.1)
    assert g0["smact_p95"] == 94.0 and g0["smocc_p95"] == 10.0 and g0["util_mean"] == 100.0
    assert g0["energy_kwh"] == pytest.approx(200 * 1699 / 3.6e6, abs=1e-4)
    g1 = rows[("n1", 1)]
    assert g1["smocc_mean"] is None and g1["energy_kwh"] == pytest.approx(100 * 1700 / 3.6e6, abs=1e-4)
    cluster = views.cluster_row(rows.values(), jobs)  # type: ignore[arg-type]
    assert cluster["jobs"] == 3 and cluster["ooms"] == 1 and cluster["oom_retries_completed"] == 1


def test_job_util_sums_exact_against_brute_force(state: Path):
    db = open_readonly(state / "state" / "nodes" / "n1.db")
    rng = random.Random(3)
    spans = [(k, rng.choice((0, 1)), T0 + rng.uniform(-50, 1500), 0.0) for k in range(40)]
    spans = [(k, g, a, a + rng.uniform(0, 900)) for k, g, a, _ in spans]
    got = rq.job_util_sums(db, spans, bucket_s=60.0)
    for k, g, a, z in spans:
        ts = [T0 + i for i in range(1700) if a <= T0 + i <= z]
        want = len(ts) * (100.0 if g == 0 else 50.0)
        assert got[k][0] == pytest.approx(want) and got[k][1] == pytest.approx(len(ts)), (k, g, a, z)


def test_percentile_from_histogram():
    assert rq.percentile_from_histogram({}, 0.95) is None
    assert rq.percentile_from_histogram({0: 94.0, 100: 6.0}, 0.95) == 100.0
    assert rq.percentile_from_histogram({0: 95.0, 100: 5.0}, 0.95) == 0.0


@pytest.mark.slow
def test_cli_json_csv_sort_filters(state: Path):
    out = _report(state, "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert set(data) == {"jobs", "problems"} and [j["job_id"] for j in data["jobs"]] == [11, 12, 13, 14]
    for key in ("job_id", "user", "nodes", "gpus", "shards", "share_mode", "estimate_mib", "estimate_method",
                "state", "exit_code", "signal", "start_ts", "end_ts", "runtime_s", "peak_mem_mib", "waste"):
        assert key in data["jobs"][0]
    users = json.loads(_report(state, "users", "--json", "--sort", "gpu_hours", "--desc").stdout)["users"]
    assert [u["user"] for u in users] == ["bob", "alice", "carol"] and users[0]["ooms"] == 1
    rows = list(csv.DictReader(io.StringIO(_report(state, "gpus", "--csv").stdout)))
    assert [(r["node"], r["gpu"]) for r in rows] == [("n1", "0"), ("n1", "1")]
    only = json.loads(_report(state, "--json", "--user", "bob", "--since", f"@{T0 + 950}").stdout)["jobs"]
    assert [j["job_id"] for j in only] == [13]
    bad = _report(state, "users", "--sort", "nope")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "'nope'" in bad.stderr
    bad = _report(state, "--since", "last tuesday")
    assert bad.returncode == 2 and "invalid time" in bad.stderr and "Traceback" not in bad.stderr
    table = _report(state, env={"COLUMNS": "260"})  # every column (tests/test_report_output.py: narrower)
    assert table.returncode == 0 and "job 11 wasteful: low SM activity" in table.stdout
    assert "n9.db" in table.stdout and "OOM, retry 13 COMPLETED" in table.stdout
    cluster = _report(state, "cluster")
    assert "collocation factor" in cluster.stdout and cluster.returncode == 0


def test_viewer_rules(state: Path):
    cfg = _cfg(state)
    assert views.current_viewer(cfg, 0).sees_all
    report = load_report(cfg)
    mine = views.select_jobs(report, cfg, views.Filters(), views.Viewer("bob", False), with_util=False)
    assert {j.user for j in mine} == {"bob"}


def test_parse_when():
    assert parse_when("2d", now=1000000.0) == 1000000.0 - 2 * 86400
    assert parse_when("@123.5") == 123.5
    with pytest.raises(Exception, match="invalid time"):
        parse_when("yesterday-ish")


def _node_epilog_figures(cfg, job_id: int, node: str = "n1") -> None:
    """What the node Epilog does last (hooks/figures.py): the job's figures into its node database."""
    assert "error" not in figures.record(cfg, open_node_db(cfg.node_db_path(node)), job_id, node)


def test_admin_comment_summary(state: Path):
    cfg = _cfg(state)
    assert json.loads(ctld_hooks.build(cfg, 11, wait_s=0)) == {  # no node stored figures: what was asked
        "coloc": 1, "est_mib": 6000, "method": "analytic", "mode": "shard", "shards": 8, "req_mib": 8192,
        "measured": False}
    for job in (11, 12, 13, 14):
        _node_epilog_figures(cfg, job)
    text = ctld_hooks.build(cfg, 11, wait_s=0)
    d = json.loads(text)
    assert d["coloc"] == 1 and d["peak_mib"] == 2048 and d["est_mib"] == 6000 and d["smact"] == 5.0
    assert " " not in text and "waste" not in d and "finding" not in d  # facts only: judgement is advise's
    assert json.loads(ctld_hooks.build(cfg, 12, wait_s=0))["retry"] == 13
    assert ctld_hooks.build(cfg, 999, wait_s=0) is None


def _pipeline_summary(cfg, job_id: int):
    """The AdminComment dict of the job as the whole report pipeline sees it now (``load_report``,
    ``add_usage``)."""
    from slurm_coloc.report.usage import add_usage

    report = load_report(cfg)
    return figures.summary_dict(add_usage(next(j for j in report.jobs if j.job_id == job_id), report, cfg))


def test_the_controller_records_what_the_report_pipeline_gives(state: Path):
    """EpilogSlurmctld's text (the node Epilog's facts, hooks/figures.py + the controller's OOM record) is the
    text the whole report pipeline gives at its time, also when the OOM was recorded after the node Epilog
    computed the figures: the light path (report/facts.py only) and ``add_usage`` agree."""
    cfg = _cfg(state)
    for job in (11, 12, 13, 14):
        _node_epilog_figures(cfg, job)
        light = figures.compute(cfg, job)
        assert light is not None and light["summary"] == _pipeline_summary(cfg, job)
        assert ctld_hooks.build(cfg, job, wait_s=0) == json.dumps(light["summary"], separators=(",", ":"))
    ctld = open_ctld_db(state / "state" / "ctld.db")
    store_oom.claim_retry(ctld,
                          store_oom.OomRecord(job_id=11, ts=T0 + 700, user_name="alice", share_mode="shard",
                                                    shards=8, retry_status="submitted", retry_job_id=15))
    after = figures.compute(cfg, 11)  # the facts now, knowing the OOM
    assert after is not None and after["summary"]["oom"] is True and after["summary"]["retry"] == 15
    assert after["summary"] == _pipeline_summary(cfg, 11)
    assert ctld_hooks.build(cfg, 11, wait_s=0) == json.dumps(after["summary"], separators=(",", ":"))


@pytest.mark.slow
def test_plot_writes_readable_pngs(state: Path, tmp_path: Path):
    out = tmp_path / "plots"
    proc = _report(state, "plot", "--since", f"@{T0 - 60}", "--until", f"@{T0 + 1760}", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    names = sorted(p.name for p in out.iterdir())
    assert names == ["estimate-vs-peak.png", "timeline-n1-gpu0.png", "timeline-n1-gpu1.png"]
    for p in out.iterdir():
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 20000
