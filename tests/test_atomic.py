"""``atomic.write_atomic``: the root side's one atomic write (real files)."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from slurm_coloc.atomic import write_atomic


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
