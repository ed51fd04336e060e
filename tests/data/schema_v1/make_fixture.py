"""Writes the schema-v1 upgrade fixture (``ctld.db``, ``n1.db``) with the FIRST released schema.

Run once, at the first release (2026-11-22, commit after a33f8df), and never again: the committed .db files
are the fixture; tests/reliability/test_upgrade.py migrates copies of them with the current code. Rerunning
this with a newer schema would defeat the test, so it refuses to overwrite existing files.

    .venv/bin/python tests/data/schema_v1/make_fixture.py
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from slurm_coloc.nvml.readings import GpuReading, ProcReading
from slurm_coloc.store import jobs as store_jobs
from slurm_coloc.store import oom as store_oom
from slurm_coloc.store import samples as store_samples
from slurm_coloc.store import summaries as store_summaries
from slurm_coloc.store.db import open_ctld_db, open_node_db

HERE = Path(__file__).resolve().parent
T0 = 1795000000.0  # 2026-11-18, fixed so the fixture is reproducible


def main() -> int:
    ctld_path, node_path = HERE / "ctld.db", HERE / "n1.db"
    if ctld_path.exists() or node_path.exists():
        print("fixture exists; it records the first released schema and must not be rewritten",
              file=sys.stderr)
        return 1
    ctld = open_ctld_db(ctld_path)
    for i, (user, name, shards, est, state) in enumerate([
            ("colocuser", "resnet18-cifar", 6, 5120, "COMPLETED"),
            ("colocuser2", "x'); DROP TABLE jobs;--", 12, 11000, "FAILED"),
            ("colocuser", "bert-base ünïcode name", 80, None, "COMPLETED")]):
        job_id = 101 + i
        coloc = {"mem_mib": est, "shards": shards, "method": "learned",
                 "sha256": f"{job_id:064x}"} if est else {}
        store_jobs.record_submission(ctld, store_jobs.JobSubmission(
            job_id=job_id, user_name=user, uid=2001 if user == "colocuser" else 2002, job_name=name,
            partition="debug", cluster="coloc", submit_ts=T0 + 10 * i, gres_req=f"gres:shard:{shards}",
            shards_req=shards, gpus_req=None, share_mode="whole-gpu" if shards == 80 else "shard",
            estimate_mib=est, estimate_method="learned" if est else None, script_sha256=coloc.get("sha256"),
            spec_json=None, coloc_json=json.dumps(coloc, sort_keys=True) if coloc else None))
        store_jobs.record_ctld_end(ctld,
                                   store_jobs.JobEnd(job_id=job_id, end_ts=T0 + 10 * i + 300, state=state,
                                                           exit_code=0 if state == "COMPLETED" else 1,
                                                           signal=0),
                                   node_list="n1", start_ts=T0 + 10 * i + 2)
        store_jobs.record_event(ctld, job_id, "estimate", {"mem_mib": est})
    store_oom.claim_retry(ctld, store_oom.OomRecord(
        job_id=102, ts=T0 + 320, user_name="colocuser2", uid=2002, script_sha256=f"{102:064x}",
        share_mode="shard", shards=12, fence_mib=12288, end_ts=T0 + 310,
        evidence={"messages": ["CUDA out of memory"]}, retry_status="submitting",
        retry_reason="shared GPU: rerun on a whole GPU"))
    store_oom.record_retry_submitted(ctld, 102, 104, submit_ts=T0 + 321)
    node = open_node_db(node_path)
    for i in range(3):
        job_id = 101 + i
        store_jobs.record_node_start(node, store_jobs.JobStart(
            job_id=job_id, node="n1", user_name="colocuser", uid=2001, gpus=str(i % 2), shards=6,
            gres="gres:shard:6",
            start_ts=T0 + 10 * i + 2))
        store_jobs.record_node_end(node, store_jobs.JobEnd(job_id=job_id, node="n1", end_ts=T0 + 10 * i + 300,
                                                           state="COMPLETED", exit_code=0, signal=0))
        for hook in ("prolog", "epilog"):
            store_jobs.record_hook_run(node,
                                       store_jobs.HookRun(job_id=job_id, node="n1", hook=hook, ts=T0 + 10 * i,
                                                                duration_ms=42.0, ok=True,
                                                                detail={"gpus": str(i % 2)}))
    for k in range(20):
        ts = T0 + k
        gpus = [GpuReading(index=g, uuid=f"GPU-{g}", name="NVIDIA H100 80GB HBM3", util_pct=50.0,
                           mem_used_mib=4000.0 + k, mem_total_mib=81559.0, power_w=200.0, energy_j=1000.0 + k,
                           smact_pct=30.0, smocc_pct=20.0) for g in (0, 1)]
        procs = [store_samples.ProcSample(ProcReading(gpu_index=0, pid=4242, used_mem_mib=3900.0), 101)]
        store_samples.write_rows(node, store_samples.gpu_rows(ts, gpus, 1.0),
                                 store_samples.proc_rows(ts, procs, 1.0),
                                 gpus if k == 0 else ())
    store_summaries.record_summary(node, store_summaries.JobSummary(
        job_id=101, node="n1", gpus="0", start_ts=T0 + 2, end_ts=T0 + 300, peak_mem_mib=3900.0,
        smact_mean=30.0,
        smact_p95=30.0, smocc_mean=20.0, smocc_p95=20.0, energy_j=19.0, gpu_s=298.0, n_samples=20))
    store_samples.record_node_event(node, 101, "mps-start", {"gpu": 0})
    for db in (ctld, node):
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db.execute("PRAGMA journal_mode = DELETE")  # one self-contained file each in git
        db.conn.close()
    print(f"wrote {ctld_path} and {node_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
