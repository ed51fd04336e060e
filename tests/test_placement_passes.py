"""The placement benchmark's plan, metrics and combination of pass files
(``benchmarks/device/placement_plan.py``, ``placement_metrics.py``, ``placement_passes.py`` helpers,
``benchmarks/placement_combine.py``), on synthetic pass files. The Slurm path of the passes runs end to end on
the CPU cluster in ``tests/cluster/test_placement_bench_cluster.py``; the GPU run is the lead's device call
(docs/benchmarks.md)."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from benchmarks import placement_combine as pc
from benchmarks.device import placement_metrics as pm
from benchmarks.device import placement_plan as plan_mod

REPO = Path(__file__).resolve().parent.parent


def test_committed_plan_is_the_recorded_profile_sized_to_its_train_s() -> None:
    committed = json.loads(plan_mod.PLAN_PATH.read_text())
    profile = plan_mod.load_profile(plan_mod.PROFILE_PATH)
    again = plan_mod.make_plan(profile, committed["train_s"], committed["gap_s"], committed["source"])
    assert again == committed  # the plan file was made from the recorded profile, nothing edited by hand
    pile, stream = committed["scenarios"]["pile"], committed["scenarios"]["stream"]
    assert [j["workload"] for j in pile] == plan_mod.PILE14 and all(j["offset_s"] == 0 for j in pile)
    r50 = profile["pile:resnet50"]
    assert pile[0]["steps"] == round(committed["train_s"] / r50["step_s"])
    assert pile[0]["mem_mib"] == r50["peak_reserved_mib"] + plan_mod.CONTEXT_MIB
    assert sum(math.ceil(j["mem_mib"] / 1024) for j in pile) <= plan_mod.GPU_SHARDS  # all 14 fit at once
    assert [j["offset_s"] for j in stream] == [k * committed["gap_s"] for k in range(len(stream))]


def test_plan_refuses_a_pile_larger_than_the_gpu_and_bad_sizes() -> None:
    profile = {w: {"step_s": 0.05, "peak_reserved_mib": 6000} for w in plan_mod.PILE14}  # 14 x 7 shards = 98
    with pytest.raises(ValueError, match="shards"):
        plan_mod.make_plan(profile)
    with pytest.raises(ValueError, match="train_s"):
        plan_mod.make_plan({}, train_s=0)
    tiny = plan_mod.make_jobs([("unknown", 0.0)], {}, 0.01)
    assert tiny[0]["steps"] == 5 and tiny[0]["mem_mib"] == plan_mod.DEFAULT_PEAK_MIB + plan_mod.CONTEXT_MIB


def job(i: int, submit: float, start: Optional[float], end: Optional[float], state: str = "COMPLETED",
        ooms: int = 0) -> Dict[str, Any]:
    return {"index": i, "workload": f"w{i}", "submit_ts": submit, "start_ts": start, "end_ts": end,
            "state": state,
            "oom_reruns": ooms}


T0 = 1000.0  # Unix seconds (0 reads as unset)


def pass_file(scenario: str, policy: str, jobs: List[Dict[str, Any]], part: Optional[str] = None,
              **extra: Any) -> Dict[str, Any]:
    return {"scenario": scenario, "policy": policy, "part": part, "jobs": jobs,
            "smact_pct": extra.pop("smact", None),
            "energy_j": extra.pop("energy", None), "problems": [], **extra}


def test_pass_metrics_jct_slowdowns_and_losses() -> None:
    jobs = [job(0, T0, T0, T0 + 10), job(1, T0, T0 + 10, T0 + 40), job(2, T0, T0 + 5, T0 + 25, ooms=1),
            job(3, T0, None, None, state="CANCELLED")]
    m = pm.pass_metrics(jobs, {0: 10.0, 1: 10.0, 2: 5.0}, smact_pct=50.0, energy_j=1e4)
    assert m["completed"] == 3 and m["lost"] == 1 and m["ooms"] == 1
    assert m["makespan_s"] == 40 and m["mean_jct_s"] == pytest.approx(25.0) and m["p95_jct_s"] == 40
    assert m["max_slowdown"] == pytest.approx(5.0)  # job 2: JCT 25 / 5 alone
    # job 2 ran 20 s, 4x its 5 s alone; job 1 ran 30 s = 3x
    assert m["max_run_slowdown"] == pytest.approx(4.0)
    assert m["mean_wait_s"] == pytest.approx(5.0) and m["mean_smact_pct"] == 50.0
    assert pm.alone_times(jobs) == {0: 10.0, 1: 30.0}  # no OOM rerun, completed only


def test_stitch_joins_exclusive_parts_into_one_fifo_pass() -> None:
    p1 = pass_file("pile", "exclusive", [job(0, T0, T0 + 1, T0 + 11), job(1, T0, T0 + 11, T0 + 31)], "1/2",
                   smact=40.0, energy=100.0)
    p2 = pass_file("pile", "exclusive", [job(2, T0 + 500, T0 + 501, T0 + 506), job(3, T0 + 500, T0 + 506,
                                                                                   T0 + 526)], "2/2",
                   smact=10.0, energy=50.0)
    one = pm.stitch([p1, p2])
    ends = [j["end_ts"] - T0 for j in one["jobs"]]
    assert ends == [11, 31, 37, 57]  # part 2 begins where part 1 ended (31 s), keeping its own gaps
    assert all(j["submit_ts"] == T0 for j in one["jobs"]) and one["parts"] == ["1/2", "2/2"]
    assert one["energy_j"] == 150.0 and one["smact_pct"] == pytest.approx((40 * 31 + 10 * 26) / 57)
    assert pm.alone_times(one["jobs"]) == {0: 10.0, 1: 20.0, 2: 5.0, 3: 20.0}  # run times unchanged
    m = pm.pass_metrics(one["jobs"], pm.alone_times(one["jobs"]))
    assert m["makespan_s"] == 57 and m["mean_jct_s"] == pytest.approx((11 + 31 + 37 + 57) / 4)
    with pytest.raises(ValueError):
        pm.stitch([])
    assert pm.stitch([p1])["jobs"] == p1["jobs"]


def scenario_files() -> List[Dict[str, Any]]:
    """A 4-job pile: exclusive in two parts (10 s each alone), blind all at once (every job 38-40 s), aware
    two at a time (12-13 s each)."""
    ex1 = pass_file("pile", "exclusive", [job(0, T0, T0, T0 + 10), job(1, T0, T0 + 10, T0 + 20)], "1/2",
                    smact=30.0, energy=1000.0)
    ex2 = pass_file("pile", "exclusive", [job(2, T0 + 90, T0 + 90, T0 + 100), job(3, T0 + 90, T0 + 100,
                                                                                  T0 + 110)], "2/2",
                    smact=30.0, energy=1000.0)
    blind = pass_file("pile", "blind", [job(i, T0, T0, T0 + 38 + i % 3) for i in range(4)], smact=90.0)
    aware = pass_file("pile", "aware", [job(0, T0, T0, T0 + 12), job(1, T0, T0, T0 + 13),
                                        job(2, T0, T0 + 12, T0 + 25), job(3, T0, T0 + 13, T0 + 26)],
                                        smact=75.0,
                      placer={"placed_history": 4, "wait_notes": 2})
    return [ex1, ex2, blind, aware]


def test_combine_checks_the_issue_targets() -> None:
    out = pc.combine([*scenario_files(), {"scenario": "small7", "policy": "aware",
                                          "aggregate_samples_per_s": 0.96 * pm.RUN1_SMALL_CNN_AGG7}])
    r = out["scenarios"]["pile"]
    ex, bl, aw = (r["metrics"][p] for p in ("exclusive", "blind", "aware"))
    assert ex["makespan_s"] == 40 and ex["mean_jct_s"] == pytest.approx(25.0)  # stitched FIFO: 10, 20, 30, 40
    assert aw["max_run_slowdown"] == pytest.approx(1.3) and bl["max_run_slowdown"] == pytest.approx(4.0)
    assert all(r["targets"].values())  # aware: JCT 19 <= 20 (0.8 x 25) and <= blind 39; makespan 26 <= 30
    assert out["small7"]["kept_ge_95pct"] is True and out["small7"]["gain"] == pytest.approx(0.96 * 7.0,
                                                                                             abs=0.01)
    text = pc.render(out)
    assert "| gate (aware) |" in text and "NOT met" not in text and "placed_history" in text

    slow = scenario_files()
    slow[3]["jobs"][3]["end_ts"] = T0 + 60  # a job that ran 47 s, 4.7x its 10 s alone; mean JCT now 27.5
    r = pc.combine(slow)["scenarios"]["pile"]["targets"]
    same = pc.combine([{"scenario": "small7", "policy": "blind", "aggregate_samples_per_s": 200_000.0},
                       {"scenario": "small7", "policy": "aware",
                        "aggregate_samples_per_s": 180_000.0}])["small7"]
    assert same["kept_vs_blind"] == pytest.approx(0.9) and same["kept_vs_blind_ge_95pct"] is False
    assert "0.90 of it: NOT met" in pc.render({"scenarios": {}, "small7": same})
    assert r["aware: no job ran > 3x alone"] is False and r["aware mean JCT <= 0.8x exclusive"] is False
    assert r["aware mean JCT <= blind"] is True
    lost = scenario_files()[:3]
    # no aware pass
    assert pc.combine(lost)["scenarios"]["pile"]["targets"]["aware mean JCT <= blind"] is None


def test_combine_notes_missing_parts_and_refuses_duplicates(tmp_path: Path) -> None:
    files = scenario_files()
    r = pc.combine([files[0], files[2], files[3]])["scenarios"]["pile"]
    assert any("not a full set" in n for n in r["notes"])
    with pytest.raises(ValueError, match="twice"):
        pc.combine([files[2], files[2]])
    with pytest.raises(ValueError, match="not a placement pass file"):
        pc.combine([{"scenarios": {}}])
    paths = []
    for k, f in enumerate(files):
        paths.append(tmp_path / f"f{k}.json")
        paths[-1].write_text(json.dumps(f))
    out = tmp_path / "combined.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.placement_combine",
                           *map(str, paths),
                           "--json", str(out)], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert "| pile |" in proc.stdout and json.loads(out.read_text())["scenarios"]["pile"]["targets"]
    (tmp_path / "bad.json").write_text("{")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.placement_combine",
                           str(tmp_path / "bad.json")], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 1 and proc.stderr.startswith("placement_combine: error:")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_small7_check_against_run_1() -> None:
    assert pm.small7_check(None)["kept"] is None
    c = pm.small7_check(0.9 * pm.RUN1_SMALL_CNN_AGG7)
    assert c["kept_ge_95pct"] is False and c["kept"] == pytest.approx(0.9)


def test_parts_history_and_job_scripts_of_the_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks.device import placement_passes as pp
    from slurm_coloc.comment import job_signature

    jobs = [{"index": i} for i in range(14)]
    assert [len(pp.part_slice(jobs, f"{k}/3")) for k in (1, 2, 3)] == [5, 4, 5]
    assert pp.part_slice(jobs, "2/2")[0]["index"] == 7 and pp.part_slice(jobs, "1/1") == jobs
    for bad in ("0/2", "3/2", "1-2", ""):
        with pytest.raises(ValueError, match="--part"):
            pp.part_slice(jobs, bad)
    files = [pass_file("pile", "exclusive", [
        {**job(0, T0, T0, T0 + 10), "signature": "s1",
         "alone_activity": {"smact": 0.4, "smocc": 0.2, "drama": 0.1}},
        {**job(1, T0, T0 + 10, T0 + 30), "signature": "s1",
         "alone_activity": {"smact": 0.6, "smocc": 0.2, "drama": 0.3}},
        {**job(2, T0, T0 + 30, T0 + 40), "signature": "s2", "alone_activity": None},
        {**job(3, T0, T0 + 40, T0 + 50), "signature": None,
         "alone_activity": {"smact": 0.9, "smocc": 0.9, "drama": 0.9}}], "1/1")]
    hist = pp.history_from_alone(files)
    # runs 10 s and 20 s (no bench record: start-up unknown)
    assert set(hist) == {"s1"} and hist["s1"] == pytest.approx({"smact": 0.5, "smocc": 0.2, "drama": 0.2,
                                                                "run_s": 15.0})
    assert pp.alone_from_files(files, "pile") == {0: 10.0, 1: 20.0, 2: 10.0, 3: 10.0}
    assert pp.alone_from_files(files, "stream") == {}
    monkeypatch.setattr(pp, "JOBS", tmp_path)
    plan = json.loads(plan_mod.PLAN_PATH.read_text())["scenarios"]["pile"][1]
    blind = pp.sbatch_args(plan, "blind", "pile", fake=False)
    excl = pp.sbatch_args(plan, "exclusive", "pile", fake=False)
    assert f"--coloc-mem={plan['mem_mib']}M" in blind and "--exclusive-gpu" in excl
    assert blind[blind.index("--steps") + 1] == str(plan["steps"]) and "--cudnn-benchmark" in blind
    script = Path(blind[blind.index("--steps") - 1])
    assert script == Path(excl[excl.index("--steps") - 1])  # one script per workload, whatever the policy
    text = script.read_text()
    # no per-call path in the text
    assert "/workloads.py\" pile:resnet101 \"$@\"" in text and str(tmp_path) not in text
    import hashlib
    sig = job_signature({"sha256": hashlib.sha256(text.encode()).hexdigest()})
    assert sig and sig == job_signature({"sha256": hashlib.sha256(script.read_bytes()).hexdigest()})


def test_exclusive_fifo_on_two_gpus_from_the_runs_alone_and_throughput_targets() -> None:
    ex = [job(i, T0, T0 + 11 * i, T0 + 11 * i + 10) for i in range(4)]  # 10 s alone each, 1 s apart
    assert pm.fifo_gap_s(ex) == pytest.approx(1.0)
    two = pm.fifo_from_alone(ex, 2, 1.0)
    assert [(j["start_ts"], j["end_ts"], j["gpu"]) for j in two] == [
        (pytest.approx(0, abs=1e-6), 10, "fifo:0"), (pytest.approx(0, abs=1e-6), 10, "fifo:1"),
        (11, 21, "fifo:0"), (11, 21, "fifo:1")]
    m_ex = pm.pass_metrics(two, pm.alone_times(ex))
    assert m_ex["makespan_s"] == pytest.approx(21) and m_ex["mean_jct_s"] == pytest.approx(15.5)
    blind = {"makespan_s": 40.0, "energy_j": 4000.0, "completed": 4, "lost": 0, "ooms": 0}
    tp = {"makespan_s": 24.0, "mean_jct_s": 7.7, "max_run_slowdown": 2.2, "energy_j": 3900.0, "completed": 4,
          "lost": 0, "ooms": 0}
    got = pm.targets_throughput({"exclusive": m_ex, "blind": blind, "throughput": tp}, 2.0)
    assert all(got.values()), got  # 24 <= 0.6 x 40; 7.7 <= 0.5 x 15.5; 2.2 <= 2.2; 975 <= 1000 J per job
    worse = pm.targets_throughput({"exclusive": m_ex, "blind": blind,
                                   "throughput": {**tp, "makespan_s": 25.0, "max_run_slowdown": 2.3,
                                                  "energy_j": 4100.0}}, 2.0)
    assert [k for k, v in worse.items() if v is False] == [
        "throughput makespan <= 0.6x blind", "throughput: no job ran > 2x + 10% alone",
        "throughput energy per job <= blind"]


def test_an_exclusive_pass_gets_twice_the_share_of_the_budget() -> None:
    from benchmarks.device import placement_passes as pp

    assert pp.pass_weight("pile-exclusive") == 2.0 and pp.pass_weight("pile-throughput") == 1.0


def test_split_plan_steers_each_job_to_the_gpu_named_for_its_index_with_its_placer_shards() -> None:
    from benchmarks.device.placement_split import split_plan

    job_of = {2: 12, 0: 10, 1: 11}  # job index -> Slurm job id
    plan = split_plan(job_of, {0: 1, 1: 0, 2: 1}, {10: 4, 11: 6, 12: 3}, {11: "coloc:{}"})
    assert plan == [(10, 1, 4, ""), (11, 0, 6, "coloc:{}"), (12, 1, 3, "")]
    with pytest.raises(KeyError):  # a job without a GPU
        split_plan(job_of, {0: 1, 1: 0}, {10: 4, 11: 6, 12: 3}, {})
    with pytest.raises(ValueError, match="job 11 \\(index 1\\) not found held"):  # not in the placer's form
        split_plan(job_of, {0: 1, 1: 0, 2: 1}, {10: 4, 12: 3}, {})


def test_history_file_keeps_runs_of_a_known_gpu_model_under_gpu_models(tmp_path: Path) -> None:
    from benchmarks.device import placement_passes as pp
    from slurm_coloc.placement.history import read_history_file

    h100, h200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
    act = {"smact": 0.4, "smocc": 0.2, "drama": 0.1}
    old = pass_file("mix", "exclusive", [{**job(0, T0, T0, T0 + 30), "signature": "s1",
                                          "alone_activity": act}])
    new = pass_file("mix", "exclusive", [{**job(0, T0, T0, T0 + 20), "signature": "s1",
                                          "alone_activity": {**act, "gpu_model": h200}}])
    assert pp.history_file([old]) == {"signatures": {"s1": pytest.approx({**act, "run_s": 30.0})}}
    both = pp.history_file([old, new])
    assert both["signatures"]["s1"]["run_s"] == 30.0 and both["gpu_models"][h200]["s1"]["run_s"] == 20.0
    labelled = pp.history_file([old, new], [h100])
    assert labelled["signatures"] == {} and set(labelled["gpu_models"]) == {h100, h200}
    path = tmp_path / "h.json"
    path.write_text(json.dumps(labelled))
    models: dict = {}
    timing: dict = {}
    assert read_history_file(str(path), timing, models)["s1"].smact == pytest.approx(0.4)
    assert sorted(timing["s1"]) == [(20.0, None), (30.0, None)]
    assert models[h200]["s1"][1] == (20.0, None)


@pytest.mark.parametrize("args,needle", [
    (["pile-split", "--split-gpus", "1,x"], "--split-gpus '1,x': comma-separated GPU indexes"),
    (["pile-split", "--split-gpus", "1,-1"], "--split-gpus: GPU indexes are >= 0"),
    (["pile-split", "--split-gpus", "1,0"], "--split-gpus gives no GPU for job(s) [2, 3,"),
    (["pile-throughput", "--alone-gpu-models", "NVIDIA H200"], "--alone-gpu-models: at most one GPU model"),
])
def test_bad_split_or_model_options_are_one_error_and_write_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        args: List[str], needle: str) -> None:
    from benchmarks.device import placement_passes as pp

    monkeypatch.setattr(pp, "ROOT", tmp_path / "root")  # where configure() would write the history and config
    with pytest.raises(SystemExit) as exc:
        pp.main([*args, "--out", str(tmp_path / "out"), "--started-at", "0"])
    assert exc.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and needle in errors[0], errors
    assert not (tmp_path / "root").exists() and not (tmp_path / "out").exists()
