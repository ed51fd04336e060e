"""The packaged TaskProlog shim (prolog_epilog/task_prolog.sh) runs in the job's environment, which the user
fills with ``--export``: it never takes ``COLOC_HOOK`` from there (F6), only from the argument a
site's wrapper passes (``--hook=/abs/path``; Slurm passes the TaskProlog none)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHIM = REPO / "prolog_epilog" / "task_prolog.sh"


def _program(path: Path, marker: Path, line: str) -> Path:
    path.write_text(f"#!/bin/sh\necho ran > {marker}\necho '{line}'\n")
    path.chmod(0o755)
    return path


def test_task_prolog_ignores_coloc_hook_from_the_jobs_environment(tmp_path: Path) -> None:
    marker = tmp_path / "user-program-ran"
    evil = _program(tmp_path / "my-hook", marker, "export CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=80G")
    env = {"PATH": "/usr/bin:/bin", "COLOC_HOOK": str(evil), "SLURM_JOB_ID": "7", "COLOC_HOOK_TIMEOUT_S": "5"}
    out = subprocess.run(["/bin/sh", str(SHIM)], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0
    assert not marker.exists() and "80G" not in out.stdout, out.stdout


def test_task_prolog_takes_the_hook_a_site_wrapper_names(tmp_path: Path) -> None:
    marker = tmp_path / "site-hook-ran"
    site = _program(tmp_path / "site-hook", marker, "export COLOC_FROM_SITE=1")
    wrapper = tmp_path / "task_prolog.sh"
    wrapper.write_text(f"#!/bin/sh\nexec {SHIM} --hook={site} \"$@\"\n")
    wrapper.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "COLOC_HOOK": "/bin/false", "SLURM_JOB_ID": "7"}
    out = subprocess.run([str(wrapper)], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and marker.exists()
    assert out.stdout.strip() == "export COLOC_FROM_SITE=1"


def test_the_other_hooks_still_take_coloc_hook(tmp_path: Path) -> None:
    """Prolog/Epilog run in slurmd's environment (root's): COLOC_HOOK there is the site's own setting."""
    marker = tmp_path / "hook-ran"
    hook = _program(tmp_path / "hook", marker, "")
    env = {**{k: v for k, v in os.environ.items() if k == "PATH"}, "COLOC_HOOK": str(hook),
           "COLOC_PENDING_DIR": str(tmp_path / "pending"), "SLURM_JOB_ID": "7"}
    out = subprocess.run(["/bin/sh", str(REPO / "prolog_epilog" / "prolog.sh")], env=env, timeout=30)
    assert out.returncode == 0 and marker.exists()


#: What a root hook never loads: the report pipeline's judgement and rendering. The node Epilog's
#: AdminComment facts come from ``report/facts.py`` (``store/`` reads only).
REPORT_PIPELINE = tuple(f"slurm_coloc.report.{m}" for m in ("findings", "diagnose", "summarize", "usage",
                                                              "render", "views", "query"))

_EPILOG = r"""
import json, sys, time
from slurm_coloc import config as config_mod
from slurm_coloc.hooks import node
from slurm_coloc.hooks.context import HookContext
from slurm_coloc.store import jobs as store_jobs, summaries
from slurm_coloc.store.db import open_ctld_db, open_node_db

cfg = config_mod.load(sys.argv[1], environ={})
t0 = time.time() - 600
store_jobs.record_submission(open_ctld_db(cfg.ctld_db_path), store_jobs.JobSubmission(
    job_id=7, user_name="alice", job_name="j7", shards_req=4, share_mode="shard", estimate_mib=3000,
    estimate_method="analytic", submit_ts=t0 - 1))
db = open_node_db(cfg.node_db_path("n1"))
store_jobs.record_node_start(db, store_jobs.JobStart(7, "n1", "alice", 2001, "0", 4, "gres:shard:4", t0))
summaries.record_summary(db, summaries.JobSummary(7, "n1", "0", t0, t0 + 600, 2500.0, 50.0, 40.0, 60.0, 30.0,
                                                  45.0, 1000.0, 600))
assert not [m for m in sys.modules if m.startswith("slurm_coloc.report.")], "loaded before the Epilog"
env = {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1", "SLURM_JOB_UID": "2001", "SLURM_JOB_EXIT_CODE": "0"}
detail = node.epilog(HookContext.from_env(env), cfg, env)
print(json.dumps({"detail": detail, "loaded": sorted(m for m in sys.modules if m.startswith("slurm_coloc."))},
                 default=str))
"""


def test_the_node_epilog_records_facts_without_the_report_pipeline(tmp_path: Path) -> None:
    """The node Epilog (root) in a fresh interpreter: it stores the job's AdminComment facts (peak, SM
    activity) and loads no module of the report pipeline (findings, diagnosis, usage, rendering)."""
    import json
    import sys

    from slurm_coloc import config as config_mod
    from slurm_coloc.store import summaries
    from slurm_coloc.store.db import open_readonly

    cfg_path = tmp_path / "coloc.yaml"
    cfg_path.write_text(f"state_dir: {tmp_path / 'state'}\nrun_dir: {tmp_path / 'run'}\n"
                        f"slurm_bin_dir: {tmp_path / 'no-slurm'}\nhook_timeout_s: 20\n")
    out = subprocess.run([sys.executable, "-c", _EPILOG, str(cfg_path)], capture_output=True, text=True,
                         timeout=60, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert "ms" in got["detail"]["figures"] and got["detail"]["state"] == "COMPLETED", got["detail"]
    assert not sorted(set(REPORT_PIPELINE) & set(got["loaded"])), got["loaded"]
    cfg = config_mod.load(str(cfg_path), environ={})
    stored = summaries.load_figures(open_readonly(cfg.node_db_path("n1")), 7)
    assert stored is not None
    assert {k: stored[1]["summary"].get(k) for k in ("peak_mib", "smact", "req_mib", "measured", "finding")} \
        == {"peak_mib": 2500, "smact": 50.0, "req_mib": 4096, "measured": True, "finding": None}
