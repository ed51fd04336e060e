"""Root running ``coloc-sbatch`` on a user's script never runs that user's code as root (F1), on
the real cluster: root submits for ``colocuser`` with ``--uid`` (``sbatch --uid``, the usual way an admin
submits for a user), and without it on a script the user owns.

Before the fix the script's setup lines and its ``train.py`` ran as uid 0 inside the probe (the marker file
held ``0``); now they run as the user (``probe/sandbox.py``), or not at all without ``--uid``.
"""
from __future__ import annotations

import os
import pwd
import shutil
import time
from pathlib import Path

import pytest

from tests.cluster.reliability.conftest import FaultCluster

pytestmark = pytest.mark.slurm
USER = "colocuser"
TRAIN = """import os
import torch
with open({marks!r}, "a") as fh:
    fh.write(f"train {{os.getuid()}} {{os.getgid()}} {{os.environ.get('HOME')}}\\n")
model = torch.nn.Linear(32, 4).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    loss = model(torch.randn(8, 32, device="cuda")).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
"""


def _job_dir(fc: FaultCluster) -> Path:
    d = fc.c.jobs_dir / f"rootprobe-{os.getpid()}-{time.monotonic_ns()}"
    d.mkdir()
    shutil.chown(d, USER, USER)
    d.chmod(0o755)
    return d


def _user_file(path: Path, text: str) -> Path:
    path.write_text(text)
    shutil.chown(path, USER, USER)
    return path


def _script(d: Path) -> Path:
    marks = d / "marks.txt"
    _user_file(d / "setup.sh", f"echo \"setup $(id -u)\" >> {marks}\n")
    _user_file(d / "train.py", TRAIN.format(marks=str(marks)))
    return _user_file(d / "job.sh", "#!/bin/bash\n#SBATCH --gres=gpu:1\nsource ./setup.sh\n"
                                    "python3 train.py\n")


def _dry_run(fc: FaultCluster, d: Path, *opts: str):
    return fc.c.run(["coloc-sbatch", "--dry-run", "--explain", *opts, "job.sh"], user=None, cwd=d,
                    timeout=300, env={"COLOC_ESTIMATE_CACHE": "off"})


def test_root_with_uid_probes_as_that_user(fc: FaultCluster) -> None:
    d = _job_dir(fc)
    _script(d)
    proc = _dry_run(fc, d, f"--uid={USER}")
    pw = pwd.getpwnam(USER)
    marks = (d / "marks.txt").read_text().split("\n") if (d / "marks.txt").exists() else []
    assert f"setup {pw.pw_uid}" in marks, (marks, proc.stderr)
    assert f"train {pw.pw_uid} {pw.pw_gid} {pw.pw_dir}" in marks, (marks, proc.stderr)
    assert not [m for m in marks if m.split()[1:2] == ["0"]], marks  # nothing ran as root
    assert proc.returncode == 0, proc.stderr
    assert "probe ran `train.py`" in proc.stderr and "2 step(s) of SGD" in proc.stderr, proc.stderr
    assert '"method":"probe"' in proc.stdout and "--gres=shard:" in proc.stdout, proc.stdout


def test_root_without_uid_does_not_probe_a_users_script(fc: FaultCluster) -> None:
    d = _job_dir(fc)
    _script(d)
    proc = _dry_run(fc, d)
    assert not (d / "marks.txt").exists(), (d / "marks.txt").read_text()
    assert proc.returncode == 0, proc.stderr
    assert (f"owned by {USER}, without --uid: the probe does not run another user's code as root"
            in proc.stderr)
