"""The packaged TaskProlog shim (prolog_epilog/task_prolog.sh) runs in the job's environment, which the user
fills with ``--export``: it never takes ``COLOC_HOOK`` from there (issue 46, F6), only from the argument a
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
