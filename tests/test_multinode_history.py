"""A job on several nodes, recorded with Slurm's compact host list (``gpu[01-02]``): its measured peak reaches
the estimator's history and its AdminComment (real SQLite files written by the package's own writers)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_coloc import config as config_mod
from slurm_coloc.hooks import ctld as ctld_hooks
from slurm_coloc.hooks import figures
from slurm_coloc.store import jobs as store_jobs
from slurm_coloc.store import summaries
from slurm_coloc.store.db import open_ctld_db, open_node_db
from slurm_coloc.store.summaries import measured_peak_mib, script_history_mib

T0 = 1_700_000_000.0
SHA = "5" * 64


@pytest.fixture()
def cfg(tmp_path: Path):
    st = tmp_path / "state"
    ctld = open_ctld_db(st / "ctld.db")
    store_jobs.record_submission(ctld, store_jobs.JobSubmission(
        job_id=21, user_name="alice", uid=2001, job_name="ddp", shards_req=8, share_mode="shard",
        estimate_mib=6000,
        estimate_method="analytic", script_sha256=SHA, submit_ts=T0 - 1))
    store_jobs.record_ctld_end(ctld, store_jobs.JobEnd(21, T0 + 600, "COMPLETED", 0, 0),
                               node_list="gpu[01-02]",
                               start_ts=T0)
    for node, peak in (("gpu01", 1000.0), ("gpu02", 3000.0)):
        db = open_node_db(st / "nodes" / f"{node}.db")
        store_jobs.record_node_start(db,
                                     store_jobs.JobStart(21, node, "alice", None, "0", 8, "gres:shard:8", T0))
        store_jobs.record_node_end(db, store_jobs.JobEnd(21, T0 + 600, "COMPLETED", 0, 0, node))
        summaries.record_summary(db,
                                 summaries.JobSummary(21, node, "0", T0, T0 + 600, peak, 50.0, 60.0, 30.0,
                                                      40.0, 1000.0, 600.0, 600))
    (tmp_path / "coloc.yaml").write_text(f"state_dir: {st}\ngpu_mem_gib: 80\n")
    return config_mod.load(str(tmp_path / "coloc.yaml"), environ={})


def test_history_reads_every_node_of_a_bracketed_node_list(cfg) -> None:
    assert measured_peak_mib(cfg, 21, "gpu[01-02]") == 3000  # the peak is on the second node
    assert script_history_mib(cfg, SHA, uid=2001) == [3000]


def test_admin_comment_summarises_every_node_of_a_bracketed_node_list(cfg) -> None:
    # each node Epilog stores the figures (hooks/figures.py); the latest counts
    for node in ("gpu01", "gpu02"):
        assert "error" not in figures.record(cfg, open_node_db(cfg.node_db_path(node)), 21, node)
    d = json.loads(ctld_hooks.build(cfg, 21, wait_s=0))
    assert d["peak_mib"] == 3000 and d["measured"] is True
