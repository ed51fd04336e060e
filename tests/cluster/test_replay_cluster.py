"""coloc-replay end to end on the real local Slurm cluster (tiny scale, CPU torch).

Both modes submit through coloc-sbatch; exclusive tasks get a whole GPU's shards, coloc tasks the catalog
peak + the context allowance; every task completes and the makespan comes from Slurm's own records.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from tests.slurm_cluster import REPO, Cluster

pytestmark = pytest.mark.slurm
DATA = REPO / "tests" / "data" / "carma"


def test_replay_both_modes_on_the_cluster(slurm_cluster: Cluster) -> None:
    c = slurm_cluster
    env = {"COLOC_BENCH_PY": sys.executable, "COLOC_BENCH_DIR": str(REPO / "benchmarks" / "device"),
           "OMP_NUM_THREADS": "1"}
    before = set(c.job_ids())
    out = c.run([str(Path(sys.executable).parent / "coloc-replay"), "run",
                 "--trace", str(DATA / "traces" / "tiny-2.csv"),
                 "--catalog", str(DATA / "workload_catalog_from_rad.csv"),
                 "--runtimes", str(DATA / "exclusive_run_summary.csv"),
                 "--time-scale", "0.1", "--work-scale", "1e-6",
                 "--job-script", str(REPO / "benchmarks" / "device" / "job_generic.sh"),
                 "--out-dir", str(c.jobs_dir),
                 "--deadline-s", "240", "--context-mib", "1024", "--json"], env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    for mode in ("exclusive", "coloc"):
        m = res[mode]
        assert (m["tasks"], m["completed"], m["lost"], m["oom_retries"]) == (2, 2, 0, 0), m
        assert m["problems"] == []
        assert m["makespan_s"] >= m["mean_jct_s"] > 0
    jobs = {j["job_id"]: j for j in c.squeue() if j["job_id"] not in before}
    assert len(jobs) == 4
    ex = [jobs[j] for j in res["exclusive"]["jobs"].values()]
    co = {int(t): jobs[j] for t, j in res["coloc"]["jobs"].items()}
    assert all(j["tres_per_node"] == "gres:shard:80" for j in ex)
    # catalog peaks: mnist_train 1776 MB, resnet18_cifar100 858 MB; + 1024 MiB context, rounded up to shards
    assert co[0]["tres_per_node"] == f"gres:shard:{math.ceil((1776 + 1024) / 1024)}"
    assert co[1]["tres_per_node"] == f"gres:shard:{math.ceil((858 + 1024) / 1024)}"
    # the second task was submitted 10 s x 0.1 after the first
    subs = sorted(j["submit_time"] for j in co.values())
    assert 0 <= subs[1] - subs[0] <= 3
    ends = [j["end_time"] for j in jobs.values() if j["job_id"] in res["coloc"]["jobs"].values()]
    assert res["coloc"]["makespan_s"] == pytest.approx(max(ends) - min(subs))
