"""The probe cache: keyed on the resolved interpreter and its torch; failures expire; ``refresh`` (--explain).

Real probes (the real torch on the CPU, ~5-15 s each here) in real venvs made with ``python3 -m venv
--without-pip``: one without torch, one that sees this environment's torch through a ``.pth`` file (as a
``pip install torch`` would make it visible).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from slurm_coloc.probe import probe as probe_mod
from slurm_coloc.probe.probe import probe_script

pytestmark = pytest.mark.slow  # real probe/torch/subprocess work: left out of the fast command

TRAIN_PY = """\
import torch
with open("data.txt") as fh:
    width = int(fh.read())
m = torch.nn.Linear(width, width).cuda()
opt = torch.optim.Adam(m.parameters())
for _ in range(3):
    m(torch.randn(8, width, device="cuda")).sum().backward()
    opt.step()
"""


def make_venv(d: Path, with_torch: bool) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(d)], check=True)
    if with_torch:
        install_torch(d)
    return d


def install_torch(venv: Path) -> None:
    site = next(venv.glob("lib/python3*/site-packages"))
    (site / "torch-here.pth").write_text(str(Path(torch.__file__).parent.parent) + "\n")


@pytest.fixture(autouse=True)
def private_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def with_torch(tmp_path_factory) -> Path:
    return make_venv(tmp_path_factory.mktemp("v") / "torchenv", True)


def project(tmp_path: Path, script: str = "#!/bin/bash\n#SBATCH --gres=gpu:1\npython train.py\n") -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "train.py").write_text(TRAIN_PY)
    (tmp_path / "data.txt").write_text("64\n")
    (tmp_path / "job.sh").write_text(script)
    return tmp_path / "job.sh"


def env_with(*bindirs: Path) -> dict:
    return {**os.environ, "PATH": os.pathsep.join([*(str(b) for b in bindirs), "/usr/bin", "/bin"])}


def test_submitted_before_activating_the_venv_then_fixed(tmp_path, with_torch):
    job = project(tmp_path / "p")
    no_torch = make_venv(tmp_path / "plain", False)
    first = probe_script(str(job), submit_dir=str(job.parent), environ=env_with(no_torch / "bin"))
    assert first.estimate is None and "No module named 'torch'" in first.reason
    # the user activates the venv with torch and submits again: a figure, not the cached failure
    second = probe_script(str(job), submit_dir=str(job.parent), environ=env_with(with_torch / "bin"))
    assert not second.cached and second.estimate is not None, second.reason
    assert f"with {with_torch}/bin/python" in second.ran
    third = probe_script(str(job), submit_dir=str(job.parent), environ=env_with(with_torch / "bin"))
    assert third.cached and third.estimate == second.estimate


def test_torch_installed_into_the_same_venv_is_seen(tmp_path):
    venv = make_venv(tmp_path / "venv", False)
    job = project(tmp_path / "p", f"#!/bin/bash\nsource {venv}/bin/activate\npython train.py\n")
    first = probe_script(str(job), submit_dir=str(job.parent))
    assert first.estimate is None and "torch" in first.reason
    install_torch(venv)  # same interpreter, now with torch: its torch version is in the key
    second = probe_script(str(job), submit_dir=str(job.parent))
    assert not second.cached and second.estimate is not None, second.reason
    assert second.detail["job_torch"] == torch.__version__


def test_failures_expire(tmp_path, monkeypatch):
    venv = make_venv(tmp_path / "venv", False)
    job = project(tmp_path / "p")
    env = env_with(venv / "bin")
    first = probe_script(str(job), submit_dir=str(job.parent), environ=env)
    again = probe_script(str(job), submit_dir=str(job.parent), environ=env)
    assert first.estimate is None and again.cached and again.reason == first.reason  # within FAILURE_TTL_S
    monkeypatch.setattr(probe_mod, "FAILURE_TTL_S", 0.0)
    assert not probe_script(str(job), submit_dir=str(job.parent), environ=env).cached


def test_refresh_probes_afresh_and_later_submissions_get_its_figure(tmp_path, with_torch):
    job = project(tmp_path / "p")
    (job.parent / "data.txt").unlink()  # the data is made after the first submission
    env = env_with(with_torch / "bin")
    failed = probe_script(str(job), submit_dir=str(job.parent), environ=env)
    assert failed.estimate is None and failed.reason.startswith("data missing")
    (job.parent / "data.txt").write_text("64\n")
    assert probe_script(str(job), submit_dir=str(job.parent), environ=env).cached  # the failure, for minutes
    fresh = probe_script(str(job), submit_dir=str(job.parent), environ=env, refresh=True)  # --explain
    assert not fresh.cached and fresh.estimate is not None, fresh.reason
    later = probe_script(str(job), submit_dir=str(job.parent), environ=env)
    assert later.cached and later.estimate == fresh.estimate


def test_a_damaged_cached_estimate_is_a_miss(tmp_path, with_torch):
    """An entry whose estimate ``Estimate.from_json`` refuses is probed again, not returned or raised."""
    import json

    job = project(tmp_path / "p")
    env = env_with(with_torch / "bin")
    first = probe_script(str(job), submit_dir=str(job.parent), environ=env)
    assert first.estimate is not None and not first.cached, first.reason
    path = Path(probe_mod._cache_file())
    data = json.loads(path.read_text())
    for entry in data["entries"].values():
        entry["estimate"]["mem_mib"] = "lots"
    path.write_text(json.dumps(data))
    again = probe_script(str(job), submit_dir=str(job.parent), environ=env)
    assert not again.cached and again.estimate == first.estimate
