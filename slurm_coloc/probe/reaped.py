"""Running a command under ``reaper.py`` (the probe's process tree, its limits): used by ``runner.py``.

:func:`run_reaped` starts the reaper (our interpreter, ``-I -S``) in a session of its own with the child's
limits (:func:`limits`: address space, no core files, ``RLIMIT_NPROC``), as the caller or as the user root
submits for (``identity.py``); the reaper ends the tree at its time limit (``reaper.py``: CPU time counts on a
busy machine, up to ``max_wall_s``), at more than ``max_procs`` live processes, and when the program ends.
"""
from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
from typing import Any, Dict, List, Optional

from slurm_coloc.probe.identity import RunAs, popen_kwargs, read_child_file

REAPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reaper.py")
REAPER_GRACE_S = 10.0  # the reaper's own sweep, past the limit, before the caller kills its session
NPROC_HEADROOM = 256  # RLIMIT_NPROC: the user's tasks now plus this many (a fork bomb's hard stop; torch's
# thread pools count: the reaper's process cap, MAX_PROBE_PROCESSES, is what a program normally meets)


def _tasks_of(uid: int) -> int:
    """How many tasks (threads too, which ``RLIMIT_NPROC`` counts: man 2 setrlimit) of real uid ``uid`` run
    now (``/proc/*/status``: ``Uid`` and ``Threads``)."""
    n = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as fh:
                fields = dict(line.split(b":", 1) for line in fh if b":" in line)
            if int(fields[b"Uid"].split()[0]) == uid:
                n += int(fields.get(b"Threads", b"1").strip() or 1)
        except (OSError, ValueError, IndexError, KeyError):
            continue
    return n


def limits(mem_limit_mib: int, uid: Optional[int] = None) -> Any:
    """The child's limits: ``RLIMIT_AS``, no core files, and ``RLIMIT_NPROC`` of the uid's tasks now plus
    ``NPROC_HEADROOM``, never above the limit already in force (not enforced for root)."""
    uid = os.getuid() if uid is None else uid
    nproc = _tasks_of(uid) + NPROC_HEADROOM
    for cur in resource.getrlimit(resource.RLIMIT_NPROC):
        if cur != resource.RLIM_INFINITY:
            nproc = min(nproc, cur)

    def apply() -> None:
        b = int(mem_limit_mib) << 20
        resource.setrlimit(resource.RLIMIT_AS, (b, b))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))

    return apply


def run_reaped(argv: List[str], status_path: str, timeout_s: float, cwd: str, env: Dict[str, str],
               stdout: Any, preexec_fn: Any = None, run_as: Optional[RunAs] = None,
               max_wall_s: Optional[float] = None, max_procs: int = 0, dump: bool = False) -> Dict[str, Any]:
    """Run ``argv`` under ``reaper.py`` (our interpreter, as ``run_as`` or the caller) in a session of its
    own.

    At ``timeout_s``, and when ``argv`` ends, the reaper SIGKILLs every descendant, ``setsid`` ones included;
    then the session's process group is killed too (where no subreaper could be set). stdin is ``/dev/null``;
    output goes to the file ``stdout``. ``max_procs``: live processes before the reaper ends them all (0: no
    cap); ``dump``: ask ``argv`` for its stacks before the kill (``reaper.DUMP_SIGNAL``; ``inject/main.py``
    handles it).

    Returns the reaper's status (``returncode``, ``timed_out``, ``left_running``); an unreadable one reads as
    timed out. Never raises for the program.

    Raises:
        OSError: the reaper cannot be started (``subprocess.Popen``).
        KeyboardInterrupt: our own interrupt, after the reaper is stopped.
    """
    max_wall_s = max(timeout_s, max_wall_s or timeout_s)
    opts = ["--max-wall", f"{max_wall_s:g}", "--max-procs", str(int(max_procs))]
    opts += ["--dump"] if dump else []
    proc = subprocess.Popen([sys.executable, "-I", "-S", REAPER, status_path, f"{timeout_s:g}", *opts, "--",
                             *argv],
                            cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stdout,
                            start_new_session=True, preexec_fn=preexec_fn, **popen_kwargs(run_as))
    try:
        proc.wait(timeout=max_wall_s + REAPER_GRACE_S)
    except subprocess.TimeoutExpired:
        _stop(proc)
    except BaseException:  # our own interrupt (Ctrl-C): the reaper sweeps at SIGTERM
        _stop(proc)
        raise
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    try:
        status = json.loads(read_child_file(status_path, run_as).decode("utf-8"))
    except (OSError, ValueError):
        status = {"returncode": proc.returncode, "timed_out": True, "left_running": 0}
    return status if isinstance(status, dict) else {"timed_out": True}


def _stop(proc: "subprocess.Popen[bytes]") -> None:
    proc.terminate()
    try:
        proc.wait(timeout=REAPER_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
