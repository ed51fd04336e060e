"""One atomic file write for the root side (env files, MPS member files, the sampler's flush marker, the
recovery queue, the placer's heartbeat): a reader sees the old file or the new one whole, never a half-written
one, and no symlink is followed; and one directory maker whose modes never depend on the process umask. Pure:
only ``os``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Union

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def write_atomic(path: Union[str, Path], data: bytes, mode: int = 0o644, sync: bool = False) -> None:
    """Replace ``path`` by a file holding ``data``, atomically.

    The data goes to ``.<name>.<pid>.tmp`` in the same directory, created with ``O_EXCL | O_NOFOLLOW`` (a
    planted symlink is never followed; a stale file of a killed write is removed first), given ``mode`` with
    ``fchmod`` (the umask does not apply), written whole, ``fsync``-ed when ``sync`` (durable across a crash,
    slower), and renamed over ``path`` (``rename(2)`` is atomic within one file system). Names starting with
    ``.`` are what readers of these directories skip.

    Raises:
        OSError: the directory cannot be written (the temporary file is removed first).
    """
    final = os.fspath(path)
    head, name = os.path.split(final)
    tmp = os.path.join(head, f".{name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, _FLAGS, mode)
    except FileExistsError:  # left by a write that was killed half-way
        os.unlink(tmp)
        fd = os.open(tmp, _FLAGS, mode)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def make_dirs(path: Union[str, Path], mode: int, parents_mode: int = 0o755) -> None:
    """Create ``path`` with ``mode`` and its missing parents with ``parents_mode``, each chmod-ed to it.

    Never touches the process umask (process-wide: toggling it races with other threads and leaks when
    interrupted). Directories that exist are left as they are.

    Raises:
        OSError: a component cannot be created (one created by a racing process is fine).
    """
    target = Path(path)
    missing = [p for p in (target, *target.parents) if not os.path.lexists(p)]
    for p in reversed(missing):
        want = mode if p == target else parents_mode
        try:
            os.mkdir(p, want)
        except FileExistsError:
            continue
        os.chmod(p, want)
