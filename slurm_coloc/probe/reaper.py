"""Run one command as a child subreaper; at its time limit, and after it ends, end every descendant.

Run by ``runner.py`` with the submitting user's own interpreter (stdlib only)::

    python -I -S reaper.py STATUS_PATH TIMEOUT_S [--max-wall S] [--max-procs N] [--dump] -- ARGV...

Time: ``TIMEOUT_S`` is a budget of CPU time as much as of wall time (a busy login node): past it the program
goes on while its tree still uses ``EXTEND_MIN_RATE`` of a core or more (starved, not stuck) and has used
less than ``TIMEOUT_S`` CPU seconds, up to ``--max-wall``; a program that sleeps (a hang, a barrier that never
completes) ends at ``TIMEOUT_S``. Before that end, with ``--dump``, ``DUMP_SIGNAL`` asks it for its stacks.
More than ``--max-procs`` live descendants (a fork bomb, 64 workers) end the tree at once.

The process marks itself a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``, man 2 prctl), so a descendant
whose parent dies, ``setsid`` or double-forked ones included, is re-parented to it rather than init. When
``ARGV`` ends or the limit (or ``SIGTERM``) comes, it SIGKILLs every process below it (``/proc/*/stat``
parent links, repeated until none is left, reaping each) and writes ``STATUS_PATH`` (JSON): ``returncode``
(``-N`` for signal N, None when killed at the limit), ``timed_out``, ``left_running`` (still running after
``ARGV`` ended), ``too_many_processes``, ``extended``, ``wall_s``, ``cpu_s`` and ``subreaper`` (whether the
prctl took effect; without it orphans escape to init and only the caller's ``killpg`` reaches them). It never
writes to the stdout/stderr it shares with ``ARGV``, except one line when ``ARGV`` cannot be executed.
"""
from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys
import time
from typing import Dict, List, Optional, Tuple

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
POLL_S = 0.02
CHECK_S = 0.5  # how often the process count (and, near the limit, the CPU time) is read
EXTEND_MIN_RATE = 0.05  # a tree using less of a core than this past the wall limit is stuck, not starved
DUMP_SIGNAL = signal.SIGRTMIN + 5  # the program's faulthandler dumps its stacks (inject/main.py)
DUMP_WAIT_S = 1.0
SWEEP_LIMIT_S = 5.0  # how long the final sweep keeps killing (a fork loop) before it gives up


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
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
