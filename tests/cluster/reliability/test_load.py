"""Load, reduced for CI (the full counts run in benchmarks/load_submit.py and load_start.py; figures in
docs/reliability.md): parallel coloc-sbatch clients, and many jobs starting together on one node. Every
submission accepted, every job recorded exactly once, no hook row lost or failed (WAL, BEGIN IMMEDIATE, busy
timeouts)."""
from __future__ import annotations

import os
from typing import Iterator

import pytest

from benchmarks.load_start import start_burst
from benchmarks.load_submit import submit_burst
from tests.slurm_cluster import Cluster, start_cluster, stop_cluster

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def load_cluster() -> Iterator[Cluster]:
    if os.geteuid() != 0:
        pytest.skip("the local Slurm cluster needs root")
    c = start_cluster()
    try:
        yield c
    finally:
        stop_cluster(c)


def test_parallel_submissions_all_accepted_and_recorded_once(load_cluster: Cluster) -> None:
    r = submit_burst(load_cluster, n=24, clients=6)
    assert r["accepted"] == 24, r["errors"]
    assert r["completed"] == r["jobs_rows"] == r["prolog_once"] == r["epilog_once"] == 24, r
    assert r["epilog_slurmctld_done"] == 24 and r["spool_pending"] == 0, r
    assert r["hook_runs_one_line"] == r["hook_runs_expected"] == 4 * 24, r  # one done line per hook run


def test_jobs_starting_together_on_one_node_lose_no_row(load_cluster: Cluster) -> None:
    r = start_burst(load_cluster, n=16, node="n1")
    assert r["max_running"] >= 12, r  # they really overlapped
    assert r["completed"] == r["job_runs"] == r["prolog_once"] == r["epilog_once"] == r["jobs_rows"] == 16, r
    assert r["hook_rows_failed"] == 0, r["failed_rows"]
    assert r["spool_pending"] == 0, r
