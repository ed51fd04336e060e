"""coloc-replay's policy switch: p95 and slowdown metrics, the aware submission form (placement/submit.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_coloc.comment import parse_comment
from slurm_coloc.errors import ColocError
from slurm_coloc.placement.submit import placer_argv
from slurm_coloc.replay import metrics as M
from slurm_coloc.replay.runner import sbatch_argv
from slurm_coloc.replay.trace import Task


def test_p95_nearest_rank() -> None:
    assert M.p95([]) is None
    assert M.p95([5.0]) == 5.0
    assert M.p95([float(x) for x in range(1, 101)]) == 95.0
    assert M.p95([1.0, 2.0, 3.0]) == 3.0


def test_p95_jct_and_slowdown_over_completed_tasks() -> None:
    runs = [M.RunRecord(1, 0, 100.0, 100.0, 110.0, "COMPLETED"),
            M.RunRecord(2, 1, 100.0, 120.0, 160.0, "COMPLETED"),
            M.RunRecord(3, 2, 100.0, 0.0, 0.0, "CANCELLED")]
    m = M.summarize("aware", 3, runs, None, None, {0: 10.0, 1: 20.0, 2: 5.0})
    assert m.p95_jct_s == 60.0 and m.p95_slowdown == pytest.approx(3.0)
    assert m.max_slowdown == pytest.approx(3.0) and m.max_run_slowdown == pytest.approx(2.0)  # (160-120) / 20
    assert M.summarize("blind", 3, runs, None, None).p95_slowdown is None
    ch = M.compare({"p95_slowdown": 4.0}, {"p95_slowdown": 3.0})
    assert ch["p95_slowdown_change_pct"] == pytest.approx(-25.0)


def test_replay_policies_share_the_coloc_plan() -> None:
    t = Task(index=3, rad="r", submit_s=0.0, workload="resnet18", batch=8, steps=5, mem_mib=900, ref_s=10.0,
             work_s=1.0, num_gpus=1)
    blind = sbatch_argv(t, "blind", "/j.sh", "/o")
    aware = sbatch_argv(t, "aware", "/j.sh", "/o")
    assert "--coloc-mem=1924M" in blind and "--coloc-mem=1924M" in aware
    for mode in ("gate", "throughput"):  # the four policies submit the same request; exclusive a whole GPU
        assert [a for a in sbatch_argv(t, mode, "/j.sh", "/o")
                if a.startswith("--coloc-mem")] == ["--coloc-mem=1924M"]
    assert "--exclusive-gpu" in sbatch_argv(t, "exclusive", "/j.sh", "/o")
    assert blind[-1] == "replay-blind-3" and aware[-1] == "replay-aware-3"
    with pytest.raises(ColocError):
        sbatch_argv(t, "smart", "/j.sh", "/o")


def test_placer_argv_holds_drops_shard_gres_and_flags_the_comment() -> None:
    comment = 'mine coloc:' + json.dumps({"mode": "shard", "shards": 4, "v": 1})
    argv = ["-t", "30", "--gres=shard:4", f"--comment={comment}", "job.sh", "--gres=x", "--comment=y"]
    out = placer_argv(argv)
    assert out is not None and out[0] == "--hold" and "--gres=shard:4" not in out
    assert out[-3:] == ["job.sh", "--gres=x", "--comment=y"]
    c = next(a for a in out if a.startswith("--comment=")).split("=", 1)[1]
    assert c.startswith("mine coloc:") and parse_comment(c) == {"mode": "shard", "shards": 4, "v": 1,
                                                                "place": True}
    whole = 'coloc:' + json.dumps({"mode": "whole-gpu", "shards": 80})
    assert placer_argv(["--gres=shard:80", f"--comment={whole}", "j"]) is None
    assert placer_argv(["--gres=gpu:2", "--exclusive", f"--comment={comment}", "j"]) is None
    assert placer_argv(["--gres=shard:4", "j"]) is None


def test_per_gpu_sm_activity_shows_an_idle_gpu() -> None:
    rows = [{"node": "n1", "gpu_index": 0, "smact_pct": 80.0},
            {"node": "n1", "gpu_index": 0, "smact_pct": 60.0},
            {"node": "n1", "gpu_index": 1, "smact_pct": 0.0},
            {"node": "n1", "gpu_index": 1, "smact_pct": None}]
    assert M.mean_smact_per_gpu(rows) == {"n1:0": 70.0, "n1:1": 0.0}


def test_placer_policy_is_read_from_the_heartbeat(tmp_path: Path) -> None:
    from slurm_coloc.config import Config
    from slurm_coloc.placement.daemon import placer_policy, write_heartbeat

    cfg = Config(state_dir=str(tmp_path / "s"), run_dir=str(tmp_path / "r"))
    assert placer_policy(cfg) is None
    write_heartbeat(cfg, {"placed": 1, "policy": "throughput"})
    assert placer_policy(cfg) == "throughput"
