"""The OOM rerun gate ("the lost rerun") on sampler records in the real SQLite stores: honest jobs
that outgrow their 2 GiB grant get their rerun whatever their allocation pattern, fake OOM lines do not, and
the per-user budget bounds every rerun. The sampler rows are SYNTHETIC (tests/oom_patterns.py says what they
model); the node and controller databases, the evidence queries and the gate are the product's own."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from slurm_coloc.config import Config
from slurm_coloc.hooks import oom
from slurm_coloc.slurm.jobinfo import job_info_from_json
from slurm_coloc.store import oom as store_oom
from slurm_coloc.store.db import open_ctld_db
from slurm_coloc.store.summaries import job_peak_mem_mib
from tests.oom_patterns import GRANT_SHARDS, PATTERNS, PERIOD_S, write_pattern

UID = 2001


def _gate(tmp_path: Path, name: str, job_id: int = 77, reruns_before: int = 0, **cfg_kw) -> oom.RerunDecision:
    cfg = Config(state_dir=str(tmp_path / "state"), gpu_mem_gib=80, **cfg_kw)
    proc, message, _ = PATTERNS[name]
    t0 = time.time() - 30
    write_pattern(cfg.node_db_path("n1"), job_id, proc, t0=t0)
    job = job_info_from_json({"job_id": job_id, "nodes": "n1", "tres_per_node": f"gres:shard:{GRANT_SHARDS}",
                              "start_time": int(t0 - 2),
                              "end_time": int(t0 + PERIOD_S * max(2, len(proc)) + 2),
                              "user_id": UID, "partition": "debug"})
    assert job.shards == GRANT_SHARDS and job.start_ts and job.end_ts
    db = open_ctld_db(cfg.ctld_db_path)
    for i in range(reruns_before):
        store_oom.claim_retry(db, store_oom.OomRecord(
            job_id=1000 + i, ts=time.time(), user_name="u", uid=UID, script_sha256="", share_mode="shard",
            shards=2,
            fence_mib=2048, end_ts=None, evidence={}, retry_of=None, retry_status="submitted",
            retry_reason="test"))
    messages = oom.find_oom_messages(message)
    assert messages, message
    peak = job_peak_mem_mib(cfg, job_id, "n1")
    assert (peak is None) == (not proc)
    return oom._gate(cfg, job, db, UID, messages, peak)


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_honest_patterns_get_their_rerun_and_fakes_do_not(tmp_path: Path, name: str) -> None:
    """Before the fix, ``one-alloc-first-step`` was refused ("the sampler watched its GPU and saw no memory of
    this job"): the lost rerun."""
    decision = _gate(tmp_path, name)
    assert decision.rerun == PATTERNS[name][2], (name, decision.reason)


def test_reasons_name_the_rule(tmp_path: Path) -> None:
    assert "before the sampler saw its memory" in _gate(tmp_path / "a", "one-alloc-first-step").reason
    assert "reached its grant" in _gate(tmp_path / "b", "gradual-growth").reason
    assert "larger than a whole GPU" in _gate(tmp_path / "c", "fake-huge").reason
    assert "saw no memory of this job" in _gate(tmp_path / "d", "fake-no-gpu").reason
    assert "saw at most 300 MiB" in _gate(tmp_path / "e", "fake-small").reason


@pytest.mark.parametrize("name", ["one-alloc-first-step", "eval-pass-peak"])
def test_the_budget_bounds_honest_reruns_too(tmp_path: Path, name: str) -> None:
    """Farming stays bounded: with ``oom_rerun_per_user_max`` reruns in the window, no pattern earns
    another."""
    decision = _gate(tmp_path, name, reruns_before=2, oom_rerun_per_user_max=2)
    assert not decision.rerun and "limit 2" in decision.reason


def test_gate_table_at_the_edges() -> None:
    """The pure rule at its boundaries (grant 2048 MiB, tolerance max(256, 10%) = 256 MiB, GPU 80 GiB)."""
    def gate(peak, tried, watched=True, stopped=False):
        return oom.rerun_gate(2048, peak, tried, watched, stopped, 0, 3, 3600.0, 10.0, 81920).rerun

    assert gate(None, 1792) and not gate(None, 1791)          # one failed allocation as large as the grant
    assert gate(1500, 292) and not gate(1500, 291)            # peak + asked reaches the grant
    assert not gate(None, 0) and gate(None, 0, watched=False)  # no sampler: no evidence against it
    assert gate(None, 81920) and not gate(None, 81921)        # a whole GPU can hold it, or it is refused
    assert not gate(2048, 4096, stopped=True)                  # the watchdog stopped it
