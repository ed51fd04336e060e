"""Schema of slurm-coloc's SQLite databases, as sqlite-utils migrations (one function per change). Two sets:
``CTLD`` for the controller-side ``ctld.db`` (jobs, estimates, events) and ``NODE`` for each
``nodes/<node>.db`` (hook rows, samples). Append new migrations at the end of a set; never edit an applied
one. Only ``slurm_coloc.store`` knows these table names. sqlite-utils calls each migration once, inside
``db.migrate``'s ``BEGIN IMMEDIATE``."""
from __future__ import annotations

from sqlite_utils import Database
from sqlite_utils.migrations import Migrations

SCHEMA_VERSION_CTLD = "slurm_coloc.ctld"
SCHEMA_VERSION_NODE = "slurm_coloc.node"

CTLD = Migrations(SCHEMA_VERSION_CTLD)
NODE = Migrations(SCHEMA_VERSION_NODE)


@CTLD()
def m001_jobs(db: Database) -> None:
    """One row per job seen by a controller-side hook: what was asked, what was estimated, how it ended."""
    db.table("jobs").create(
        {
            "job_id": int, "cluster": str, "user_name": str, "uid": int, "job_name": str, "partition": str,
            "submit_ts": float, "gres_req": str, "shards_req": int, "gpus_req": int, "share_mode": str,
            "estimate_mib": int, "estimate_method": str, "script_sha256": str, "spec_json": str,
            "coloc_json": str, "node_list": str, "start_ts": float, "end_ts": float, "state": str,
            "exit_code": int, "signal": int, "restart_count": int, "updated_ts": float,
        },
        pk="job_id",
        not_null={"job_id"},
    )
    db.table("jobs").create_index(["user_name"])
    db.table("jobs").create_index(["script_sha256"])


@CTLD()
def m002_events(db: Database) -> None:
    """Things that happened to a job, controller side (estimate recorded, hook errors, OOM, retries)."""
    db.table("events").create(
        {"id": int, "ts": float, "job_id": int, "kind": str, "detail_json": str},
        pk="id",
    )
    db.table("events").create_index(["job_id"])


@NODE()
def m001_job_runs(db: Database) -> None:
    """One row per (job, node): GPUs and shards it held there, start and end as the node hooks saw them."""
    db.table("job_runs").create(
        {
            "job_id": int, "node": str, "user_name": str, "uid": int, "gpus": str, "shards": int,
            "gres": str, "start_ts": float, "end_ts": float, "state": str, "exit_code": int, "signal": int,
        },
        pk=("job_id", "node"),
    )


@NODE()
def m002_hook_runs(db: Database) -> None:
    """One row per hook invocation on this node (Prolog, Epilog, TaskProlog): duration and outcome."""
    db.table("hook_runs").create(
        {"id": int, "job_id": int, "node": str, "hook": str, "ts": float, "duration_ms": float,
         "ok": int, "detail_json": str},
        pk="id",
    )
    db.table("hook_runs").create_index(["job_id"])


@CTLD()
def m003_oom_events(db: Database) -> None:
    """One row per job that died of GPU OOM (hooks/oom.py): evidence, its fence, its one retry.
    ``retry_status``: ``submitting`` (sbatch running), ``submitted``, ``failed`` (``retry_error``),
    ``not-retried``. The primary key on ``job_id`` allows one retry; a unique ``retry_job_id`` marks a retry
    as one."""
    db.table("oom_events").create(
        {
            "job_id": int, "ts": float, "user_name": str, "uid": int, "script_sha256": str, "share_mode": str,
            "shards": int, "fence_mib": int, "end_ts": float, "evidence_json": str, "retry_of": int,
            "retry_status": str, "retry_reason": str, "retry_job_id": int, "retry_submit_ts": float,
            "retry_error": str, "retry_state": str, "retry_start_ts": float, "retry_end_ts": float,
        },
        pk="job_id",
        not_null={"job_id"},
    )
    db.table("oom_events").create_index(["retry_job_id"], unique=True)
    db.table("oom_events").create_index(["script_sha256"])


@NODE()
def m003_samples(db: Database) -> None:
    """NVML samples of this node (store/samples.py): per GPU and per process (attributed to a job id), the
    GPUs seen, per-job Epilog summaries, and node events (MPS start/stop/failure). ``n``: raw samples folded
    into the row; ``res_s``: its time resolution in seconds."""
    db.table("gpu_samples").create(
        {"id": int, "ts": float, "gpu_index": int, "util_pct": float, "mem_util_pct": float,
         "mem_used_mib": float, "power_w": float, "energy_j": float, "temp_c": float, "sm_clock_mhz": float,
         "smact_pct": float, "smocc_pct": float, "tensor_pct": float, "dram_bw_pct": float, "n": int,
         "res_s": float},
        pk="id",
    )
    db.table("gpu_samples").create_index(["ts"])
    db.table("proc_samples").create(
        {"id": int, "ts": float, "gpu_index": int, "pid": int, "job_id": int, "used_mem_mib": float,
         "sm_util_pct": float, "mem_util_pct": float, "mps_client": int, "n": int, "res_s": float},
        pk="id",
    )
    db.table("proc_samples").create_index(["ts"])
    db.table("proc_samples").create_index(["job_id"])
    db.table("gpus").create({"gpu_index": int, "uuid": str, "name": str, "mem_total_mib": float,
                             "updated_ts": float},
                      pk="gpu_index")
    db.table("job_summaries").create(
        {"job_id": int, "node": str, "gpus": str, "start_ts": float, "end_ts": float, "peak_mem_mib": float,
         "smact_mean": float, "smact_p95": float, "smocc_mean": float, "smocc_p95": float, "energy_j": float,
         "gpu_s": float, "n_samples": int, "ts": float},
        pk=("job_id", "node"),
    )
    db.table("node_events").create({"id": int, "ts": float, "job_id": int, "kind": str, "detail_json": str},
                                   pk="id")
    db.table("node_events").create_index(["job_id"])


@NODE()
def m004_watchdog_events(db: Database) -> None:
    """One row per job the sampler's watchdog (node/watchdog.py) found over its grant or outside MPS
    (``reason``; grant and used MiB, pids; ``action`` ``stop`` | ``record``; ``outcome_json``). A stopped job
    gets no OOM rerun."""
    db.table("watchdog_events").create(
        {"id": int, "ts": float, "job_id": int, "node": str, "gpu_index": int, "reason": str, "share": str,
         "grant_mib": float, "used_mib": float, "tolerance_mib": float, "pids_json": str, "action": str,
         "message": str, "outcome_json": str},
        pk="id",
    )
    db.table("watchdog_events").create_index(["job_id"])
@CTLD()
def m004_root_script_identity(db: Database) -> None:
    """``script_sha256`` becomes root's hash of the batch script Slurm stored (PrologSlurmctld);
    ``jobs.state_source`` says whether ``state`` is Slurm's own (``slurm``) or EpilogSlurmctld's inference
    (``inferred``, settled by ``store.jobs.settle_state``). Earlier ``script_sha256`` values came from the
    job's comment, which its user writes: they are cleared so that no forged value keys the estimator's
    history (history starts again, per user, from the next runs)."""
    db.table("jobs").add_column("state_source", str)
    db.execute("UPDATE jobs SET script_sha256 = NULL")
    if db.table("oom_events").exists():
        db.execute("UPDATE oom_events SET script_sha256 = NULL")
    db.table("jobs").create_index(["uid", "script_sha256"])
    db.table("oom_events").create_index(["uid", "ts"])


@NODE()
def m005_summary_diagnosis(db: Database) -> None:
    """Per-job figures of the report's diagnosis (report/diagnose.py): mean tensor and DRAM activity of the
    job's GPUs, the share of its samples with the GPU idle (``smact_idle_pct``), and samples with a process of
    the job on the GPU (``active_samples``); NULL in older summaries."""
    if db.table("job_summaries").exists():
        for col in ("tensor_mean", "dram_mean", "smact_idle_pct"):
            db.table("job_summaries").add_column(col, float)
        db.table("job_summaries").add_column("active_samples", int)


@NODE()
def m006_cpu_samples(db: Database) -> None:
    """Each GPU job's CPU use per sampler tick (node/cpu.py), and per-job means in ``job_summaries``. Cores of
    its CUDA process(es) (``train_cores``, ``train_pids``), of their descendants (``workers``,
    ``workers_cores``: DataLoader workers), of its whole cgroup (``job_cores``), and its CPUs on the node
    (``cpus``); ``cpu_samples``: rows the means came from. NULL in older summaries."""
    db.table("cpu_samples").create(
        {"id": int, "ts": float, "job_id": int, "train_pids": int, "train_cores": float, "workers": float,
         "workers_cores": float, "job_cores": float, "cpus": int, "n": int, "res_s": float},
        pk="id",
    )
    db.table("cpu_samples").create_index(["ts"])
    db.table("cpu_samples").create_index(["job_id"])
    if db.table("job_summaries").exists():
        for col in ("train_cpu_cores", "workers_cpu_cores", "cpu_workers", "job_cpu_cores"):
            db.table("job_summaries").add_column(col, float)
        for col in ("cpus", "cpu_samples"):
            db.table("job_summaries").add_column(col, int)


@NODE()
def m007_job_figures(db: Database) -> None:
    """The job's summary figures as the node Epilog computed them (hooks/figures.py): one JSON object per
    (job, node), which EpilogSlurmctld records in AdminComment without running the report pipeline itself."""
    db.table("job_figures").create({"job_id": int, "node": str, "ts": float, "figures_json": str},
                                   pk=("job_id", "node"))
