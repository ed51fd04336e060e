"""The jobs' CPU use (node/cpu.py): the reader on real process trees of this machine (an idle parent with a
busy child; the real DataLoader of ``diag_jobs.py``'s input-bound job), the sampler's tick with the H100 NVML
recording replayed onto a live process, the cgroup v2 file the usage comes from, storage, folding and the
Epilog summary. No GPU: the CPU side needs none; NVML readings are the recording's (labelled in its
header)."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Iterator, List

import pytest

from slurm_coloc.config import Config
from slurm_coloc.node.attribution import JobAttributor
from slurm_coloc.node.cpu import CpuReader
from slurm_coloc.node.lifecycle import cpu_means, summarize
from slurm_coloc.node.sampler import Sampler
from slurm_coloc.nvml import ReplayReader
from slurm_coloc.store import samples, summaries
from slurm_coloc.store.db import open_node_db

REPO = Path(__file__).resolve().parents[1]
REC = REPO / "tests" / "data" / "nvml" / "h100_mps_2jobs.jsonl"
SPIN = "import time\nwhile True:\n    pass\n"
# an idle parent (sleeps; it stands for the CUDA process) with one busy child (a loader worker)
PARENT = ("import subprocess, sys, time\n"
          f"c = subprocess.Popen([sys.executable, '-c', {SPIN!r}])\n"
          "print(c.pid, flush=True)\n"
          "try:\n    time.sleep(120)\nfinally:\n    c.kill()\n")


def _spawn(code: str, env: dict | None = None) -> "tuple[subprocess.Popen, List[int]]":
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, **(env or {})})
    assert p.stdout is not None
    kids = [int(x) for x in p.stdout.readline().split()]
    return p, kids


def _stop(p: subprocess.Popen, kids: List[int]) -> None:
    for pid in kids:  # the children this test started (by pid), then their parent
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    p.kill()
    p.wait(timeout=10)


@pytest.fixture()
def tree() -> Iterator["tuple[subprocess.Popen, List[int]]"]:
    p, kids = _spawn(PARENT, {"SLURM_JOB_ID": "9102", "SLURM_CPUS_ON_NODE": "1"})
    yield p, kids
    _stop(p, kids)


@pytest.mark.slow
def test_reader_splits_the_idle_cuda_process_from_its_busy_worker(tree: "tuple[subprocess.Popen, List[int]]"
                                                                   ) -> None:
    parent, kids = tree
    r = CpuReader()
    assert r.read({5: [parent.pid]}) == []  # the first reading of a job only sets its baseline
    rows = []
    for _ in range(3):
        time.sleep(0.7)
        rows += r.read({5: [parent.pid]})
    assert len(rows) == 3 and all(x.job_id == 5 and x.train_pids == 1 and x.workers == 1 for x in rows)
    train = sum(x.train_cores for x in rows) / 3
    workers = sum(x.workers_cores or 0 for x in rows) / 3
    # the child spins (one core, shared with the machine's other work); the parent sleeps
    assert workers > 0.3 and train < 0.1, (train, workers)
    assert rows[0].cpus == 1  # SLURM_CPUS_ON_NODE, below the affinity
    unset = CpuReader()
    unset._cpus.clear()
    assert unset._allowed_cpus(1, os.getpid()) == min(len(os.sched_getaffinity(0)),
                                                      int(os.environ.get("SLURM_CPUS_ON_NODE", "1000000")))
    assert r.read({}) == [] and r.read({5: [parent.pid]}) == []  # a job gone and back starts a new baseline


@pytest.mark.slow
def test_a_worker_started_between_walks_counts_its_whole_cpu_time() -> None:
    """The tree is walked once per ``tree_refresh_s`` (5 s here, on the reader's clock): a worker forked after
    a walk is found at the next one and its CPU time since its start is counted then, none of it lost."""
    code = ("import subprocess, sys, time\nprint(flush=True)\nsys.stdin.readline()\n"
            f"c = subprocess.Popen([sys.executable, '-c', {SPIN!r}])\nprint(c.pid, "
            "flush=True)\ntime.sleep(120)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    assert p.stdin is not None and p.stdout is not None
    kid = 0
    now = [0.0]
    try:
        p.stdout.readline()
        r = CpuReader(clock=lambda: now[0], tree_refresh_s=5.0)
        r.read({6: [p.pid]})
        p.stdin.write("go\n")
        p.stdin.flush()
        kid = int(p.stdout.readline())
        time.sleep(1.0)
        now[0] = 1.0
        (before,) = r.read({6: [p.pid]})
        assert before.workers == 0 and before.workers_cores == 0.0  # not walked yet
        time.sleep(1.0)
        now[0] = 5.0
        (row,) = r.read({6: [p.pid]})
        fields = Path(f"/proc/{kid}/stat").read_text().rsplit(")", 1)[1].split()
        kid_cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        assert row.workers == 1 and row.workers_cores is not None and kid_cpu_s > 0.3
        assert row.workers_cores * 4.0 == pytest.approx(kid_cpu_s,
                                                        abs=0.05)  # all of it, over the 4 s interval
    finally:
        _stop(p, [kid] if kid else [])


def test_cgroup_v2_usage_of_the_job_directory(tmp_path: Path) -> None:
    """The layout slurmd's cgroup/v2 plugin makes (Slurm 22.05+): the usage is the job directory's
    ``cpu.stat``."""
    proc, cg = tmp_path / "proc", tmp_path / "cgroup"
    job_dir = cg / "system.slice" / "slurmstepd.scope" / "job_41"
    (job_dir / "step_batch" / "user" / "task_0").mkdir(parents=True)
    (proc / "77").mkdir(parents=True)
    (proc / "77" / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_41/step_batch/user/task_0\n")
    (proc / "77" / "stat").write_text("77 (python3) S 1 77 77 0 -1 0 0 0 0 0 300 100 0 0 20 0 40 0 5000 "
                                      "0 0\n")
    (job_dir / "cpu.stat").write_text("usage_usec 10000000\nuser_usec 9000000\nsystem_usec 1000000\n")
    now = [100.0]
    r = CpuReader(proc_root=str(proc), cgroup_root=str(cg), clock=lambda: now[0])
    assert r.read({41: [77]}) == []
    now[0] = 102.0
    (job_dir / "cpu.stat").write_text("usage_usec 15000000\nuser_usec 13000000\nsystem_usec 2000000\n")
    (proc / "77" / "stat").write_text("77 (python3) S 1 77 77 0 -1 0 0 0 0 0 400 200 0 0 20 0 40 0 5000 "
                                      "0 0\n")
    (row,) = r.read({41: [77]})
    tick = os.sysconf("SC_CLK_TCK")
    assert row.job_cores == pytest.approx(2.5)  # 5 s of CPU in 2 s
    assert row.train_cores == pytest.approx(200 / tick / 2.0, abs=1e-3)
    assert row.workers == 0 and row.cpus is None


@pytest.mark.slow
def test_sampler_tick_records_the_cpu_of_a_replayed_gpu_process(tree: "tuple[subprocess.Popen, List[int]]",
                                                                 tmp_path: Path) -> None:
    """NVML is the H100 recording with its job 9102's CUDA pid mapped onto the live idle parent (SLURM_JOB_ID
    9102 in its environment); the sampler reads that tree's CPU through /proc each tick and stores it."""
    parent, _ = tree
    cfg = dataclasses.replace(Config(), state_dir=str(tmp_path / "state"), run_dir=str(tmp_path / "run"),
                              log_dir=str(tmp_path / "log"))
    (tmp_path / "run").mkdir()
    reader = ReplayReader(str(REC), pid_map={2342: parent.pid})
    for _ in range(14):  # the recording's frames before its jobs' processes appear
        reader.read()
    s = Sampler(cfg, "c1", reader, db_path=tmp_path / "c1.db", interval_s=0.25,
                attributor=JobAttributor(job_uid=lambda job: os.getuid()))
    s.run(max_frames=16)
    db = open_node_db(tmp_path / "c1.db")
    rows = samples.load_job_cpu_samples(db, 9102, 0, time.time() + 1)
    assert len(rows) == 15 and all(r["workers"] == 1 and r["train_pids"] == 1 for r in rows)
    summ = cpu_means(rows)
    assert summ["workers_cpu_cores"] > 0.3 and summ["train_cpu_cores"] < 0.1 and summ["cpu_samples"] == 15
    assert not samples.load_job_cpu_samples(db, 9101, 0, time.time() + 1)  # its pid 2340 is not live here
    gpus = samples.load_gpu_samples(db, 0, time.time() + 1, [0])
    procs = samples.load_proc_samples(db, 0, time.time() + 1, [0])
    whole = summarize(9102, "c1", [0], rows[0]["ts"] - 1, rows[-1]["ts"], gpus, procs, cpu_rows=rows)
    assert whole.cpu_samples == 15 and whole.workers_cpu_cores == summ["workers_cpu_cores"]
    summaries.record_summary(db, whole)
    (back,) = summaries.load_summaries(db, 9102)
    assert back.cpu_workers == 1.0 and back.train_cpu_cores == whole.train_cpu_cores


def test_cpu_rows_fold_and_purge(tmp_path: Path) -> None:
    db = open_node_db(tmp_path / "n.db")
    from slurm_coloc.node.cpu import JobCpu
    rows = []
    for k in range(120):
        rows += samples.cpu_rows(960.0 + k, [JobCpu(3, 1, 1.0 if k % 2 else 0.0, 2, 1.5, None, 4)], 1.0)
    samples.write_rows(db, [], [], cpu=rows)
    assert samples.downsample(db, 960.0 + 120, 60.0) == 120
    folded = samples.load_job_cpu_samples(db, 3, 0, 2000)  # cores averaged, CPUs kept as the max, n summed
    assert [(r["ts"], r["n"], r["res_s"], r["train_cores"], r["workers_cores"], r["workers"], r["cpus"])
            for r in folded] == [(960.0, 60, 60.0, 0.5, 1.5, 2.0, 4), (1020.0, 60, 60.0, 0.5, 1.5, 2.0, 4)]
    assert samples.purge(db, 5000.0) == len(folded) and not samples.load_job_cpu_samples(db, 3, 0, 2000)


LOADER = textwrap.dedent("""
    import os, sys, time
    import torch
    from benchmarks.device.diag_jobs import BlurredImages, _worker_init
    torch.set_num_threads(1)
    loader = torch.utils.data.DataLoader(BlurredImages(passes=6), batch_size=4, num_workers=1,
                                         worker_init_fn=_worker_init)
    it = iter(loader)
    next(it)
    print(" ".join(str(c.pid) for c in __import__("multiprocessing").active_children()) or "0", flush=True)
    end = time.time() + 60
    while time.time() < end:
        next(it)  # the training step is a GPU's: here nothing, so the process waits for the worker
""")


@pytest.mark.slow
def test_the_input_bound_jobs_real_loader_reads_as_a_saturated_worker_and_a_waiting_process() -> None:
    """The CPU half of ``diag_jobs.py input_bound`` (its DataLoader: one worker blurring 3x224x224 images) run
    for real here; what the sampler's reader sees is the evidence the input-bound rule needs."""
    p, kids = _spawn(LOADER, env={"PYTHONPATH": str(REPO)})  # benchmarks.device.diag_jobs from the repository
    try:
        r = CpuReader()
        r.read({8: [p.pid]})
        time.sleep(2.5)
        (row,) = r.read({8: [p.pid]})
    finally:
        _stop(p, [k for k in kids if k])
    assert row.workers == 1 and row.workers_cores is not None
    # one single-threaded worker, busy all the time (the machine's 2 cores are shared: at least half of one)
    assert row.workers_cores > 0.5 and row.train_cores < 0.3, row
