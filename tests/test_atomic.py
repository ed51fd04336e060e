"""``atomic``: the root side's one atomic write and its directory maker (real files)."""
from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from slurm_coloc.atomic import make_dirs, write_atomic


def test_replaces_whole_with_the_mode_asked_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "7.env"
    target.write_text("OLD=1\n")
    old_umask = os.umask(0o077)
    try:
        write_atomic(target, b"NEW=2\n", 0o644)
    finally:
        os.umask(old_umask)
    assert target.read_text() == "NEW=2\n" and stat.S_IMODE(target.stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["7.env"]


def test_a_stale_temporary_file_is_replaced_and_a_planted_symlink_is_never_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    tmp = tmp_path / f".m.{os.getpid()}.tmp"
    os.symlink(victim, tmp)  # a symlink where the temporary file goes: removed, not written through
    write_atomic(tmp_path / "m", b"x", 0o600, sync=True)
    assert victim.read_text() == "keep" and (tmp_path / "m").read_bytes() == b"x" and not tmp.exists()


def test_an_unwritable_directory_raises_and_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        write_atomic(tmp_path / "missing" / "f", b"x")
    assert list(tmp_path.iterdir()) == []


def test_make_dirs_gives_the_modes_asked_whatever_the_umask_and_never_changes_it(tmp_path: Path) -> None:
    """Parents 0755 and the leaf its mode under a root umask of 077; 16 threads making directories at once
    leave the process umask as it was (toggling it, as the store once did, leaked 077 to the process)."""
    old_umask = os.umask(0o077)
    try:
        make_dirs(tmp_path / "a" / "b" / "leaf", 0o700)
        threads = [threading.Thread(target=make_dirs, args=(tmp_path / f"t{i}" / "x", 0o750))
                   for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert os.umask(0o077) == 0o077
    finally:
        os.umask(old_umask)
    modes = {p.relative_to(tmp_path).as_posix(): stat.S_IMODE(p.stat().st_mode)
             for p in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "leaf", tmp_path / "t3",
                       tmp_path / "t3" / "x")}
    assert modes == {"a": 0o755, "a/b": 0o755, "a/b/leaf": 0o700, "t3": 0o755, "t3/x": 0o750}
    make_dirs(tmp_path / "a" / "b" / "leaf", 0o777)  # existing: left as it is
    assert stat.S_IMODE((tmp_path / "a" / "b" / "leaf").stat().st_mode) == 0o700
