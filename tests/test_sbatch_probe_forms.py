"""``coloc-sbatch --dry-run`` with the real probe (this venv's torch on the CPU; no Slurm needed for a dry
run): ``--wrap "python train.py"`` is probed, and ``--explain`` refreshes the cached answer for later
submissions."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_coloc.comment import parse_comment
from tests.test_probe_cache import TRAIN_PY  # the same small trainer the cache stories probe

pytestmark = pytest.mark.slow  # real probe/torch/subprocess work: left out of the fast command


def _env(tmp_path: Path) -> dict:
    cfg = tmp_path / "coloc.yaml"
    cfg.write_text(f"state_dir: {tmp_path / 'state'}\n")
    return {**os.environ, "COLOC_CONFIG": str(cfg), "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def _sbatch(d: Path, env: dict, *argv: str) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "slurm_coloc", "sbatch", "--dry-run", *argv], cwd=d, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return out


def _comment(out: subprocess.CompletedProcess) -> dict:
    return parse_comment(next(w for w in shlex.split(out.stdout) if w.startswith("--comment=")))


def test_wrap_is_probed(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN_PY)
    (tmp_path / "data.txt").write_text("256\n")
    out = _sbatch(tmp_path, _env(tmp_path), "--wrap", "python train.py")
    assert "probe ran `train.py` with" in out.stderr and "step(s) of Adam" in out.stderr
    assert _comment(out)["method"] == "probe" and "--gres=shard:" in out.stdout
    bad = _sbatch(tmp_path, _env(tmp_path), "--wrap", "python missing.py")
    assert "missing.py does not exist" in bad.stderr and _comment(bad)["mode"] == "whole-gpu"


def test_explain_refreshes_the_cached_answer(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN_PY)
    (tmp_path / "job.sh").write_text("#!/bin/bash\n#SBATCH --gres=gpu:1\npython train.py\n")
    env = _env(tmp_path)
    first = _sbatch(tmp_path, env, "job.sh")  # the data is not there yet
    assert "no figure: data missing" in first.stderr and _comment(first)["mode"] == "whole-gpu"
    (tmp_path / "data.txt").write_text("256\n")
    stale = _sbatch(tmp_path, env, "job.sh")
    assert "(cached); no figure: data missing" in stale.stderr
    explained = _sbatch(tmp_path, env, "--explain", "job.sh")
    assert _comment(explained)["method"] == "probe"
    later = _sbatch(tmp_path, env, "job.sh")
    assert "(cached)" in later.stderr and "no figure" not in later.stderr
    assert _comment(later)["mem_mib"] == _comment(explained)["mem_mib"]
