"""Run one command as a child subreaper; at its time limit, and after it ends, end every descendant.

Usage (stdlib only, run by ``runner.py`` with the submitting user's own interpreter as
``python -I -S reaper.py STATUS_PATH TIMEOUT_S -- ARGV...``)::

    reaper.py STATUS_PATH TIMEOUT_S -- ARGV...

The process marks itself a child subreaper (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``, man 2 prctl), so
a descendant whose parent dies, a ``setsid`` or double-forked daemon included, is re-parented to it
rather than to init and stays findable. It starts ``ARGV`` and waits up to ``TIMEOUT_S`` seconds (or
until it gets ``SIGTERM``); then, and also when ``ARGV`` ended by itself, it sends ``SIGKILL`` to every
process below it (found through ``/proc/*/stat`` parent links, repeated until none is left, reaping
each) and writes ``STATUS_PATH`` (JSON): ``returncode`` (``ARGV``'s exit status, ``-N`` for signal N,
None when it was killed at the limit), ``timed_out``, ``left_running`` (processes still running after
``ARGV`` ended, all killed) and ``subreaper`` (whether the prctl took effect; without it, orphans
escape to init and only the caller's ``killpg`` of the session reaches them). It never writes to its
stdout or stderr, which it shares with ``ARGV``, except one line when ``ARGV`` cannot be executed.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time
from typing import Dict, List, Optional

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
POLL_S = 0.02
SWEEP_LIMIT_S = 5.0  # how long the final sweep keeps killing (a fork loop) before it gives up


def set_subreaper() -> bool:
    """Mark this process a child subreaper; False where the kernel or libc does not offer it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def descendants(root: int) -> Dict[int, bool]:
    """``pid -> is a zombie`` for every process below ``root`` (from ``/proc/*/stat`` parent links).

    Args:
        root: the process id whose descendants are listed (itself excluded).

    Returns:
        Process id -> True for a zombie; processes that end while ``/proc`` is read are skipped.
    """
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


def kill_all(main_pid: int, status: List[Optional[int]]) -> int:
    """SIGKILL every descendant until none is left (or ``SWEEP_LIMIT_S``); returns how many were alive.

    Args:
        main_pid: the process ``ARGV`` runs as (its exit status is collected when reaped).
        status: one-element list; ``status[0]`` gets ``main_pid``'s exit status if it is reaped here.

    Returns:
        The number of distinct live processes killed.
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


def main(argv: List[str]) -> int:
    """Run ``argv`` as the module docstring says; returns 0 (the status file holds the outcome).

    Args:
        argv: ``[STATUS_PATH, TIMEOUT_S, "--", ARGV...]`` (``TIMEOUT_S`` in s).
    """
    status_path, timeout_s, argv = argv[0], float(argv[1]), argv[3:]
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
    deadline = time.monotonic() + timeout_s
    while status[0] is None and not stop[0] and time.monotonic() < deadline:
        time.sleep(POLL_S)
        _reap(pid, status)
    timed_out = status[0] is None
    left = kill_all(pid, status)
    out = {"returncode": None if timed_out else status[0], "timed_out": timed_out,
           "left_running": 0 if timed_out else left, "killed": left, "subreaper": sub}
    with open(status_path, "w", encoding="utf-8") as fh:
        json.dump(out, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
