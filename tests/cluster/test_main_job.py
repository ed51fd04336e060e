"""The main job on a real local Slurm cluster: coloc-sbatch -> Slurm -> hooks -> SQLite -> coloc-report."""
from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

import pytest

from slurm_coloc.slurm.parse import gres_detail_counts
from tests.slurm_cluster import REPO, Cluster

pytestmark = pytest.mark.slurm
EXAMPLE = REPO / "examples" / "train_digits.sh"


def user_script(cluster: Cluster, name: str, text: str, mode: int = 0o644) -> Path:
    path = cluster.jobs_dir / name
    path.write_text(text)
    os.chmod(path, mode)
    return path


def submit(cluster: Cluster, *argv: str) -> int:
    proc = cluster.run(["coloc-sbatch", "--parsable", *argv])
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.strip())


def ctld_rows(cluster: Cluster, table: str = "jobs") -> list:
    if not cluster.ctld_db.exists():
        return []
    with sqlite3.connect(cluster.ctld_db) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute(f"SELECT * FROM {table}")]


def node_rows(cluster: Cluster, node: str, table: str) -> list:
    with sqlite3.connect(cluster.node_db(node)) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute(f"SELECT * FROM {table}")]


def test_digits_example_end_to_end(slurm_cluster: Cluster):
    dry = slurm_cluster.run(["coloc-sbatch", "--dry-run", str(EXAMPLE)])
    assert dry.returncode == 0, dry.stderr
    comment = json.loads(dry.stdout.split("coloc:", 1)[1].split("'", 1)[0])
    shards = comment["shards"]
    assert comment["mode"] == "shard" and 1 <= shards < 80 and comment["mem_mib"] > 0
    job_id = submit(slurm_cluster, "-o", "digits-%j.out", str(EXAMPLE), "--epochs", "15")
    rec = slurm_cluster.wait_job(job_id, timeout=180)
    assert rec["job_state"] == "COMPLETED"
    assert rec["tres_per_node"] == f"gres:shard:{shards}"
    out = (slurm_cluster.jobs_dir / f"digits-{job_id}.out").read_text()
    acc = float(out.split("test_accuracy")[1].split()[0])
    assert acc >= 0.95, out
    time.sleep(1.0)  # EpilogSlurmctld may still be writing after the state flips
    node = rec["nodes"]
    runs = [r for r in node_rows(slurm_cluster, node, "job_runs") if r["job_id"] == job_id]
    assert len(runs) == 1 and runs[0]["shards"] == shards and runs[0]["state"] == "COMPLETED"
    assert runs[0]["start_ts"] and runs[0]["end_ts"] >= runs[0]["start_ts"] and runs[0]["gpus"] in ("0", "1")
    hooks = {r["hook"]: r for r in node_rows(slurm_cluster, node, "hook_runs") if r["job_id"] == job_id}
    assert hooks["prolog"]["ok"] == 1 and hooks["epilog"]["ok"] == 1
    job = next(r for r in ctld_rows(slurm_cluster) if r["job_id"] == job_id)
    assert job["estimate_mib"] == comment["mem_mib"] and job["script_sha256"] == comment["sha256"]
    assert job["user_name"] == "colocuser" and job["share_mode"] == "shard"
    report = slurm_cluster.run(["coloc-report", "--json"], user=None)
    assert report.returncode == 0, report.stderr
    view = next(j for j in json.loads(report.stdout)["jobs"] if j["job_id"] == job_id)
    assert view["state"] == "COMPLETED" and view["shards"] == shards and view["exit_code"] == 0
    assert view["estimate_mib"] == comment["mem_mib"] and view["runtime_s"] is not None
    shown = slurm_cluster.scontrol("show", "job", "-o", str(job_id))
    assert f'AdminComment={{"coloc":{{"mode":"shard","shards":{shards},"est_mib":{comment["mem_mib"]}' in shown
    table = slurm_cluster.run(["coloc-report"], user=None).stdout
    assert str(job_id) in table and "COMPLETED" in table


def test_shard_jobs_share_a_gpu_whole_gpu_does_not(slurm_cluster: Cluster):
    small = user_script(slurm_cluster, "small.sh", "#!/bin/sh\n#SBATCH -w n2\nsleep 12\n")
    a = submit(slurm_cluster, "--coloc-mem", "2G", str(small))
    b = submit(slurm_cluster, "--coloc-mem", "2G", str(small))
    whole = submit(slurm_cluster, "--exclusive-gpu", str(small))
    for j in (a, b, whole):
        slurm_cluster.wait_state(j, ["RUNNING"], timeout=30)
    # (name, count, GPU indices) from either version's gres_detail: shard:2(IDX:0) / shard:2(2/80,0/80)
    idx = {j: [(name, sum(per.values()), sorted(per)) for name, _, per in
               gres_detail_counts(slurm_cluster.job(j)["gres_detail"])] for j in (a, b, whole)}
    assert idx[a] == idx[b] and idx[a] in ([("shard", 2, [0])], [("shard", 2, [1])]), idx  # --coloc-mem is exact
    assert idx[whole][0][:2] == ("shard", 80) and idx[whole][0][2] != idx[a][0][2], idx
    # a second whole-GPU job cannot start on n2: one GPU is whole-taken, the other has shard tenants
    waiting = submit(slurm_cluster, "--exclusive-gpu", str(small))
    time.sleep(4)
    rec = slurm_cluster.job(waiting)
    assert rec["job_state"] == "PENDING" and rec["state_reason"] == "Resources", rec
    for j in (a, b, whole, waiting):
        assert slurm_cluster.wait_job(j, timeout=90)["job_state"] == "COMPLETED"


def _assert_rejected(cluster: Cluster, argv, fragment, code=2):
    before_jobs = cluster.job_ids()
    before_rows = len(ctld_rows(cluster))
    proc = cluster.run(["coloc-sbatch", *argv])
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    if code == 2:  # our own errors: exactly one line
        assert len(lines) == 1 and fragment in lines[0], proc.stderr
    else:  # sbatch's own refusal, passed through verbatim with its exit code
        assert fragment in proc.stderr and all(ln.startswith("sbatch: error") for ln in lines), proc.stderr
    assert "Traceback" not in proc.stderr
    time.sleep(0.5)
    assert cluster.job_ids() == before_jobs
    assert len(ctld_rows(cluster)) == before_rows


def test_bad_input_submits_nothing(slurm_cluster: Cluster):
    c = slurm_cluster
    _assert_rejected(c, [str(c.jobs_dir / "missing.sh")], "does not exist")
    secret = user_script(c, "secret.sh", "#!/bin/sh\ntrue\n", mode=0o600)
    os.chown(secret, 0, 0)
    _assert_rejected(c, [str(secret)], "cannot read job script")
    bad = user_script(c, "bad.sh", "#!/bin/sh\n#COLOC model=a:b input=3x batch=4\ntrue\n")
    _assert_rejected(c, [str(bad)], "expected sizes like 3x32x32")
    unknown = user_script(c, "unknown.sh",
                          "#!/bin/sh\n#COLOC model=no_such_module_xyz:build input=4 batch=2\ntrue\n")
    _assert_rejected(c, [str(unknown)], "no_such_module_xyz")
    user_script(c, "broken_model.py", "def build():\n    raise RuntimeError('cannot build this model')\n")
    broken = user_script(c, "broken.sh",
                         "#!/bin/sh\n#COLOC model=broken_model.py:build input=4 batch=2\ntrue\n")
    _assert_rejected(c, [str(broken)], "broken_model.py:build")
    ok = user_script(c, "ok.sh", "#!/bin/sh\ntrue\n")
    _assert_rejected(c, ["-p", "nosuchpartition", str(ok)], "invalid partition", code=1)
    _assert_rejected(c, ["--coloc-mem", "lots", str(ok)], "invalid memory size")


def test_hook_internal_error_does_not_drain(slurm_cluster: Cluster):
    """A corrupt node database makes our Prolog/Epilog fail inside: logged, exit 0, node stays up."""
    db = slurm_cluster.node_db("n2")
    db.parent.mkdir(parents=True, exist_ok=True)
    saved = db.read_bytes() if db.exists() else None
    for suffix in ("-wal", "-shm"):
        Path(str(db) + suffix).unlink(missing_ok=True)
    db.write_bytes(b"this is not a sqlite database" * 100)
    try:
        script = user_script(slurm_cluster, "n2.sh", "#!/bin/sh\n#SBATCH -w n2\necho ran\n")
        job = submit(slurm_cluster, "--coloc-mem", "1G", str(script))
        assert slurm_cluster.wait_job(job, timeout=60)["job_state"] == "COMPLETED"
        time.sleep(1.5)
        assert slurm_cluster.node_states()["n2"] in ("idle", "mix"), slurm_cluster.node_states()
        log = (slurm_cluster.dir / "log" / "hooks.log").read_text()
        assert f"coloc[{job}] prolog FAILED" in log and f"coloc[{job}] epilog FAILED" in log
    finally:
        db.unlink()
        if saved is not None:
            db.write_bytes(saved)
