"""coloc-replay's pure parts: trace -> tasks (mapping, scaling), metrics, sbatch arguments, CLI errors.

Data: tests/data/carma (a subset of the CARMA files, Apache-2.0).
"""
from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_coloc.errors import ColocError
from slurm_coloc.replay import metrics as M
from slurm_coloc.replay.metrics import parse_index_nodes
from slurm_coloc.replay.runner import sbatch_argv
from slurm_coloc.replay.trace import RATES_SAMPLES_PER_S, build_tasks, epochs_of, load_trace

DATA = Path(__file__).parent / "data" / "carma"
TRACE = DATA / "traces" / "philly_mix-first-12.csv"
CAT = DATA / "workload_catalog_from_rad.csv"
RUN = DATA / "exclusive_run_summary.csv"
REPLAY = [sys.executable, "-c", "import sys; from slurm_coloc.cli.replay import main; sys.exit(main())"]


def _summary_seconds(script: str, batch: int) -> float:
    with open(RUN, newline="") as fh:
        for row in csv.DictReader(fh):
            if row["Script"] == script and f"--batch_size_{batch}_" in row["Run folder"]:
                return float(row["Execution time(s)"])
    raise AssertionError(f"{script} {batch} not in the summary")


def test_epochs_from_rad_name() -> None:
    assert epochs_of("resnet18_cifar100_20e_3.rad") == 20
    assert epochs_of("mobilenet_cifar100_50e_1.rad") == 50
    assert epochs_of("efficientNet3.rad") == 1


def test_cifar_task_maps_to_torchvision_with_catalog_batch_memory_and_epochs() -> None:
    tasks = build_tasks(TRACE, CAT, RUN, time_scale=1.0, work_scale=1.0)
    t = next(t for t in tasks if t.rad == "resnet18_cifar100_20e_3.rad")
    assert t.workload == "tv:resnet18:3x32x32:128:100"
    assert t.batch == 128 and t.mem_mib == 858
    assert t.ref_s == pytest.approx(20 * _summary_seconds("resnet18_cifar100.py", 128))
    rate = RATES_SAMPLES_PER_S[("resnet18", "3x32x32")]
    assert t.steps == math.ceil(t.ref_s * rate / 128)


def test_language_model_gets_compute_stand_in_and_keeps_its_memory() -> None:
    t = build_tasks(TRACE, CAT, RUN, 1.0, 1.0)[0]
    assert t.rad == "gpt2_large_2.rad"
    assert t.workload.startswith("tv:resnet50:3x224x224:32:")
    assert t.mem_mib == 28356 and t.num_gpus == 2
    assert "stand-in" in t.note


def test_scales_apply_to_submit_offsets_and_work() -> None:
    full = build_tasks(TRACE, CAT, RUN, 1.0, 1.0)
    small = build_tasks(TRACE, CAT, RUN, 0.01, 0.001)
    assert [s.submit_s for s in small] == pytest.approx([f.submit_s * 0.01 for f in full])
    for f, s in zip(full, small):
        assert s.work_s == pytest.approx(f.ref_s * 0.001)
        assert s.steps <= f.steps and s.steps >= 20


def test_max_and_first_task_select_and_rebase() -> None:
    rows = load_trace(TRACE)
    tasks = build_tasks(TRACE, CAT, RUN, 1.0, 1.0, max_tasks=3, first_task=2)
    assert [t.index for t in tasks] == [r[0] for r in rows[2:5]]
    assert tasks[0].submit_s == 0.0 and tasks[1].submit_s == rows[3][1] - rows[2][1]


def test_bad_inputs_raise_one_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "t.csv"
    bad.write_text("task_index,submit_time_s,gap_from_previous_s,task_rad\n0,0,0,nosuch.rad\n")
    with pytest.raises(ColocError, match="not in the workload catalog"):
        build_tasks(bad, CAT, RUN, 1.0, 1.0)
    with pytest.raises(ColocError, match="scales must be > 0"):
        build_tasks(TRACE, CAT, RUN, 0.0, 1.0)
    nocol = tmp_path / "c.csv"
    nocol.write_text("rad_file,script\nx.rad,x.py\n")
    with pytest.raises(ColocError, match="missing column"):
        build_tasks(TRACE, nocol, RUN, 1.0, 1.0)


def test_sbatch_argv_per_mode() -> None:
    t = build_tasks(TRACE, CAT, RUN, 1.0, 0.001)[2]
    co = sbatch_argv(t, "coloc", "/j.sh", "/o/%j.out", context_mib=1024)
    assert f"--coloc-mem={t.mem_mib + 1024}M" in co and "--exclusive-gpu" not in co
    tail = [t.workload, "--steps", str(t.steps), "--tag", f"replay-coloc-{t.index}"]
    assert co[co.index("/j.sh") + 1:] == tail
    ex = sbatch_argv(t, "exclusive", "/j.sh", "/o/%j.out")
    assert "--exclusive-gpu" in ex and not any(a.startswith("--coloc-mem") for a in ex)
    with pytest.raises(ColocError):
        sbatch_argv(t, "shared", "/j.sh", "/o")
    with pytest.raises(ColocError):
        sbatch_argv(t, "coloc", "/j.sh", "/o", context_mib=-1)


def test_metrics_count_oom_rerun_as_one_task_and_lost_tasks() -> None:
    runs = [M.RunRecord(10, 0, 100.0, 101.0, 110.0, "FAILED"),
            M.RunRecord(12, 0, 111.0, 120.0, 150.0, "COMPLETED", retry_of=10),
            M.RunRecord(11, 1, 105.0, 106.0, 130.0, "COMPLETED"),
            M.RunRecord(13, 2, 106.0, 0.0, 0.0, "CANCELLED")]
    m = M.summarize("coloc", 3, runs, smact=40.0, energy_j=1000.0)
    assert (m.completed, m.lost, m.oom_retries) == (2, 1, 1)
    assert m.makespan_s == pytest.approx(150.0 - 100.0)
    assert m.mean_jct_s == pytest.approx(((150 - 100) + (130 - 105)) / 2)
    assert m.mean_wait_s == pytest.approx((1 + 1) / 2)


def test_energy_and_comparison() -> None:
    assert M.energy_growth_j({0: 10.0, 1: 5.0}, {0: 25.0, 1: 15.0}) == pytest.approx(25.0)
    assert M.energy_growth_j({0: 10.0}, {0: None}) is None
    assert M.energy_growth_j({}, {}) is None
    ch = M.compare({"makespan_s": 200.0, "energy_j": 100.0, "mean_smact_pct": None, "mean_jct_s": 50.0},
                   {"makespan_s": 120.0, "energy_j": 80.0, "mean_smact_pct": 30.0, "mean_jct_s": 60.0})
    assert ch["makespan_s_change_pct"] == pytest.approx(-40.0)
    assert ch["energy_j_change_pct"] == pytest.approx(-20.0)
    assert ch["mean_jct_s_change_pct"] == pytest.approx(20.0)
    assert ch["mean_smact_pct_change_pct"] is None
    assert M.retry_parent("oom-retry-of-42 coloc:{}") == 42 and M.retry_parent("coloc:{}") is None
    samples = [{"smact_pct": 10.0}, {"smact_pct": None}, {"smact_pct": 30.0}]
    assert M.mean_smact(samples) == pytest.approx(20.0)


def test_node_list_expansion() -> None:
    assert parse_index_nodes("n[1-2]") == ["n1", "n2"]
    assert parse_index_nodes("n1") == ["n1"]
    assert parse_index_nodes("n1,n3") == ["n1", "n3"]


def test_cli_plan_and_one_line_error(tmp_path: Path) -> None:
    args = ["plan", "--trace", str(TRACE), "--catalog", str(CAT), "--runtimes", str(RUN), "--max-tasks", "4"]
    ok = subprocess.run([*REPLAY, *args, "--json"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert [t["index"] for t in json.loads(ok.stdout)] == [0, 1, 2, 3]
    bad = subprocess.run([*REPLAY, "plan", "--trace", str(tmp_path / "none.csv"), "--catalog", str(CAT),
                          "--runtimes", str(RUN)], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().count("\n") == 0 and "coloc-replay: error: cannot read" in bad.stderr
