"""coloc-sbatch asks for more after an OOM of the same script (history from the controller DB)."""
from __future__ import annotations

import json
import time

from slurm_coloc.cli.sbatch import plan_submission
from slurm_coloc.store.db import open_ctld_db
from slurm_coloc.store.oom import OomRecord, claim_retry
from slurm_coloc.submit.directives import parse_script

SCRIPT = "#!/bin/sh\n#COLOC model=torch.nn:Linear kwarg.in_features=64 kwarg.out_features=8 input=64 batch=4\ntrue\n"


def test_oom_fence_raises_next_request(tmp_path, monkeypatch):
    cfg_file = tmp_path / "coloc.yaml"
    cfg_file.write_text(f"state_dir: {tmp_path / 'state'}\n")
    monkeypatch.setenv("COLOC_CONFIG", str(cfg_file))
    script = tmp_path / "job.sh"
    script.write_text(SCRIPT)
    before, _, _ = plan_submission([str(script)])
    assert before.mode == "shard" and before.comment["method"] != "history"
    fence = before.shards * 1024
    db = open_ctld_db(tmp_path / "state" / "ctld.db")
    sha = parse_script(str(script)).sha256
    assert claim_retry(db, OomRecord(job_id=7, ts=time.time(), script_sha256=sha, shards=before.shards,
                                     fence_mib=fence, retry_status="submitted"))
    after, _, _ = plan_submission([str(script)])
    assert after.comment["method"] == "history"
    assert after.comment["mem_mib"] > fence and after.shards > before.shards
    other = tmp_path / "other.sh"
    other.write_text(SCRIPT + "# a different script\n")
    assert plan_submission([str(other)])[0].comment["method"] != "history"
    json.dumps(after.comment)
