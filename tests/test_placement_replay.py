"""coloc-replay's policy switch: p95 and slowdown metrics, the aware submission
form (placement/heartbeat.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_coloc.comment import parse_comment
from slurm_coloc.errors import ColocError
from slurm_coloc.placement.heartbeat import placer_argv
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
    from slurm_coloc.placement.heartbeat import placer_policy, write_heartbeat

    cfg = Config(state_dir=str(tmp_path / "s"), run_dir=str(tmp_path / "r"))
    assert placer_policy(cfg) is None
    write_heartbeat(cfg, {"placed": 1, "policy": "throughput"})
    assert placer_policy(cfg) == "throughput"


def test_each_task_gets_its_own_script_and_signature(tmp_path: Path) -> None:
    import hashlib

    from slurm_coloc.comment import JobComment
    from slurm_coloc.replay.runner import task_script

    generic = tmp_path / "job_generic.sh"
    generic.write_text("#!/bin/bash\n#SBATCH --time=00:15:00\nexec python3 workloads.py \"$@\"\n")
    t = Task(index=3, rad="r", submit_s=0.0, workload="resnet18", batch=8, steps=5, mem_mib=900, ref_s=10.0,
             work_s=1.0, num_gpus=1)
    a = task_script(str(generic), t, str(tmp_path))
    assert task_script(str(generic), t, str(tmp_path)) == a  # the same task: the same file in every pass
    b = task_script(str(generic), Task(**{**t.__dict__, "steps": 6}), str(tmp_path))
    c = task_script(str(generic), Task(**{**t.__dict__, "workload": "resnet50"}), str(tmp_path))
    assert len({a, b, c}) == 3
    text = Path(a).read_text()
    assert text.startswith("#!/bin/bash\n# coloc-replay task: resnet18 --steps 5\n#SBATCH --time=00:15:00\n")
    assert Path(a).stat().st_mode & 0o777 == 0o755
    sigs = ({JobComment(sha256=hashlib.sha256(Path(p).read_bytes()).hexdigest()).signature()
             for p in (a, b, c)})
    assert len(sigs) == 3  # coloc-placer keeps each task's history apart


def test_replay_table_takes_times_alone_from_the_exclusive_pass() -> None:
    from benchmarks import placement_replay_table as table

    def run(task: int, s: float, e: float, gpu: str, retry_of: object = None,
            state: str = "COMPLETED") -> dict:
        return {"job_id": 10 * task + (1 if retry_of else 0), "task": task, "submit_ts": 100.0, "start_ts": s,
                "end_ts": e, "state": state, "retry_of": retry_of, "gpu": gpu}
    excl = {"tasks": 2, "completed": 2, "runs": [run(0, 100.0, 110.0, "n1:0"), run(1, 100.0, 120.0, "n1:1")],
            "smact_pct_per_gpu": {"n1:0": 30.0, "n1:1": 20.0}, "energy_j": 4000.0, "oom_retries": 0}
    thr = {"tasks": 2, "completed": 2, "energy_j": 3000.0, "oom_retries": 1,
           "smact_pct_per_gpu": {"n1:0": 60.0},
           "runs": [run(0, 101.0, 121.0, "n1:0"), run(1, 101.0, 105.0, "n1:0", state="OUT_OF_MEMORY"),
                    run(1, 106.0, 131.0, "n1:1", retry_of=11)]}
    res = table.combine([{"exclusive": excl}, {"throughput": thr}])
    assert res["alone_s"] == {0: 10.0, 1: 20.0}
    tp = res["rows"][1]
    # task 0: JCT 21 s, 10 alone
    assert tp["policy"] == "throughput" and tp["max_slowdown"] == pytest.approx(2.1)
    # task 0: ran 20 s; task 1: 101 -> 131 (its rerun) = 1.5
    assert tp["max_run_slowdown"] == pytest.approx(2.0)
    assert table.per_task(thr)[1]["end"] == 131.0 and table.per_task(thr)[1]["reruns"] == 1
    assert tp["where"] == {0: ["n1:0"], 1: ["n1:0", "n1:1"]}
    md = res["markdown"]
    assert "| throughput | 2 of 2 |" in md and "n1:0 60.0" in md and "| 3.0 (1.50) | 1 |" in md
    assert "throughput: where each task ran: n1:0: tasks [0]; n1:0,n1:1: tasks [1]" in md
