"""Shared fixtures: ``slurm_cluster`` is a real local Slurm cluster for the whole test session."""
from __future__ import annotations

import os
from typing import Iterator

import pytest

from tests.slurm_cluster import Cluster, start_cluster, stop_cluster


@pytest.fixture(autouse=True)
def _private_estimate_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Estimates made by tests are cached in a per-session temporary directory, never in ~/.cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "xdg-cache"))


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
