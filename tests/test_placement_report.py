"""coloc-report's collocation figures on real SQLite files: per job its rate vs alone (history of its
signature) and whether it shared its GPU; per GPU the time saturated under the placement gate."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from slurm_coloc.nvml.readings import GpuReading
from slurm_coloc.report.usage import alone_rates, shared_jobs
from slurm_coloc.store import jobs as store_jobs
from slurm_coloc.store import samples
from slurm_coloc.store.db import open_ctld_db, open_node_db
from tests.slurm_cluster import VENV_BIN

T0 = 1_700_000_000.0
SPEC = {"model": "resnet50", "batch_size": 32, "precision": "fp32", "input_shape": [3, 224, 224]}


def _job(ctld, node, job_id: int, gpu: int, start: float, end: float, coloc: dict, state: str = "COMPLETED"):
    store_jobs.record_submission(ctld, store_jobs.JobSubmission(
        job_id=job_id, user_name="alice", job_name=f"j{job_id}", shards_req=8, share_mode="shard",
        submit_ts=start - 1, coloc_json=json.dumps(coloc)))
    store_jobs.record_ctld_end(ctld, store_jobs.JobEnd(job_id, end, state, 0, 0), node_list="n1",
                               start_ts=start)
    store_jobs.record_node_start(node,
                                 store_jobs.JobStart(job_id, "n1", "alice", None, str(gpu), 8, "gres:shard:8",
                                                           start))
    store_jobs.record_node_end(node, store_jobs.JobEnd(job_id, end, state, 0, 0, "n1"))


@pytest.fixture()
def state(tmp_path: Path) -> Path:
    """Jobs 1, 2 alone (ResNet-50 spec, 100 s and 120 s); job 3 the same spec for 330 s, sharing GPU 1 with
    job 4 (another program). GPU 0: 300 s of samples, 100 s saturated (SMACT 85 %, SMOCC 50 %), 100 s at SMACT
    85 % with low occupancy and DRAM (not saturated), 100 s at SMACT 50 %."""
    st = tmp_path / "state"
    ctld, node = open_ctld_db(st / "ctld.db"), open_node_db(st / "nodes" / "n1.db")
    c = {"mode": "shard", "shards": 8, "spec": SPEC, "v": 1}
    _job(ctld, node, 1, 0, T0, T0 + 100, c)
    _job(ctld, node, 2, 0, T0 + 200, T0 + 320, c)
    _job(ctld, node, 3, 1, T0 + 1000, T0 + 1330, c)
    _job(ctld, node, 4, 1, T0 + 1100, T0 + 1200, {"mode": "shard", "shards": 8, "sha256": "ab" * 32, "v": 1})
    rows = []
    for k in range(300):
        smact, smocc, dram = (85.0, 50.0, 5.0) if k < 100 else (85.0, 10.0, 10.0) if k < 200 else (50.0, 60.0,
                                                                                                   60.0)
        rows += samples.gpu_rows(T0 + k,
                                 [GpuReading(index=0, util_pct=100.0, mem_used_mib=1000.0, smact_pct=smact,
                                                     smocc_pct=smocc, dram_bw_pct=dram)], 1.0)
    samples.write_rows(node, rows, [], [GpuReading(index=0, mem_total_mib=81559.0)])
    (tmp_path / "coloc.yaml").write_text(f"state_dir: {st}\ngpu_mem_gib: 80\n")
    return tmp_path


def _report(state: Path, *args: str) -> list:
    out = subprocess.run([str(VENV_BIN / "coloc-report"), *args, "--since", "2023-01-01", "--json",
                          "--config",
                          str(state / "coloc.yaml")], capture_output=True, text=True, env=dict(os.environ),
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)[args[0]]


def test_jobs_show_rate_vs_alone_from_history_and_shared_gpu(state: Path) -> None:
    rows = {r["job_id"]: r for r in _report(state, "jobs")}
    assert rows[3]["shared_gpu"] is True and rows[4]["shared_gpu"] is True
    assert rows[3]["alone_runtime_s"] == pytest.approx(110.0)  # median of jobs 1 and 2, alone
    assert rows[3]["rate_vs_alone"] == pytest.approx(110.0 / 330.0, abs=1e-3)
    assert rows[1]["shared_gpu"] is False and rows[1]["rate_vs_alone"] == pytest.approx(1.2)  # job 2's 120 s
    assert rows[4]["rate_vs_alone"] is None  # no alone run of its program


@pytest.mark.slow
def test_gpus_show_time_saturated_under_the_gate(state: Path) -> None:
    rows = {(r["node"], r["gpu"]): r for r in _report(state, "gpus")}
    assert rows[("n1", 0)]["saturated_pct"] == pytest.approx(33.3, abs=0.1)
    assert rows[("n1", 0)]["saturated_hours"] == pytest.approx(100 / 3600, abs=1e-3)
    text = subprocess.run([str(VENV_BIN / "coloc-report"), "gpus", "--since", "2023-01-01", "--config",
                           str(state / "coloc.yaml")], capture_output=True, text=True, timeout=60).stdout
    assert "saturated %" in text


def test_stricter_gate_in_the_config_counts_less_time_saturated(state: Path) -> None:
    with open(state / "coloc.yaml", "a") as fh:
        fh.write("placement_smact_gate: 0.9\n")
    assert _report(state, "gpus")[0]["saturated_pct"] == 0.0


def test_shared_jobs_touching_spans_do_not_overlap() -> None:
    class J:
        def __init__(self, job_id, start, end, gpus):
            self.job_id, self.start_ts, self.end_ts, self.gpu_list = job_id, start, end, gpus
            self.signature, self.state, self.runtime_s = "s", "COMPLETED", (end or 0) - start
    jobs = [J(1, 0, 10, [("n1", 0)]), J(2, 10, 20, [("n1", 0)]), J(3, 5, 6, [("n1", 1)]),
            J(4, 15, None, [("n1", 0)])]
    assert shared_jobs(jobs) == {1: False, 2: True, 3: False, 4: True}
    assert alone_rates(jobs[:2])[2]["rate_vs_alone"] == pytest.approx(1.0)


def test_a_shared_run_without_runs_alone_gets_its_time_alone_learned_from_the_co_run_mix(state: Path) -> None:
    """Job 4 (a program never run alone) shared GPU 1 with job 3 from T0+1100 to T0+1200: GPU 1 read SMACT 0.8
    while job 3 ran alone and 1.0 (saturated) while both ran. Its time alone is learned from that mix, as
    coloc-placer learns it (``coruns.learn``): start-up (10 s, no process samples) + 90 s at the model's rate
    capacity / (0.8 + its prior 0.5), capacity 1.03 (the packaged calibration, GPU model not recorded)."""
    node = open_node_db(state / "state" / "nodes" / "n1.db")
    rows = []
    for k in range(330):
        smact = 100.0 if 100 <= k < 200 else 80.0
        rows += samples.gpu_rows(T0 + 1000 + k, [GpuReading(index=1, util_pct=100.0, mem_used_mib=1000.0,
                                                            smact_pct=smact, smocc_pct=20.0,
                                                            dram_bw_pct=10.0)], 1.0)
    samples.write_rows(node, rows, [], [])
    node.conn.close()
    rows4 = {r["job_id"]: r for r in _report(state, "jobs")}
    assert rows4[3]["alone_source"] == "alone" and rows4[3]["alone_runtime_s"] == pytest.approx(110.0)
    assert rows4[4]["alone_source"] == "learned"
    assert rows4[4]["alone_runtime_s"] == pytest.approx(10 + 90 * 1.03 / 1.3, rel=0.05)
    assert rows4[4]["rate_vs_alone"] == pytest.approx(rows4[4]["alone_runtime_s"] / 100.0, abs=1e-3)
