"""Reading the tail of a job's output file, and appending a line to it, as the job's user, from a root hook.

A root hook that opens a path a user chose can be made to read (or write) any file on the host: the user
replaces the file, or a directory on its path, with a symlink. Here the open happens in a forked child that
has dropped to the job's uid/gid (``os.setgroups([])``, ``os.setgid``, ``os.setuid``), so every directory on
the path is checked with the user's own permissions, and:

- the last component is opened with ``O_NOFOLLOW`` (a planted symlink fails with ``ELOOP``), ``O_NONBLOCK``
  (a planted FIFO cannot block us) and ``O_NOCTTY``;
- the opened file must be a regular file owned by the job's uid (a symlinked *directory* leading to someone
  else's file is refused);
- at most ``max_bytes`` are read, from the end; the child is killed after ``timeout_s`` (hung NFS).

Nothing read is executed or imported; callers only match text against fixed patterns.
"""
from __future__ import annotations

import errno
import os
import select
import signal
import stat
import time
from dataclasses import dataclass
from typing import Callable, NoReturn, Optional

MAX_TAIL_BYTES = 64 * 1024


@dataclass(frozen=True)
class TailResult:
    """The last bytes of a file, or why it could not be read. ``text`` is ``""`` when ``error`` is set."""

    path: str
    text: str
    error: Optional[str] = None
    size_bytes: Optional[int] = None


def _open_checked(path: str, uid: int, flags: int) -> int:
    """In the child: open ``path`` without following a final symlink; a regular file owned by ``uid``."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PermissionError("is a symbolic link (not followed)") from None
        raise PermissionError(os.strerror(exc.errno or 0).lower()) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise PermissionError("not a regular file")
    if st.st_uid != uid:
        os.close(fd)
        raise PermissionError(f"owned by uid {st.st_uid}, not the job's uid {uid}")
    return fd


def _as_user(uid: int, gid: int, work: Callable[[], bytes], timeout_s: float, limit_bytes: int) -> bytes:
    """``work()`` in a child running as ``uid``/``gid`` (never 0). PermissionError: the child could not drop
    privileges or ``work`` failed; TimeoutError: not done in ``timeout_s``."""
    if uid == 0 or gid == 0:
        raise PermissionError("refusing to act as root for a job file")
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns
        _child_as_user(rfd, wfd, uid, gid, work)
    os.close(wfd)
    try:
        out = _read_reply(rfd, timeout_s, limit_bytes)
    finally:
        os.close(rfd)
        try:
            if os.waitpid(pid, os.WNOHANG) == (0, 0):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    if out[:1] != b"O":
        raise PermissionError(out[1:].decode("utf-8", "replace") or "child failed")
    return out[1:]


def _child_as_user(rfd: int, wfd: int, uid: int, gid: int, work: Callable[[], bytes]) -> NoReturn:
    """The child of ``_as_user``: drop to ``uid``/``gid`` (no supplementary groups), run ``work`` and write
    ``O`` + its bytes, or ``E`` + the error (at most 500 bytes), to ``wfd``; then exit."""
    code = 1
    try:
        os.close(rfd)
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        if os.getuid() != uid or os.geteuid() != uid:
            raise PermissionError("could not drop privileges")
        payload = b"O" + work()
        code = 0
    except BaseException as exc:  # report anything to the parent, then exit
        payload = b"E" + str(exc).encode("utf-8", "replace")[:500]
    try:
        view = memoryview(payload)
        while view:
            view = view[os.write(wfd, view):]
    finally:
        os._exit(code)


def _read_reply(rfd: int, timeout_s: float, limit_bytes: int) -> bytes:
    """Everything the child writes to ``rfd`` until it closes it. TimeoutError: not done within ``timeout_s``;
    PermissionError: more than ``limit_bytes`` (plus the error's room) came."""
    chunks, total = [], 0
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"gave up after {timeout_s:g} s")
        ready, _, _ = select.select([rfd], [], [], left)
        if not ready:
            continue
        data = os.read(rfd, 65536)
        if not data:
            break
        total += len(data)
        if total > limit_bytes + 600:
            raise PermissionError("child sent more than asked")
        chunks.append(data)
    return b"".join(chunks)


def read_tail_as_user(path: str, uid: int, gid: int, max_bytes: int = MAX_TAIL_BYTES,
                      timeout_s: float = 5.0) -> TailResult:
    """The last ``max_bytes`` of absolute ``path`` read as the job's ``uid``/``gid`` within ``timeout_s``,
    decoded as UTF-8 with replacement; never raises (an unreadable file is an ``error`` string)."""
    if not path or not os.path.isabs(path) or "\0" in path:
        return TailResult(path, "", "not an absolute path")

    def work() -> bytes:
        fd = _open_checked(path, uid, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            os.lseek(fd, max(0, size - max_bytes), os.SEEK_SET)
            buf = b""
            while len(buf) < max_bytes:
                data = os.read(fd, max_bytes - len(buf))
                if not data:
                    break
                buf += data
            return str(size).encode() + b"\n" + buf
        finally:
            os.close(fd)

    try:
        raw = _as_user(uid, gid, work, timeout_s, max_bytes + 32)
    except (PermissionError, TimeoutError, OSError) as exc:
        return TailResult(path, "", str(exc) or type(exc).__name__)
    head, _, body = raw.partition(b"\n")
    return TailResult(path, body.decode("utf-8", "replace"), None, int(head) if head.isdigit() else None)


def append_line_as_user(path: str, uid: int, gid: int, line: str, timeout_s: float = 5.0) -> Optional[str]:
    """Append ``line`` (whitespace collapsed, at most 2,000 characters) to the user's existing file ``path``
    as ``uid``/``gid``, with the same checks as reading; never creates a file. None on success, else why it
    was not written (never raises)."""
    if not path or not os.path.isabs(path) or "\0" in path:
        return "not an absolute path"
    data = (" ".join(line.split())[:2000] + "\n").encode("utf-8", "replace")

    def work() -> bytes:
        fd = _open_checked(path, uid, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        return b""

    try:
        _as_user(uid, gid, work, timeout_s, 16)
    except (PermissionError, TimeoutError, OSError) as exc:
        return str(exc) or type(exc).__name__
    return None
