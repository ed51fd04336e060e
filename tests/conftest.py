"""Shared fixtures: ``slurm_cluster`` is a real local Slurm cluster for the whole test session;
``deb_package`` the built Debian package."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

from tests.slurm_cluster import Cluster, start_cluster, stop_cluster


@pytest.fixture(autouse=True)
def _private_estimate_cache(tmp_path_factory: pytest.TempPathFactory,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Estimates made by tests are cached in a per-session temporary directory, never in ~/.cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "xdg-cache"))


@pytest.fixture(autouse=True)
def _umask_unchanged() -> Iterator[None]:
    """A test whose code leaves the process umask changed fails (and the umask is put back): a leaked 077
    made later tests' files and namespace hosts unreadable to ordinary users."""
    before = os.umask(0o022)
    os.umask(before)
    yield
    after = os.umask(before)
    assert after == before, f"the process umask was left at {after:#o} (was {before:#o})"


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Cluster]:
    """munged + slurmctld + slurmd n1/n2 (2 fake GPUs each, 80 shards/GPU), stopped at the end."""
    if os.geteuid() != 0:
        pytest.skip("the local Slurm cluster needs root")
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


@pytest.fixture(scope="session")
def deb_package() -> Path:
    """The Debian package under test: ``$COLOC_DEB`` (scripts/test.sh builds it once), else built here by
    scripts/build_deb.sh into a directory keyed by the source tree (reused while the tree is unchanged)."""
    from tests.netns_hosts import built_deb

    if os.geteuid() != 0:
        pytest.skip("namespace hosts need root")
    return built_deb()
