"""The root side's atomic file write (a reader sees the old file or the new one whole; no symlink is
followed) and a directory maker whose modes never depend on the umask."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Union

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def write_atomic(path: Union[str, Path], data: bytes, mode: int = 0o644, sync: bool = False) -> None:
    """Replace ``path`` by a file holding ``data``: written to ``.<name>.<pid>.tmp`` beside it (``O_EXCL |
    O_NOFOLLOW``: a planted symlink is never followed), ``fchmod``-ed to ``mode``, ``fsync``-ed when ``sync``,
    renamed over ``path``. OSError when the directory cannot be written (the temporary file removed first).
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
    """Create ``path`` with ``mode`` and its missing parents with ``parents_mode``, each chmod-ed to it (the
    umask is process-wide, so never toggled); existing directories are left as they are. OSError when a
    component cannot be created (one created by a racing process is fine)."""
    target = Path(path)
    missing = [p for p in (target, *target.parents) if not os.path.lexists(p)]
    for p in reversed(missing):
        want = mode if p == target else parents_mode
        try:
            os.mkdir(p, want)
        except FileExistsError:
            continue
        os.chmod(p, want)
