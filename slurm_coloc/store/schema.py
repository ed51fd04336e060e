"""Schema of slurm-coloc's SQLite databases, as sqlite-utils migrations (one function per change).

Two migration sets: ``CTLD`` for the controller-side ``ctld.db`` (jobs, estimates, events) and ``NODE``
for each ``nodes/<node>.db`` (hook rows, and later GPU/process samples). Append new migrations at the end
of a set; never edit an applied one. Only ``slurm_coloc.store`` knows these table names.
"""
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
    db["jobs"].create(
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
    db["jobs"].create_index(["user_name"])
    db["jobs"].create_index(["script_sha256"])


@CTLD()
def m002_events(db: Database) -> None:
    """Things that happened to a job, controller side (estimate recorded, hook errors, OOM, retries)."""
    db["events"].create(
        {"id": int, "ts": float, "job_id": int, "kind": str, "detail_json": str},
        pk="id",
    )
    db["events"].create_index(["job_id"])


@NODE()
def m001_job_runs(db: Database) -> None:
    """One row per (job, node): GPUs and shards it held there, start and end as the node hooks saw them."""
    db["job_runs"].create(
        {
            "job_id": int, "node": str, "user_name": str, "uid": int, "gpus": str, "shards": int,
            "gres": str, "start_ts": float, "end_ts": float, "state": str, "exit_code": int, "signal": int,
        },
        pk=("job_id", "node"),
    )


@NODE()
def m002_hook_runs(db: Database) -> None:
    """One row per hook invocation on this node (Prolog, Epilog, TaskProlog): duration and outcome."""
    db["hook_runs"].create(
        {"id": int, "job_id": int, "node": str, "hook": str, "ts": float, "duration_ms": float,
         "ok": int, "detail_json": str},
        pk="id",
    )
    db["hook_runs"].create_index(["job_id"])
