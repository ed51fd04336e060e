"""Scripts the probe cannot probe: one line with the reason, no figure (a whole GPU), nothing written outside
the probe's scratch directory, nothing left running ("Bad input"; the probe's process tree under
``probe/reaper.py``).

Each case is a real probe (this venv's Python and torch, on the CPU). "Nothing left running" is checked in
``/proc``: every process a case starts carries a marker in its command line.
"""
from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path

import pytest

from slurm_coloc.probe import reaper, runner
from slurm_coloc.probe.probe import probe_script

pytestmark = pytest.mark.slow  # real probe/torch/subprocess work: left out of the fast command


def running_with(marker: str) -> list:
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmdline = fh.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if marker in cmdline and "pytest" not in cmdline:
            out.append((int(pid), cmdline))
    return out


def tree(d: Path) -> list:
    return sorted((str(p.relative_to(d)), p.stat().st_mtime_ns) for p in d.rglob("*") if not p.is_symlink())


MARK = "SLEEPSECS"  # replaced by a unique number of seconds: `sleep 300.<n>` is findable in /proc

CASES = {
    "no_python_line": ("#!/bin/bash\n./simulate --gpu\n", None,
                       "no python/torchrun/accelerate command found"),
    "missing_file": ("#!/bin/bash\npython no_such_train.py\n", None, "no_such_train.py does not exist"),
    "syntax_error": ("#!/bin/bash\npython train.py\n", "import torch\ndef broken(:\n    pass\n",
                     "SyntaxError"),
    "needs_the_network": (
        "#!/bin/bash\npython train.py\n",
        "import urllib.request\nurllib.request.urlopen('https://huggingface.co/gpt2/resolve/main/config.json',"
        " timeout=25).read()\n", "URLError"),
    "exits_at_once": ("#!/bin/bash\npython train.py\n", "import sys\nsys.exit(0)\n",
                      "the program ended before its first optimizer step"),
    "exits_with_an_error_code": ("#!/bin/bash\npython train.py\n", "import sys\nsys.exit(3)\n",
                                 "the program exited (code 3) before its first optimizer step"),
    "forks_a_daemon": (
        "#!/bin/bash\npython train.py\n",
        "import os, subprocess, sys, time\n"
        # the parent returns
        "if os.fork():\n    time.sleep(2)\n    print('daemon started')\n    sys.exit(0)\n"
        "os.setsid()\nsubprocess.Popen(['sleep', 'SLEEPSECS'])\ntime.sleep(300)\n",  # the child goes on
        "the program ended before its first optimizer step"),
    "hangs_ignoring_sigterm_with_a_setsid_child": (
        "#!/bin/bash\npython train.py\n",
        "import signal, subprocess, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "subprocess.Popen(['setsid', 'sleep', 'SLEEPSECS'])\nprint('daemon started', flush=True)\n"
        "while True:\n    time.sleep(1)\n",
        "the probe reached its time limit of 60 s"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_one_line_no_figure_nothing_written_nothing_left(case, tmp_path, monkeypatch):
    script, program, expect = CASES[case]
    secs = f"300.{uuid.uuid4().int % 10**9}"
    job = tmp_path / "job"
    job.mkdir()
    (job / "job.sh").write_text(script)
    if program is not None:
        (job / "train.py").write_text(program.replace(MARK, secs))
    scratch_root = tmp_path / "tmp"
    scratch_root.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch_root))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    before = tree(job)
    t0 = time.monotonic()
    # the probe's start-up alone takes 5-30 s on a busy machine
    limit = 60 if case.startswith("hangs") else 120
    r = probe_script(str(job / "job.sh"), submit_dir=str(job), timeout_s=limit, keep_log=True)
    wall = time.monotonic() - t0
    assert r.estimate is None
    assert expect in r.reason and "\n" not in r.reason, r.reason
    assert wall < limit + reaper.REAPER_GRACE_S
    if MARK in (program or ""):
        assert "daemon started" in r.log_text  # the process to be ended was started
    if case == "forks_a_daemon":
        assert any("left 2 process(es) running" in n for n in r.detail["notes"]), r.detail["notes"]
    assert tree(job) == before  # nothing written beside the script
    assert os.listdir(scratch_root) == []  # the scratch directory is gone
    time.sleep(0.2)
    assert running_with(secs) == []


def test_reaper_ends_a_setsid_grandchild_at_the_limit(tmp_path):
    secs = f"300.{uuid.uuid4().int % 10**9}"
    prog = tmp_path / "p.py"
    prog.write_text("import signal, subprocess, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                    f"subprocess.Popen(['setsid', 'sleep', '{secs}'])\ntime.sleep(1000)\n")
    with open(tmp_path / "log", "wb") as log:
        t0 = time.monotonic()
        status = reaper.run_reaped([sys.executable, "-S", str(prog)], str(tmp_path / "s.json"), 2.0,
                                   cwd=str(tmp_path), env=dict(os.environ), stdout=log)
    assert status["timed_out"] and status["subreaper"] and status["killed"] == 2
    assert time.monotonic() - t0 < 2.0 + reaper.REAPER_GRACE_S
    assert running_with(secs) == []


def test_reaper_ends_what_a_normal_end_left_running(tmp_path):
    secs = f"300.{uuid.uuid4().int % 10**9}"
    prog = tmp_path / "p.py"
    prog.write_text("import os, subprocess\n"
                    f"subprocess.Popen(['setsid', 'sleep', '{secs}'])\n"
                    "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                    f"        os.execvp('sleep', ['sleep', '{secs}'])\n    os._exit(0)\n")
    with open(tmp_path / "log", "wb") as log:
        status = reaper.run_reaped([sys.executable, "-S", str(prog)], str(tmp_path / "s.json"), 30.0,
                                   cwd=str(tmp_path), env=dict(os.environ), stdout=log)
    assert status["returncode"] == 0 and not status["timed_out"] and status["left_running"] == 2
    assert running_with(secs) == []


def test_the_default_limit_is_30_s():
    from slurm_coloc.config import Config

    assert runner.DEFAULT_TIMEOUT_S == 30.0 and Config().probe_timeout_s == 30.0


def test_a_crash_just_before_the_limit_reads_as_the_time_limit(tmp_path, monkeypatch):
    """The child's own stack dump, 1.5 s before the limit, can crash it inside torch's frame hooks (SIGSEGV,
    nanoGPT's GPT-2 config on the dev machine): a child killed by a signal that close to the limit ran out of
    time, and says so, rather than "ended (exit -11) without a result"."""
    job = tmp_path / "job"
    job.mkdir()
    (job / "job.sh").write_text("#!/bin/bash\npython train.py\n")
    (job / "train.py").write_text(
        "import os, signal, time\n"
        "time.sleep(max(0.0, float(os.environ['COLOC_TEST_T0']) + 19.2 - time.time()))\n"
        "os.kill(os.getpid(), signal.SIGSEGV)\n")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    monkeypatch.setenv("COLOC_TEST_T0", str(time.time()))
    r = probe_script(str(job / "job.sh"), submit_dir=str(job), timeout_s=20, use_cache=False)
    assert r.estimate is None
    assert r.reason.startswith("the probe reached its time limit of 20 s"), r.reason
