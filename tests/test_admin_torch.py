"""``coloc-admin torch DIR`` (the documented way to give the package's venv a site's PyTorch): the
directory is checked by importing torch and numpy from it in a fresh interpreter; one line when it cannot
serve (torch without numpy was the production install's crash)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from slurm_coloc.admin import host_checks
from slurm_coloc.errors import ColocError

HERE = Path(sys.prefix)  # this venv: torch and numpy installed (scripts/install.sh)
XY = f"python{sys.version_info[0]}.{sys.version_info[1]}"


@pytest.mark.slow
def test_a_site_environment_with_torch_and_numpy_is_accepted() -> None:
    found = host_checks.check_torch_site(HERE)
    import numpy
    import torch

    assert found.path == HERE / "lib" / XY / "site-packages"
    assert (found.torch, found.numpy) == (torch.__version__, numpy.__version__)


def test_torch_without_numpy_is_one_line(tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(bare)], check=True)
    site = bare / "lib" / XY / "site-packages"
    import torch

    (site / "torch").symlink_to(Path(torch.__file__).parent)  # torch alone: what `pip install torch` gave
    with pytest.raises(ColocError) as err:
        host_checks.check_torch_site(bare, python=str(bare / "bin" / "python3"))
    assert "No module named 'numpy'" in err.value.one_line() and "\n" not in err.value.one_line()


def test_bad_directories_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(ColocError, match="absolute path"):
        host_checks.check_torch_site(Path("relative/dir"))
    with pytest.raises(ColocError, match="no such directory"):
        host_checks.check_torch_site(tmp_path / "missing")
    other = tmp_path / "py39" / "lib" / "python3.9" / "site-packages"
    other.mkdir(parents=True)
    with pytest.raises(ColocError, match=f"for python3.9, slurm-coloc runs {XY}"):
        host_checks.check_torch_site(tmp_path / "py39")
