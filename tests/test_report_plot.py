"""coloc-report's pictures read right at a glance: the time axis fits the data, job labels never overlap, and
the cluster's mean |estimate error| scores only estimates (real SQLite files, real matplotlib)."""
from __future__ import annotations

from pathlib import Path
from typing import List

import matplotlib.dates as mdates
import pytest

from slurm_coloc import config as config_mod
from slurm_coloc.nvml.readings import GpuReading
from slurm_coloc.report import plot, views
from slurm_coloc.report.summarize import JobView, load_report
from slurm_coloc.store import jobs as store_jobs
from slurm_coloc.store import samples
from slurm_coloc.store.db import open_ctld_db, open_node_db

T0 = 1_700_000_000.0
DAY = 86400.0
ROOT = views.Viewer("root", True)


def _job(job_id: int, start: float, end: float, **kw: object) -> JobView:
    base = dict(job_id=job_id, user="alice", name="j", nodes="n1", gpus="n1:0", shards=2, share_mode="shard",
                estimate_mib=2048, estimate_method="analytic", state="COMPLETED", exit_code=0, signal=0,
                start_ts=start, end_ts=end)
    base.update(kw)
    return JobView(**base)  # type: ignore[arg-type]


def _xlim(ax) -> List[float]:  # type: ignore[no-untyped-def]
    return [mdates.num2date(x).timestamp() for x in ax.get_xlim()]


@pytest.fixture()
def state(tmp_path: Path) -> Path:
    """A 15-minute run (two jobs, 1 Hz samples) 29 days ago... seen from a 30-day window."""
    st = tmp_path / "state"
    ctld, node = open_ctld_db(st / "ctld.db"), open_node_db(st / "nodes" / "n1.db")
    for job, start, end in ((31, T0, T0 + 600), (32, T0 + 300, T0 + 900)):
        store_jobs.record_submission(ctld, store_jobs.JobSubmission(
            job_id=job, user_name="alice", shards_req=2, share_mode="shard", estimate_mib=2048,
            estimate_method="analytic", submit_ts=start - 1))
        store_jobs.record_ctld_end(ctld, store_jobs.JobEnd(job, end, "COMPLETED", 0, 0), node_list="n1",
                                   start_ts=start)
        store_jobs.record_node_start(node,
                                     store_jobs.JobStart(job, "n1", "alice", None, "0", 2, "gres:shard:2",
                                                               start))
        store_jobs.record_node_end(node, store_jobs.JobEnd(job, end, "COMPLETED", 0, 0, "n1"))
    rows = []
    for k in range(900):
        rows += samples.gpu_rows(T0 + k, [GpuReading(index=0, mem_used_mib=3000.0, smact_pct=40.0)], 1.0)
    samples.write_rows(node, rows, [], [GpuReading(index=0, mem_total_mib=81559.0)])
    (tmp_path / "coloc.yaml").write_text(f"state_dir: {st}\ngpu_mem_gib: 80\n")
    return tmp_path


def test_time_axis_fits_a_short_run_in_a_long_window(state: Path) -> None:
    cfg = config_mod.load(str(state / "coloc.yaml"), environ={})
    report = load_report(cfg)
    flt = views.Filters(since=T0 + 900 - 30 * DAY, until=T0 + DAY)
    jobs = views.select_jobs(report, cfg, flt, ROOT, now=T0 + DAY)
    w = plot.plot_window(report, jobs, flt, now=T0 + DAY)
    t0, t1, per_gpu, totals = w.t0, w.t1, w.per_gpu, w.totals
    assert T0 - 60 <= t0 <= T0 and T0 + 899 <= t1 <= T0 + 960  # the 15 minutes, padded, not 31 days
    assert len(per_gpu[("n1",
                        0)]) >= 450  # fetched again at <= 2-s resolution (the first fetch: 30-min buckets)
    fig = plot.timeline_figure("n1", 0, per_gpu[("n1", 0)], jobs, ROOT, t0, t1, totals[("n1", 0)])
    lo, hi = _xlim(fig.axes[-1])
    assert lo == pytest.approx(t0, abs=1) and hi == pytest.approx(t1, abs=1)
    # data fill the axis: the samples span at least 90 % of it
    assert (T0 + 899 - T0) / (hi - lo) > 0.9


def test_fit_window_keeps_the_window_without_data_and_stays_inside_it() -> None:
    assert plot.fit_window(T0, T0 + DAY, [], []) == (T0, T0 + DAY)
    assert plot.fit_window(T0, T0 + DAY, [T0 + 10], [(T0 - 500, T0 + 20)]) == (T0, T0 + 50)


def _label_boxes(fig):  # type: ignore[no-untyped-def]
    renderer = fig.canvas.get_renderer()
    return [t.get_window_extent(renderer) for t in fig.axes[-1].texts if t.get_text().strip()]


def test_job_labels_do_not_overlap() -> None:
    # 50 short jobs, 12 s apart: each label (~24 characters) is wider than six jobs' spacing, so labels placed
    # in six lanes round-robin (before) ran into each other.
    jobs = [_job(100 + i, T0 + 12 * i, T0 + 12 * i + 10, user=f"alice-in-wonderland{i % 3}")
            for i in range(50)]
    fig = plot.timeline_figure("n1", 0, [(T0, 1000.0, 10.0)], jobs, ROOT, T0, T0 + 610, 81559.0)
    boxes = _label_boxes(fig)
    assert boxes, "some jobs are labelled"
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b), (a, b)
    ax = fig.axes[-1]
    assert "labels left out" in ax.get_title()  # the rest are counted, not hidden silently
    bars = [p for c in ax.containers for p in c]
    assert len(bars) == 50


def test_long_jobs_keep_every_label_in_separate_lanes() -> None:
    jobs = [_job(200 + i, T0 + 60 * i, T0 + 3000, user="bob") for i in range(4)]
    fig = plot.timeline_figure("n1", 0, [], jobs, ROOT, T0, T0 + 3600, None)
    boxes = _label_boxes(fig)
    assert len(boxes) == 4 and not fig.axes[-1].get_title()
    ys = sorted(t.get_position()[1] for t in fig.axes[-1].texts if t.get_text().strip())
    assert ys == [0, 1, 2, 3]


def test_cluster_error_leaves_out_whole_gpu_jobs_and_oom_reruns() -> None:
    ok = _job(1, T0, T0 + 60, estimate_error_pct=10.0)
    whole = _job(2, T0, T0 + 60, share_mode="whole-gpu", estimate_error_pct=111.0)
    rerun = _job(3, T0, T0 + 60, share_mode="whole-gpu", estimate_method="oom-retry", retry_of=2,
                 estimate_error_pct=300.0)
    gpu = _job(4, T0, T0 + 60, share_mode="gpu", estimate_error_pct=-50.0)
    row = views.cluster_row([], [ok, whole, rerun, gpu])
    assert row["estimate_abs_error_pct_mean"] == 10.0  # was (10 + 111 + 300 + 50) / 4
    assert row["jobs"] == 4


def test_plot_command_writes_a_fitted_png(state: Path, tmp_path: Path) -> None:
    import subprocess

    from tests.slurm_cluster import VENV_BIN

    out = tmp_path / "plots"
    proc = subprocess.run([str(VENV_BIN / "coloc-report"), "plot", "--since", f"@{T0 + 900 - 30 * DAY}",
                           "--until", f"@{T0 + DAY}", "--out", str(out), "--config",
                           str(state / "coloc.yaml")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (out / "timeline-n1-gpu0.png").read_bytes()[:4] == b"\x89PNG"
