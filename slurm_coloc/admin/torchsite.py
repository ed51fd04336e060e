"""``coloc-admin torch DIR``: give the package's venv a site's PyTorch and NumPy (several GiB, not bundled
in the Debian package) by a ``.pth`` file, checked first. The ``.pth`` path is appended to ``sys.path``, so
the venv's own packages (pip, click, ...) come first and are never replaced.
"""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from slurm_coloc.errors import ColocError

PTH_NAME = "coloc-site-torch.pth"
PROBE = ("import json, sys; sys.path.append(sys.argv[1]); import numpy, torch; "
         "print(json.dumps({'torch': torch.__version__, 'numpy': numpy.__version__, "
         "'where': torch.__file__}))")


@dataclass
class TorchSite:
    """A checked site-packages directory and the ``torch`` and ``numpy`` versions found there."""

    path: Path
    torch: str
    numpy: str


def site_packages(target: Path) -> Path:
    """``target``'s ``lib/pythonX.Y/site-packages`` (X.Y this interpreter's), else ``target`` itself;
    ``ColocError`` when not absolute, not a directory, or a prefix for another Python version."""
    if not target.is_absolute():
        raise ColocError(f"{target}: give an absolute path", hint="e.g. coloc-admin torch /opt/coloc-torch")
    if not target.is_dir():
        raise ColocError(f"{target}: no such directory",
                         hint="python3 -m venv /opt/coloc-torch && "
                              "/opt/coloc-torch/bin/pip install torch numpy")
    xy = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    inner = target / "lib" / xy / "site-packages"
    if inner.is_dir():
        return inner
    others = sorted(p.parent.name for p in target.glob("lib/python3*/site-packages"))
    if others:
        raise ColocError(f"{target} is a Python environment for {', '.join(others)}, slurm-coloc runs {xy}",
                         hint=f"create it with /usr/bin/{xy} -m venv")
    return target


def check(target: Path, python: str = sys.executable, timeout_s: float = 120.0) -> TorchSite:
    """Import torch and numpy from ``target`` in a fresh ``python`` within ``timeout_s``; ``ColocError``
    (with the import error's last line) when they do not import from it."""
    site = site_packages(target)
    try:
        # -I -S: nothing but the standard library and ``site`` (not the venv's own site-packages, nor a link
        # made earlier): torch and numpy must come from there
        proc = subprocess.run([python, "-I", "-S", "-c", PROBE, str(site)], capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ColocError(f"importing torch from {site} took over {timeout_s:.0f} s") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["exit status %d" % proc.returncode])[-1]
        raise ColocError(f"torch and numpy do not import from {site}: {last}",
                         hint=f"install them there: {target}/bin/pip install torch numpy")
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    return TorchSite(site, found["torch"], found["numpy"])


def pth_path(prefix: Optional[str] = None) -> Path:
    """``<prefix or sys.prefix>/lib/pythonX.Y/site-packages/coloc-site-torch.pth``."""
    xy = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    return Path(prefix or sys.prefix) / "lib" / xy / "site-packages" / PTH_NAME
