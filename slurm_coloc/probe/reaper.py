"""The probe's process tree: a child subreaper that ends every descendant, and :func:`run_reaped`, its caller.

Run as a script with our interpreter (stdlib only: no ``slurm_coloc`` import at module level)::

    python -I -S reaper.py STATUS_PATH TIMEOUT_S [--max-wall S] [--max-procs N] [--dump] -- ARGV...

``TIMEOUT_S`` is a budget of CPU time as much as of wall time (a busy login node): past it the program goes
on while its tree uses ``EXTEND_MIN_RATE`` of a core or more and has used less than ``TIMEOUT_S`` CPU
seconds, up to ``--max-wall``; a sleeping program (a hang, a barrier) ends at ``TIMEOUT_S``, with
``--dump`` after ``DUMP_SIGNAL`` asked it for its stacks. More than ``--max-procs`` live descendants end the
tree at once. As a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``, man 2 prctl) it inherits orphans,
``setsid`` and double-forked ones included; when ``ARGV`` ends or the limit (or ``SIGTERM``) comes it
SIGKILLs every process below it (``/proc/*/stat`` parent links, until none is left) and writes
``STATUS_PATH`` (JSON): ``returncode`` (``-N`` for signal N, None when killed at the limit), ``timed_out``,
``left_running``, ``too_many_processes``, ``extended``, ``wall_s``, ``cpu_s``, ``subreaper``. It writes to
the output it shares with ``ARGV`` only when ``ARGV`` cannot be executed.

:func:`run_reaped` (``runner.py``) starts it in a session of its own with the child's :func:`limits`
(address space, no core files, ``RLIMIT_NPROC``), as the caller or the user root submits for
(``sandbox.py``).
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
import time
from typing import IO, TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    from slurm_coloc.probe.sandbox import RunAs

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
POLL_S = 0.02
CHECK_S = 0.5  # how often the process count (and, near the limit, the CPU time) is read
EXTEND_MIN_RATE = 0.05  # a tree using less of a core than this past the wall limit is stuck, not starved
DUMP_SIGNAL = signal.SIGRTMIN + 5  # the program's faulthandler dumps its stacks (inject/main.py)
DUMP_WAIT_S = 1.0
SWEEP_LIMIT_S = 5.0  # how long the final sweep keeps killing (a fork loop) before it gives up
REAPER_GRACE_S = 10.0  # the reaper's own sweep, past the limit, before the caller kills its session
NPROC_HEADROOM = 256  # RLIMIT_NPROC: the user's tasks now plus this many (a fork bomb's hard stop; torch's
# thread pools count: the reaper's process cap, MAX_PROBE_PROCESSES, is what a program normally meets)


def set_subreaper() -> bool:
    """Mark this process a child subreaper; False where the kernel or libc does not offer it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def descendants(root: int) -> Dict[int, bool]:
    """``pid -> is a zombie`` for every process below ``root`` (excluded); vanishing ones skipped."""
    children: Dict[int, List[int]] = {}
    zombie: Dict[int, bool] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2:].split()  # after "pid (comm) ": state ppid ...
        if len(fields) < 2:
            continue
        pid = int(name)
        children.setdefault(int(fields[1]), []).append(pid)
        zombie[pid] = fields[0] == b"Z"
    out: Dict[int, bool] = {}
    todo = [root]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out[c] = zombie[c]
                todo.append(c)
    return out


def _reap(main_pid: int, status: List[Optional[int]]) -> None:
    """Collect every ended child; ``status[0]`` gets ``main_pid``'s exit status."""
    while True:
        try:
            pid, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid == main_pid:
            status[0] = os.waitstatus_to_exitcode(st)


def _dump_stacks(pid: int) -> None:
    """Ask the program (``pid``) to print its threads' stacks (``DUMP_SIGNAL``, registered with faulthandler
    by ``inject/main.py``) and give it ``DUMP_WAIT_S`` to do so: the log then says where it was stuck."""
    try:
        os.kill(pid, DUMP_SIGNAL)
    except OSError:
        return
    time.sleep(DUMP_WAIT_S)


def kill_all(main_pid: int, status: List[Optional[int]]) -> int:
    """SIGKILL every descendant until none is left (or ``SWEEP_LIMIT_S``); return how many were alive.

    ``status[0]`` gets ``main_pid``'s exit status if it is reaped here.
    """
    me = os.getpid()
    seen = set()
    end = time.monotonic() + SWEEP_LIMIT_S
    while time.monotonic() < end:
        procs = descendants(me)
        live = [p for p, z in procs.items() if not z]
        if not procs:
            break
        for pid in live:
            seen.add(pid)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        _reap(main_pid, status)
        time.sleep(0.005 if live else POLL_S)
    return len(seen)


def tree_cpu_s(root: int) -> float:
    """CPU seconds (user + system) of every live process below ``root`` and the children it reaped."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0
    for pid in descendants(root):
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2:].split()
        if len(fields) > 12:
            total += int(fields[11]) + int(fields[12])  # utime, stime (man 5 proc: fields 14, 15)
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return total / float(tick) + ru.ru_utime + ru.ru_stime


def _options(argv: List[str]) -> Tuple[float, float, int, bool, List[str]]:
    """``STATUS_PATH TIMEOUT_S [--max-wall S] [--max-procs N] [--dump] -- ARGV``: (timeout, max wall, max
    processes, dump, ARGV)."""
    timeout_s = float(argv[1])
    max_wall, max_procs, dump = timeout_s, 0, False
    i = 2
    while i < len(argv) and argv[i] != "--":
        if argv[i] == "--dump":
            dump = True
            i += 1
            continue
        if argv[i] == "--max-wall":
            max_wall = max(timeout_s, float(argv[i + 1]))
        elif argv[i] == "--max-procs":
            max_procs = int(argv[i + 1])
        i += 2
    return timeout_s, max_wall, max_procs, dump, argv[i + 1:]


def _still_progressing(me: int, cpu: List[float], now: float, timeout_s: float) -> bool:
    """Past the wall limit: whether the tree is starved rather than stuck (``EXTEND_MIN_RATE`` of a core or
    more over the last sample) and below its CPU budget of ``timeout_s`` seconds. ``cpu`` holds the last
    sample ``[seconds, time]`` and is updated."""
    used = tree_cpu_s(me)
    rate = (used - cpu[0]) / max(1e-3, now - cpu[1])
    cpu[0], cpu[1] = used, now
    return used < timeout_s and rate >= EXTEND_MIN_RATE


def main(argv: List[str]) -> int:
    """Run ``argv`` (the module docstring's usage); 0: the status file holds the outcome."""
    status_path = argv[0]
    timeout_s, max_wall, max_procs, dump, argv = _options(argv)
    sub = set_subreaper()
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    status: List[Optional[int]] = [None]
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            os.execvp(argv[0], argv)
        except OSError as exc:
            os.write(2, f"cannot run {argv[0]}: {exc}\n".encode())
        os._exit(127)
    start = time.monotonic()
    deadline, hard = start + timeout_s, start + max_wall
    next_check, too_many, extended = start + CHECK_S, 0, False
    cpu = [0.0, start]
    while status[0] is None and not stop[0]:
        time.sleep(POLL_S)
        _reap(pid, status)
        now = time.monotonic()
        if now < next_check:
            continue
        next_check = now + CHECK_S
        if max_procs:
            live = sum(1 for z in descendants(os.getpid()).values() if not z)
            if live > max_procs:
                too_many = live
                break
        if now >= deadline - 2 * CHECK_S and now < deadline:
            cpu[:] = [tree_cpu_s(os.getpid()), now]
        elif now >= deadline:
            if now >= hard or not _still_progressing(os.getpid(), cpu, now, timeout_s):
                break
            extended = True
    timed_out = status[0] is None and not too_many
    if timed_out and dump:
        _dump_stacks(pid)
    left = kill_all(pid, status)
    out = {"returncode": None if timed_out or too_many else status[0], "timed_out": timed_out,
           "left_running": 0 if timed_out or too_many else left, "killed": left, "subreaper": sub,
           "too_many_processes": too_many, "extended": extended,
           "wall_s": round(time.monotonic() - start, 2), "cpu_s": round(tree_cpu_s(os.getpid()), 2)}
    with open(status_path, "w", encoding="utf-8") as fh:
        json.dump(out, fh)
    return 0


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


def limits(mem_limit_mib: int, uid: Optional[int] = None) -> Callable[[], None]:
    """The child's limits (a ``preexec_fn``): ``RLIMIT_AS``, no core files, and ``RLIMIT_NPROC`` of the uid's
    tasks now plus ``NPROC_HEADROOM``, never above the limit already in force (not enforced for root)."""
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
               stdout: IO[bytes], preexec_fn: Optional[Callable[[], None]] = None,
               run_as: Optional[RunAs] = None, max_wall_s: Optional[float] = None, max_procs: int = 0,
               dump: bool = False) -> Dict[str, Any]:
    """Run ``argv`` under this script (as ``run_as`` or the caller) in a session of its own; its status.

    stdin is ``/dev/null``, output goes to ``stdout``; after the reaper the session's process group is killed
    too (where no subreaper could be set). ``max_procs``: the ``--max-procs`` cap (0: none). An unreadable
    status reads as timed out; never raises for the program.

    Raises:
        OSError: the reaper cannot be started (``subprocess.Popen``).
        KeyboardInterrupt: our own interrupt, after the reaper is stopped.
    """
    from slurm_coloc.probe.sandbox import read_child_file  # not at module level: the script is stdlib only

    max_wall_s = max(timeout_s, max_wall_s or timeout_s)
    opts = ["--max-wall", f"{max_wall_s:g}", "--max-procs", str(int(max_procs))]
    opts += ["--dump"] if dump else []
    proc = subprocess.Popen([sys.executable, "-I", "-S", os.path.abspath(__file__), status_path,
                             f"{timeout_s:g}", *opts, "--", *argv],
                            cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stdout,
                            start_new_session=True, preexec_fn=preexec_fn,
                            **(run_as.popen_kwargs() if run_as is not None else {}))
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
