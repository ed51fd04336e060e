"""coloc-sbatch asks for more after an OOM of the same script (history from the controller DB)."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from slurm_coloc.cli.sbatch import plan_submission
from slurm_coloc.store.db import open_ctld_db
from slurm_coloc.store.oom import OomRecord, claim_retry
from slurm_coloc.submit.directives import parse_script

SCRIPT = ("#!/bin/sh\n#COLOC model=torch.nn:Linear kwarg.in_features=64 kwarg.out_features=8 input=64 "
          "batch=4\ntrue\n")


def _config_and_script(tmp_path: Path, monkeypatch) -> Path:
    """COLOC_CONFIG -> a config with its state under tmp_path; SCRIPT written to tmp_path/job.sh
    (returned)."""
    cfg_file = tmp_path / "coloc.yaml"
    cfg_file.write_text(f"state_dir: {tmp_path / 'state'}\n")
    monkeypatch.setenv("COLOC_CONFIG", str(cfg_file))
    script = tmp_path / "job.sh"
    script.write_text(SCRIPT)
    return script


@pytest.mark.slow
def test_oom_fence_raises_next_request(tmp_path, monkeypatch):
    script = _config_and_script(tmp_path, monkeypatch)
    before, _, _ = plan_submission([str(script)])
    assert before.mode == "shard" and before.comment["method"] != "history"
    fence = before.shards * 1024
    db = open_ctld_db(tmp_path / "state" / "ctld.db")
    sha = parse_script(str(script)).sha256
    assert claim_retry(db, OomRecord(job_id=7, ts=time.time(), uid=os.getuid(), script_sha256=sha,
                                     shards=before.shards,
                                     fence_mib=fence, retry_status="submitted"))
    after, _, _ = plan_submission([str(script)])
    assert after.comment["method"] == "history"
    assert after.comment["mem_mib"] > fence and after.shards > before.shards
    other = tmp_path / "other.sh"
    other.write_text(SCRIPT + "# a different script\n")
    assert plan_submission([str(other)])[0].comment["method"] != "history"
    json.dumps(after.comment)


def test_history_reaches_a_normal_user_through_the_reader(tmp_path):
    """Users run coloc-sbatch but may not read the databases (root/admin_group only): coloc-sbatch asks the
    reader service (``coloc-report serve``, run by root) for the script's history."""
    import os
    import shutil
    import subprocess
    import sys

    if os.geteuid() != 0:
        import pytest
        pytest.skip("needs root to create a root-owned state dir and runuser")
    base = Path(f"/tmp/coloc-hist-{os.getpid()}")
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(mode=0o755)
    base.chmod(0o755)  # whatever umask an earlier test in this process left (hook code sets 077)
    server = None
    try:
        state = base / "state"
        db = open_ctld_db(state / "ctld.db")
        claim_retry(db, OomRecord(job_id=1, ts=time.time(), uid=2001, script_sha256="ab" * 32, shards=2,
                                  fence_mib=2048))
        db.conn.close()  # the writer is gone: no -wal/-shm files remain
        cfg = base / "coloc.yaml"
        cfg.write_text(f"state_dir: {state}\nreport_socket_path: {base / 'report.sock'}\n")
        cfg.chmod(0o644)
        code = ("from slurm_coloc.config import load; from slurm_coloc.cli.sbatch import script_history_mib; "
                f"print(script_history_mib(load({str(cfg)!r}), {'ab' * 32!r}))")
        user = ["runuser", "-u", "colocuser", "--", sys.executable, "-c", code]
        out = subprocess.run(user, capture_output=True, text=True, timeout=60)
        # no reader: no history, never an error
        assert out.returncode == 0 and out.stdout.strip() == "[]", out
        server = subprocess.Popen([str(Path(sys.executable).parent / "coloc-report"), "serve", "--config",
                                   str(cfg)],
                                  stderr=subprocess.PIPE, text=True)
        assert "listening" in server.stderr.readline()
        out = subprocess.run(user, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "[2048]"
        other = ["runuser", "-u", "colocuser2", "--", sys.executable, "-c", code]
        out = subprocess.run(other, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.strip() == "[]", out  # another user's history is not theirs
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
        shutil.rmtree(base, ignore_errors=True)


def test_measured_peaks_of_completed_runs_feed_history(tmp_path, monkeypatch):
    from slurm_coloc.store.db import open_node_db
    from slurm_coloc.store.jobs import JobEnd, JobSubmission, record_ctld_end, record_submission
    from slurm_coloc.store.summaries import JobSummary, record_summary

    script = _config_and_script(tmp_path, monkeypatch)
    sha = parse_script(str(script)).sha256
    db = open_ctld_db(tmp_path / "state" / "ctld.db")
    record_submission(db, JobSubmission(job_id=11, uid=os.getuid(), script_sha256=sha, shards_req=2,
                                        share_mode="shard"))
    record_ctld_end(db, JobEnd(job_id=11, end_ts=time.time(), state="COMPLETED", exit_code=0, signal=0),
                    node_list="n1")
    record_submission(db, JobSubmission(job_id=12, uid=os.getuid(), script_sha256=sha, shards_req=2,
                                        share_mode="shard"))
    record_ctld_end(db, JobEnd(job_id=12, end_ts=time.time(), state="FAILED", exit_code=1, signal=0),
                    node_list="n1")
    node = open_node_db(tmp_path / "state" / "nodes" / "n1.db")
    for job_id, peak in ((11, 3000.0), (12, 9000.0)):  # the failed run's peak must not count
        record_summary(node,
                       JobSummary(job_id, "n1", "0", 1.0, 2.0, peak, None, None, None, None, None, None, 3))
    plan, _, _ = plan_submission([str(script)])
    assert plan.comment["method"] == "history"
    assert 3000 < plan.comment["mem_mib"] < 3300  # 3000 * 1.05 + 64


@pytest.mark.slow
def test_gpu_model_comes_from_the_config_in_both_commands(tmp_path, monkeypatch):
    """coloc-sbatch and coloc-estimate estimate for the GPU model the config names for the job's partition."""
    from click.testing import CliRunner

    from slurm_coloc.cli.estimate import main as estimate_main

    script = _config_and_script(tmp_path, monkeypatch)
    (tmp_path / "coloc.yaml").write_text(f"state_dir: {tmp_path / 'state'}\ngpu_model_by_partition: {{old: "
                                         f"A100}}\n")
    monkeypatch.setenv("COLOC_ESTIMATE_CACHE", "off")
    monkeypatch.delenv("COLOC_GPU_MODEL", raising=False)
    h100, _, _ = plan_submission([str(script)])
    a100, _, _ = plan_submission(["-p", "old", str(script)])
    assert (h100.comment["gpu_model"], a100.comment["gpu_model"]) == ("H100", "A100")
    # the A100's larger CUDA context (estimate/spec.py)
    assert a100.comment["mem_mib"] > h100.comment["mem_mib"]
    assert "on A100" in a100.reason and "on H100" in h100.reason
    with_partition = tmp_path / "p.sh"
    with_partition.write_text(SCRIPT.replace("#COLOC", "#SBATCH -p old\n#COLOC", 1))
    assert plan_submission([str(with_partition)])[0].comment["gpu_model"] == "A100"  # from the #SBATCH line
    runner = CliRunner()
    for extra, gpu, mem_mib in (([], "A100", a100.comment["mem_mib"]),
                                (["--gpu", "h100"], "H100", h100.comment["mem_mib"])):  # --gpu overrides
        out = runner.invoke(estimate_main, ["--script", str(with_partition), "--json", "--no-server", *extra])
        assert out.exit_code == 0, out.output
        result = json.loads(out.output)
        assert (result["gpu"], result["estimate_mib"]) == (gpu, mem_mib)
    out = runner.invoke(estimate_main, ["--script", str(script), "--json", "--no-server"])
    assert json.loads(out.output)["gpu"] == "H100"  # no partition: gpu_model
