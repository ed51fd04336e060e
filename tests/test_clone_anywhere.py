"""The suite passes wherever it is cloned: a clone under /tmp, with its venv under /tmp
too, as a fresh machine's `git clone` there and `scripts/install.sh` give. Every namespace host mounts its own
/tmp, so a path of this machine under /tmp that a test hands to a host (the site's torch, the first failure)
is invisible there unless it travels through a shared mount (``tests/netns_hosts.site_torch_share``).

Run once per suite (scripts/test.sh runs the whole suite): this checkout's HEAD is cloned to /tmp, this
machine's venv is bind-mounted at the clone's ``.venv`` in a mount namespace of the run's own (so torch's
files have a /tmp path, as an installed venv there would, without copying gigabytes), and the package tests
that hand torch to a host run from the clone: the first install and the documented torch step with an
estimate.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slurm  # root, namespaces


def test_the_package_tests_pass_from_a_clone_under_tmp(deb_package: Path) -> None:
    clone = Path(f"/tmp/coloc-clone-{os.getpid()}")
    shutil.rmtree(clone, ignore_errors=True)
    try:
        subprocess.run(["git", "clone", "-q", "--shared", str(REPO), str(clone)], check=True, timeout=120)
        venv = clone / ".venv"
        venv.mkdir()
        inner = (f"mount --bind {shlex.quote(sys.prefix)} {venv} && cd {clone} && "
                 f"exec {venv}/bin/python -m pytest -q -p no:cacheprovider tests/test_deb_package.py "
                 "-k 'first_install or torch'")
        out = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", inner],
                             env={**os.environ, "COLOC_DEB": str(deb_package)}, capture_output=True,
                             text=True, timeout=1200)
        assert out.returncode == 0 and "\n2 passed" in out.stdout, out.stdout[-4000:] + out.stderr[-2000:]
        # the run did see its torch under /tmp: what the hosts could not have reached without the shared mount
        where = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                                f"mount --bind {shlex.quote(sys.prefix)} {venv} && {venv}/bin/python -c "
                                "'import torch; print(torch.__file__)'"], capture_output=True, text=True,
                               timeout=300)
        assert where.stdout.startswith(f"{venv}/lib/"), where.stdout + where.stderr
    finally:
        shutil.rmtree(clone, ignore_errors=True)
