"""Programs that fork without end, start 64 workers, or wait on a barrier that never completes ("Bad
input"): the probe ends within its limit, leaves no process behind, and gives no figure (the job gets a whole
GPU) with the reason in one line.

Real probes (this venv's Python and torch on the CPU). Run as root (as the suite is), the probe runs the
program as ``colocuser`` (``--uid``, ``probe/sandbox.py``), so the fork bomb meets the probe's
``RLIMIT_NPROC`` (root is exempt from it) as well as the reaper's process cap; as another user it runs as that
user. "Nothing left running" is checked in ``/proc``: every process of a case has the case's own scratch
directory in its command line (the bootstrap's argument), or the case's marker.
"""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Iterator, Optional, Tuple

import pytest

from slurm_coloc.probe import reaper, runner
from slurm_coloc.probe.probe import probe_script
from tests.reliability.test_probe_bad_input import running_with

pytestmark = pytest.mark.slow  # real probe/torch/subprocess work: left out of the fast command

USER = "colocuser"
LIMIT_S = 30.0
CASES = {
    "fork_bomb": (
        "import os, time\n"
        "while True:\n"
        "    try:\n        os.fork()\n"
        "    except OSError:\n        time.sleep(0.01)\n",
        f"the program started more than {runner.MAX_PROBE_PROCESSES} processes"),
    "spawns_64_workers": (
        "import multiprocessing as mp, time\n"
        "def work(i):\n    time.sleep(MARK)\n"
        "if __name__ == '__main__':\n"
        "    procs = [mp.Process(target=work, args=(i,)) for i in range(64)]\n"
        "    for p in procs:\n        p.start()\n"
        "    for p in procs:\n        p.join()\n",
        f"the program started more than {runner.MAX_PROBE_PROCESSES} processes"),
    "barrier_never_completes": (
        "import threading, torch, subprocess\n"
        "subprocess.Popen(['sleep', 'MARK'])\n"
        "model = torch.nn.Linear(8, 8).cuda()\n"
        "threading.Barrier(2).wait()   # the other party never comes\n",
        "the probe reached its time limit of 30 s before the first optimizer step (stuck at train.py:4"),
}


def _as_user() -> Optional[str]:
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "-m", "-u", "2001", "-s", "/bin/bash", USER], check=False)
    return USER


@pytest.fixture
def case_dir() -> Iterator[Tuple[Path, Path]]:
    """A job directory and a scratch root under /tmp that the job's user can reach (pytest's tmp is 0700)."""
    base = Path(tempfile.mkdtemp(prefix="coloc-badproc-"))
    base.chmod(0o755)
    job, scratch = base / "job", base / "scratch"
    job.mkdir()
    scratch.mkdir()
    user = _as_user()
    if user:
        shutil.chown(job, user, user)
    try:
        yield job, scratch
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("case", sorted(CASES))
def test_process_abuse_ends_within_the_limit_leaving_nothing(case, case_dir, monkeypatch):
    job, scratch = case_dir
    program, expect = CASES[case]
    secs = f"300.{uuid.uuid4().int % 10**9}"
    (job / "job.sh").write_text("#!/bin/bash\n#SBATCH --gres=gpu:1\npython train.py\n")
    (job / "train.py").write_text(program.replace("MARK", secs))
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setenv("XDG_CACHE_HOME", str(scratch.parent / "cache"))
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    t0 = time.monotonic()
    r = probe_script(str(job / "job.sh"), submit_dir=str(job), timeout_s=LIMIT_S, keep_log=True,
                     use_cache=False, uid_option=_as_user())
    wall = time.monotonic() - t0
    assert r.estimate is None
    assert r.reason.startswith(expect) and "\n" not in r.reason, (r.reason, r.log_text[-1500:])
    # the limit (the probe's start-up included), plus the reaper's grace; a fork bomb ends in seconds
    assert wall < LIMIT_S + reaper.REAPER_GRACE_S, wall
    if case != "barrier_never_completes":
        assert wall < LIMIT_S, wall
    time.sleep(0.3)
    assert running_with(str(scratch)) == [] and running_with(secs) == []
    assert os.listdir(scratch) == []


DUTY = ("import time\nwhile True:\n    end = time.monotonic() + {busy}\n    while time.monotonic() < end:\n"
        "        pass\n    time.sleep({idle})\n")


@pytest.mark.parametrize("kind, program, extended", [  # extended: runs on to --max-wall
    ("stuck (sleeps)", "import time\ntime.sleep(60)\n", False),
    ("starved (a third of a core, as on a busy node)", DUTY.format(busy=0.1, idle=0.2), True),
    ("busy (a whole core)", DUTY.format(busy=10, idle=0), False),
])
def test_the_limit_counts_cpu_time_on_a_busy_machine(kind, program, extended, tmp_path):
    """The reaper's limit (a busy login node): a program making slow progress past the wall limit
    goes on, up to --max-wall, while under its CPU budget; a sleeping one ends at the wall limit; one that
    used its CPU budget ends then."""
    prog = tmp_path / "p.py"
    prog.write_text(program)
    with open(tmp_path / "log", "wb") as log:
        t0 = time.monotonic()
        status = reaper.run_reaped([sys.executable, "-S", str(prog)], str(tmp_path / "s.json"), 2.0,
                                   cwd=str(tmp_path), env=dict(os.environ), stdout=log, max_wall_s=5.0)
        wall = time.monotonic() - t0
    assert status["timed_out"], status
    if extended:  # went on to --max-wall, under its CPU budget
        assert status["extended"] and status["cpu_s"] < 2.0, status
        assert 4.5 < wall < 5.0 + reaper.REAPER_GRACE_S, wall
    elif "stuck" in kind:  # the limit, the dump's wait, the sweep
        assert not status["extended"] and wall < 2.0 + 2.5, (wall, status)
    else:  # busy: its CPU budget used (alone), or starved by other work on this machine up to --max-wall
        assert status["cpu_s"] >= 1.9 or (status["extended"] and wall >= 4.5), (wall, status)
        assert wall < 5.0 + reaper.REAPER_GRACE_S


def test_a_user_with_many_threads_still_gets_a_figure(case_dir, monkeypatch):
    """``RLIMIT_NPROC`` counts every task of the user, threads included: a user whose other programs hold 300
    threads is still probed (the probe's own threads fit under its limit)."""
    job, scratch = case_dir
    user = _as_user()
    holder_cmd = [sys.executable, "-c", "import threading, time\nfor _ in range(300):\n"
                  "    threading.Thread(target=time.sleep, args=(120,), daemon=True).start()\n"
                  "print('ready', flush=True)\ntime.sleep(120)\n"]
    holder = subprocess.Popen((["runuser", "-u", user, "--"] if user else []) + holder_cmd,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        (job / "job.sh").write_text("#!/bin/bash\n#SBATCH --gres=gpu:1\npython train.py\n")
        (job / "train.py").write_text(
            "import torch\nm = torch.nn.Linear(256, 256).cuda()\nopt = torch.optim.Adam(m.parameters())\n"
            "for _ in range(3):\n    m(torch.randn(8, 256).cuda()).sum().backward()\n    opt.step()\n")
        monkeypatch.setenv("TMPDIR", str(scratch))
        monkeypatch.setenv("XDG_CACHE_HOME", str(scratch.parent / "cache"))
        monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
        r = probe_script(str(job / "job.sh"), submit_dir=str(job), timeout_s=LIMIT_S, keep_log=True,
                         use_cache=False, uid_option=user)
        assert r.estimate is not None, (r.reason, r.log_text[-1500:])
    finally:
        holder.kill()
        holder.wait()
