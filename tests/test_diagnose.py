"""Per-job findings (report/diagnose.py): the rules on figures measured on the H100, thin evidence, the
summary's new figures, and the whole path through real SQLite files (coloc-report jobs/advise, the reader's
advise op, AdminComment)."""
from __future__ import annotations

import json
import os
import pwd
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from slurm_coloc import config as config_mod
from slurm_coloc.hooks import ctld as ctld_hooks
from slurm_coloc.hooks import figures
from slurm_coloc.node.cpu import JobCpu
from slurm_coloc.node.lifecycle import summarize
from slurm_coloc.nvml.readings import GpuReading, ProcReading
from slurm_coloc.report import diagnose, query
from slurm_coloc.report.summarize import JobView
from slurm_coloc.store import jobs as store_jobs
from slurm_coloc.store import samples, summaries
from slurm_coloc.store.db import open_ctld_db, open_node_db
from tests.slurm_cluster import VENV_BIN

CFG = config_mod.load("/dev/null", environ={})
T0 = 1_700_000_000.0


def view(**kw: Any) -> JobView:
    base: Dict[str, Any] = dict(job_id=1, user="alice", name="j", nodes="n1", gpus="n1:0", shards=4,
                                share_mode="shard", estimate_mib=4096, estimate_method="analytic",
                                state="COMPLETED",
                                exit_code=0, signal=0, start_ts=T0, end_ts=T0 + 60, requested_mib=4096.0,
                                peak_mem_mib=2600.0, active_samples=80, smact_idle_pct=3.0, batch_size=32,
                                precision="fp32")
    base.update(kw)
    return JobView(**base)


# Figures of each job alone on the H100 (GPM at 0.5 s, benchmarks/device/diagnose_bench.py calibrate,
# 2026-11-24): name -> (SM activity, SM occupancy, tensor, DRAM, idle share of active samples %, batch)
H100 = {
    "input_bound": (0.1, 0.0, 0.0, 0.0, 95.0, 32),
    "fp32_matmul": (90.1, 13.3, 0.0, 8.6, 4.0, 1024),
    "tiny_batch": (12.2, 3.8, 0.7, 2.8, 4.0, 2),
    "resnet18_32": (8.4, 2.9, 0.3, 1.8, 5.0, 32),
    "resnet50_224": (61.9, 28.9, 7.7, 36.1, 5.0, 32),
}
PLANTED = {"input_bound": "input-bound", "fp32_matmul": "no-tensor-cores", "tiny_batch": "low-occupancy",
           "resnet18_32": None, "resnet50_224": None}
# The CPU side each job is built with (benchmarks/device/diag_jobs.py), NOT measured on the H100 yet (the
# sampler records it from this version on; docs/report.md marks the rows pending): (training process cores,
# loader workers, their cores, CPUs). The input-bound job's loader (one worker blurring images, the training
# process waiting) was measured on this machine's CPU by tests/test_cpu_use.py; the others run their loop in
# the training process, which launches kernels (about one core busy) and has no worker.
CPU = {"input_bound": (0.15, 1.0, 0.98, 4), "fp32_matmul": (1.0, 0.0, 0.0, 4),
       "tiny_batch": (1.0, 0.0, 0.0, 4),
       "resnet18_32": (1.0, 0.0, 0.0, 4), "resnet50_224": (1.0, 0.0, 0.0, 4)}


def cpu(train: float, workers: float, workers_cores: float, cpus: int | None = 4, n: int = 80) -> Dict[str,
                                                                                                       Any]:
    return dict(train_cpu_cores=train, cpu_workers=workers, workers_cpu_cores=workers_cores, cpus=cpus,
                cpu_samples=n)


def measured(name: str, **kw: Any) -> JobView:
    sm, occ, tc, dram, idle, batch = H100[name]
    figures: Dict[str, Any] = dict(smact_mean=sm, smocc_mean=occ, tensor_mean=tc, dram_mean=dram,
                                   smact_idle_pct=idle, batch_size=batch, **cpu(*CPU[name]))
    return view(**{**figures, **kw})


# What the Slurm check on the H100 recorded per job (coloc-report advise --json of each, 2026-11-24): the GPU
# side of the summaries, before the CPU was recorded. The tiny batch there idled 54 % of its samples (16 s of
# start-up with its context on the GPU) and was read as input-bound.
RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "device" / "results"
SLURM_RUN = {r["name"]: r["advice"]["job"] for r in json.loads(
    (RESULTS / "h100-advise-before-cpu-use" / "diagnose.json").read_text())}
GPU_KEYS = ("smact_mean", "smact_p95", "smocc_mean", "smocc_p95", "tensor_mean", "dram_mean",
            "smact_idle_pct",
            "active_samples", "batch_size", "precision", "requested_mib", "peak_mem_mib", "start_ts",
            "end_ts")


def slurm_run(name: str, **kw: Any) -> JobView:
    return view(**{**{k: SLURM_RUN[name][k] for k in GPU_KEYS}, **kw})


# The second Slurm check on the H100 (2026-11-24, Slurm 26.05, CPU use recorded by the sampler): the healthy
# ResNet-18/32 idled 34 % of its samples with its training process at 0.96 cores and no loader worker, and was
# read as "loads the data itself" (benchmarks/device/results/h100-advise-launch-bound-miss/diagnose.json).
CPU_KEYS = ("train_cpu_cores", "workers_cpu_cores", "cpu_workers", "job_cpu_cores", "cpus", "cpu_samples")
SLURM_RUN2 = {r["name"]: r["advice"]["job"] for r in json.loads(
    (RESULTS / "h100-advise-launch-bound-miss" / "diagnose.json").read_text())}


def test_a_launch_bound_loop_without_workers_is_not_input_bound() -> None:
    """The miss of the second H100 check: no worker and one busy core, but the GPU idled in 34 % of the
    samples (the starved loader: 95 %): below ``diag_input_bound_self_idle_pct`` the rule does not call it
    loading."""
    for name in ("resnet18_32", "resnet50_224"):
        job = view(**{k: SLURM_RUN2[name][k] for k in GPU_KEYS + CPU_KEYS})
        d = diagnose.diagnose(job, CFG)
        assert not d.findings, (name, d.findings)
    r18 = view(**{k: SLURM_RUN2["resnet18_32"][k] for k in GPU_KEYS + CPU_KEYS})
    assert any(n.startswith("not input-bound: SM activity 3.6% mean")
               for n in diagnose.diagnose(r18, CFG).notes)
    # the same CPU figures with a GPU idle most of the time do read as loading in the training process
    starved = diagnose.diagnose(view(**{**{k: SLURM_RUN2["resnet18_32"][k] for k in GPU_KEYS + CPU_KEYS},
                                        "smact_idle_pct": 80.0}), CFG)
    assert [f.name for f in starved.findings] == ["input-bound"]
    assert "loads the data itself" in starved.findings[0].evidence
    lower = config_mod.load("/dev/null", environ={"COLOC_DIAG_INPUT_BOUND_SELF_IDLE_PCT": "30"})
    assert [f.name for f in diagnose.diagnose(r18, lower).findings] == ["input-bound"]


@pytest.mark.parametrize("name", sorted(H100))
def test_each_planted_problem_is_the_top_finding_and_healthy_jobs_have_none(name: str) -> None:
    d = diagnose.diagnose(measured(name), CFG)
    names = [f.name for f in d.findings]
    assert names == ([PLANTED[name]] if PLANTED[name] else [])
    for f in d.findings:
        assert f.evidence and f.suggestion and " " not in f.name and any(c.isdigit() for c in f.evidence)
    assert diagnose.NOT_JUDGED in d.notes


def test_the_slurm_runs_tiny_batch_is_low_occupancy_once_its_cpu_use_is_known() -> None:
    """The one miss of the H100 check: with the CPU side (training process busy, no worker) the GPU's idle
    samples no longer read as a starved loader; the input-bound job with its saturated worker stays
    input-bound."""
    tiny = slurm_run("tiny_batch", **cpu(*CPU["tiny_batch"]))
    d = diagnose.diagnose(tiny, CFG)
    assert [f.name for f in d.findings] == ["low-occupancy"]
    assert "training process 1.0 cores, no loader worker" in d.findings[0].evidence
    assert any(n.startswith("not input-bound: SM activity 4.5% mean") and "no loader starved it" in n
               for n in d.notes)
    inp = diagnose.diagnose(slurm_run("input_bound", **cpu(*CPU["input_bound"])), CFG)
    assert [f.name for f in inp.findings] == ["input-bound"]
    assert ("1 loader worker at 1.0 cores" in inp.findings[0].evidence
            and "saturated" in inp.findings[0].evidence)
    for name in ("resnet18_32", "resnet50_224"):
        assert not diagnose.diagnose(slurm_run(name, **cpu(*CPU[name])), CFG).findings


def test_without_cpu_figures_input_bound_is_not_judged() -> None:
    d = diagnose.diagnose(slurm_run("input_bound"), CFG)
    assert not d.findings
    assert any(n.startswith("input-bound not judged (thin evidence)") and "not recorded" in n
               for n in d.notes)
    few = diagnose.diagnose(slurm_run("input_bound", **cpu(*CPU["input_bound"], n=5)), CFG)
    assert not few.findings and any("recorded in 5 samples only" in n for n in few.notes)
    # rules that need no CPU figures still judge: the tiny batch's spec says batch 2
    assert [f.name for f in diagnose.diagnose(slurm_run("tiny_batch"), CFG).findings] == ["low-occupancy"]


@pytest.mark.parametrize("figures, batch, why", [
    (cpu(0.2, 2.0, 1.9), 32, "the loader workers were saturated"),
    (cpu(0.6, 2.0, 1.0, cpus=2), 32, "the job's CPUs were saturated"),  # suggestion: more CPUs
    (cpu(0.1, 4.0, 0.4), 32, "waited for its loader workers"),
    (cpu(1.0, 0.0, 0.0), 64, "loads the data itself"),  # the GPU idle in 95 % of the samples
    (cpu(1.0, 0.0, 0.0, cpus=4) | {"smact_idle_pct": 34.0}, 64, None),  # launch-bound: GPU idle less often
    (cpu(1.0, 0.0, 0.0), 2, None),  # launch-bound small batch: not a starved loader
    (cpu(1.0, 0.0, 0.0), None, None),  # no batch recorded: cannot tell loading in-process from launching
    (cpu(0.6, 4.0, 1.0, cpus=None), 32, None),  # workers half idle, training process neither waiting nor busy
    (cpu(1.0, None, None), 64, None),  # descendants not readable (no /proc children files)
])
def test_the_cpu_evidence_of_input_bound(figures: Dict[str, Any], batch: Optional[int],
                                         why: Optional[str]) -> None:
    d = diagnose.diagnose(measured("input_bound", batch_size=batch, **figures), CFG)
    if why is None:
        assert "input-bound" not in [f.name for f in d.findings]
        assert any(n.startswith("not input-bound") for n in d.notes)
    else:
        assert [f.name for f in d.findings][:1] == ["input-bound"] and why in d.findings[0].evidence
        taken = ("its 2 CPUs are taken: ask for more with `#SBATCH --cpus-per-task`"
                 in d.findings[0].suggestion)
        assert taken == (figures["cpus"] == 2)


def test_over_request_four_times_the_need() -> None:
    d = diagnose.diagnose(measured("resnet18_32", requested_mib=10240.0, peak_mem_mib=1495.0, shards=10), CFG)
    assert [f.name for f in d.findings] == ["over-request"]
    assert "mem=2G" in d.findings[0].suggestion and "85% never used" in d.findings[0].evidence
    # a request within 2x of peak + headroom is not an over-request (shards round up to whole GiB)
    assert not diagnose.diagnose(measured("resnet18_32", requested_mib=3072.0, peak_mem_mib=1495.0),
                                 CFG).findings


def test_oom_reruns_and_oom_deaths_are_not_over_requests() -> None:
    rerun = measured("resnet18_32", requested_mib=81920.0, peak_mem_mib=1495.0, retry_of=7,
                     share_mode="whole-gpu")
    died = measured("resnet18_32", requested_mib=10240.0, peak_mem_mib=1495.0, oom=True)
    assert not diagnose.diagnose(rerun, CFG).findings and not diagnose.diagnose(died, CFG).findings


def test_thin_evidence_gives_no_gpu_finding() -> None:
    short = diagnose.diagnose(measured("input_bound", end_ts=T0 + 10), CFG)
    assert not short.findings and any("ran 10 s" in n for n in short.notes)
    few = diagnose.diagnose(measured("fp32_matmul", active_samples=5), CFG)
    assert not few.findings and any("5 samples" in n for n in few.notes)
    no_gpm = diagnose.diagnose(view(smact_mean=None, smocc_mean=None), CFG)
    assert not no_gpm.findings and any("GPM" in n for n in no_gpm.notes)
    # the memory finding needs no GPU metrics
    assert [f.name
            for f in diagnose.diagnose(view(smact_mean=None, requested_mib=20480.0), CFG).findings] == [
        "over-request"]


def test_precision_and_batch_from_the_spec_decide() -> None:
    assert not diagnose.diagnose(measured("fp32_matmul", precision="bf16"), CFG).findings
    assert not diagnose.diagnose(measured("tiny_batch", batch_size=64), CFG).findings
    no_spec = diagnose.diagnose(measured("tiny_batch", batch_size=None, precision=None), CFG)
    assert not no_spec.findings and any("no recorded spec" in n for n in no_spec.notes)


def test_thresholds_come_from_the_config() -> None:
    strict = config_mod.load("/dev/null", environ={"COLOC_DIAG_SMALL_BATCH": "64"})
    assert [f.name for f in diagnose.diagnose(measured("resnet18_32"), strict).findings] == ["low-occupancy"]
    with pytest.raises(config_mod.ConfigError):
        config_mod.load("/dev/null", environ={"COLOC_DIAG_INPUT_BOUND_IDLE_PCT": "120"})
    # 0.98 cores < 99.5 % of one: not saturated, but the training process (0.15 cores) waits for it
    busy = config_mod.load("/dev/null", environ={"COLOC_DIAG_LOADER_BUSY_PCT": "99.5"})
    (f,) = diagnose.diagnose(measured("input_bound"), busy).findings
    assert f.name == "input-bound" and "waited for its loader workers" in f.evidence
    neither = config_mod.load("/dev/null", environ={"COLOC_DIAG_LOADER_BUSY_PCT": "99.5",
                                                    "COLOC_DIAG_TRAIN_WAITING_CORES": "0.1"})
    assert not diagnose.diagnose(measured("input_bound"), neither).findings
    with pytest.raises(config_mod.ConfigError):
        config_mod.load("/dev/null",
                        environ={"COLOC_DIAG_TRAIN_WAITING_CORES": "0.9"})  # not below busy (0.8)


def _series(n: int, burst_every: int, job_present: bool = True) -> List[Dict[str, Any]]:
    return [{"ts": T0 + k, "node": "n1", "gpu": 0, "smact_pct": 40.0 if k % burst_every == 0 else 0.0,
             "smocc_pct": 5.0, "tensor_pct": 0.0, "dram_bw_pct": 1.0, "job_mem_mib": 2000.0 if job_present
             else None}
            for k in range(n)]


def test_stats_from_series_and_summary_agree() -> None:
    series = _series(100, 10)
    st = diagnose.stats_from_series(series, 1.0)
    assert st.smact_idle_pct == pytest.approx(90.0) and st.smact_mean == pytest.approx(4.0)
    assert st.active_samples == 100
    gpu_rows = [{"ts": s["ts"], "gpu_index": 0, "smact_pct": s["smact_pct"], "smocc_pct": 5.0,
                 "tensor_pct": 0.0,
                 "dram_bw_pct": 1.0, "energy_j": None, "power_w": None} for s in series]
    # the job's process appears only from the 21st sample: the start-up before it is not counted as idle
    procs = [{"ts": s["ts"], "gpu_index": 0, "pid": 5, "job_id": 1, "used_mem_mib": 2000.0,
              "sm_util_pct": None,
              "mps_client": 0} for s in series[20:]]
    summ = summarize(1, "n1", [0], T0, T0 + 100, gpu_rows, procs, idle_smact_pct=1.0)
    assert summ.active_samples == 80 and summ.smact_idle_pct == pytest.approx(100.0 * 72 / 80)
    assert summ.tensor_mean == 0.0 and summ.dram_mean == 1.0


# --- the whole path through real SQLite files
# -------------------------------------------------------------------

OWNER = pwd.getpwuid(65534).pw_name  # "nobody": an ordinary user who owns the job below


@pytest.fixture()
def state(tmp_path: Path) -> Path:
    """Job 21 (input-bound: 2-s bursts every 10 s, batch 32, one saturated loader worker), job 22 (healthy, 25
    s) and job 23 (the tiny batch as the H100 Slurm run saw it: 16 s of start-up with its context idle on the
    GPU, then steady low occupancy at batch 2; its training process one core busy, no worker), real
    databases."""
    st = tmp_path / "state"
    ctld = open_ctld_db(st / "ctld.db")
    node = open_node_db(st / "nodes" / "n1.db")
    for job, gpu, start, end, batch in ((21, 0, T0, T0 + 300, 32), (22, 1, T0, T0 + 25, 32),
                                        (23, 2, T0, T0 + 48, 2)):
        spec = json.dumps({"model": "m.py:f", "batch_size": batch, "precision": "fp32",
                           "input_shape": [3, 224, 224]})
        store_jobs.record_submission(ctld, store_jobs.JobSubmission(
            job_id=job, user_name=OWNER, job_name=f"j{job}", shards_req=4, share_mode="shard",
            estimate_mib=3000,
            estimate_method="analytic", submit_ts=start - 1, spec_json=spec))
        store_jobs.record_ctld_end(ctld, store_jobs.JobEnd(job, end, "COMPLETED", 0, 0), node_list="n1",
                                   start_ts=start)
        store_jobs.record_node_start(node, store_jobs.JobStart(job, "n1", OWNER, None, str(gpu), 4,
                                                               "gres:shard:4", start))
        store_jobs.record_node_end(node, store_jobs.JobEnd(job, end, "COMPLETED", 0, 0, "n1"))
    gpu, proc, cpu_rows = [], [], []
    for k in range(300):
        ts = T0 + k
        busy = k % 10 < 2
        tiny = k >= 16
        gpu += samples.gpu_rows(ts, [GpuReading(index=0, mem_used_mib=2600.0, smact_pct=30.0 if busy else 0.2,
                                                smocc_pct=8.0 if busy else 0.0, tensor_pct=4.0 if busy
                                                else 0.0,
                                                dram_bw_pct=10.0 if busy else 0.0),
                                     GpuReading(index=1, mem_used_mib=2600.0, smact_pct=50.0, smocc_pct=20.0,
                                                tensor_pct=10.0, dram_bw_pct=20.0),
                                     GpuReading(index=2, mem_used_mib=1300.0, smact_pct=11.0 if tiny else 0.2,
                                                smocc_pct=3.5 if tiny else 0.0, tensor_pct=0.4 if tiny
                                                else 0.0,
                                                dram_bw_pct=2.5 if tiny else 0.0)], 1.0)
        proc += samples.proc_rows(ts, [samples.ProcSample(ProcReading(gpu_index=0, pid=100,
                                                                      used_mem_mib=2500.0), 21)]
                                  + ([samples.ProcSample(ProcReading(gpu_index=1, pid=101,
                                                                     used_mem_mib=2500.0), 22)]
                                     if k < 25 else [])
                                  + ([samples.ProcSample(ProcReading(gpu_index=2, pid=102,
                                                                     used_mem_mib=2500.0), 23)]
                                     if k < 48 else []), 1.0)
        if k:
            cpu_rows += samples.cpu_rows(ts, [JobCpu(21, 1, 0.15, 1, 0.98, None, 4)]
                                         + ([JobCpu(23, 1, 1.0, 0, 0.0, None, 4)] if k < 48 else []), 1.0)
    samples.write_rows(node, gpu, proc, [GpuReading(index=g, mem_total_mib=81559.0) for g in range(3)],
                       cpu_rows)
    for job, g, end in ((21, 0, T0 + 300), (22, 1, T0 + 25), (23, 2, T0 + 48)):
        summaries.record_summary(node, summarize(job, "n1", [g], T0, end,
                                               samples.load_gpu_samples(node, T0, end, [g]),
                                               samples.load_proc_samples(node, T0, end, [g]),
                                               cpu_rows=samples.load_job_cpu_samples(node, job, T0, end)))
    (tmp_path / "coloc.yaml").write_text(f"state_dir: {st}\ngpu_mem_gib: 80\n")
    return tmp_path


def _report(state: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(VENV_BIN / "coloc-report"), *args, "--config", str(state / "coloc.yaml")],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ))


def test_jobs_json_table_and_admin_comment_carry_the_findings(state: Path) -> None:
    proc = _report(state, "jobs", "--json")
    assert proc.returncode == 0, proc.stderr
    jobs = {j["job_id"]: j for j in json.loads(proc.stdout)["jobs"]}
    assert [f["name"] for f in jobs[21]["findings"]] == ["input-bound"]
    assert set(jobs[21]["findings"][0]) == {"name", "evidence", "suggestion"}
    assert jobs[21]["batch_size"] == 32 and jobs[21]["smact_idle_pct"] == pytest.approx(80.0)
    assert jobs[22]["findings"] == []  # 25 s: too short to judge
    assert jobs[21]["workers_cpu_cores"] == 0.98 and jobs[21]["cpu_workers"] == 1.0 and jobs[21]["cpus"] == 4
    assert jobs[23]["smact_idle_pct"] == pytest.approx(100 * 16 / 48)  # the start-up: as on the H100
    assert [f["name"] for f in jobs[23]["findings"]] == ["low-occupancy"]
    assert jobs[23]["train_cpu_cores"] == 1.0 and jobs[23]["cpu_samples"] == 47
    table = _report(state, "jobs")
    assert "job 21 input-bound: SM activity" in table.stdout and "num_workers" in table.stdout
    cfg = config_mod.load(str(state / "coloc.yaml"), environ={})
    for job in (21, 22):  # the node Epilog's figures (hooks/figures.py), recorded by EpilogSlurmctld
        assert "error" not in figures.record(cfg, open_node_db(cfg.node_db_path("n1")), job, "n1")
    for job in (21, 22):  # facts only: the finding is coloc-report's (above), computed as the user who asks
        assert {"finding", "waste"}.isdisjoint(json.loads(ctld_hooks.build(cfg, job, wait_s=0)))


@pytest.mark.slow
def test_advise_prints_the_story_and_draws_the_timeline(state: Path, tmp_path: Path) -> None:
    out = tmp_path / "png"
    proc = _report(state, "advise", "21", "--json", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert [f["name"] for f in data["findings"]] == ["input-bound"] and diagnose.NOT_JUDGED in data["notes"]
    png = Path(data["png"])
    assert png == out / "advise-21.png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = _report(state, "advise", "21")
    assert text.returncode == 0 and "1. input-bound:" in text.stdout and "try: feed the GPU" in text.stdout
    assert "CPU: training process 0.1 cores, 1 loader worker at 1.0 cores (4 CPUs); mean of 299 samples" \
        in text.stdout and "DataLoader(num_workers=3 (the job has 4 CPUs)" in text.stdout
    missing = _report(state, "advise", "999")
    assert missing.returncode != 0 and "job 999 is not recorded" in missing.stderr and not missing.stdout


def test_reader_advise_op_answers_only_the_owner(state: Path) -> None:
    cfg = config_mod.load(str(state / "coloc.yaml"), environ={})
    mine = query.answer(cfg, {"op": "advise", "job_id": 21}, uid=65534)
    assert mine["ok"] and mine["job"]["job_id"] == 21 and len(mine["series"]) == 300
    assert mine["series"][0]["job_mem_mib"] == 2500.0
    other_uid = next(p.pw_uid for p in pwd.getpwall() if p.pw_uid not in (0, 65534))
    theirs = query.answer(cfg, {"op": "advise", "job_id": 21}, uid=other_uid)
    assert not theirs["ok"] and "is not recorded as one of" in theirs["error"] and "series" not in theirs
    bad: Optional[Dict[str, Any]] = query.answer(cfg, {"op": "advise", "job_id": "21"}, uid=65534)
    assert bad is not None and not bad["ok"] and "job_id" in bad["error"]
