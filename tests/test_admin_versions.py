"""coloc-admin check's Slurm version check (admin/slurmconf.py) on the recorded slurm.conf of each
release."""
from __future__ import annotations

from pathlib import Path

import pytest

from slurm_coloc.admin.slurmconf import cgroup_plugin, evaluate, parse_slurm_conf
from slurm_coloc.slurm.run import SlurmVersion

DATA = Path(__file__).parent / "data"
V = {"22.05": SlurmVersion(22, 5, 8), "24.11": SlurmVersion(24, 11, 5), "26.05": SlurmVersion(26, 5, 5)}


def _conf(version: str, extra: str = ""):
    path = DATA / f"slurm-{version}" / "slurm.conf"
    text = path.read_text() if path.exists() else (DATA / "slurm-24.11" / "slurm.conf").read_text()
    return parse_slurm_conf(text + extra)


@pytest.mark.parametrize("version", sorted(V))
def test_recorded_configs_name_the_release(version: str) -> None:
    found = evaluate(V[version], _conf(version), "autodetect", host_cgroup_v2=True)
    assert found == [("pass", f"Slurm {V[version].release} (tested releases: 22.05, 24.11, 26.05)", "")]


def test_cgroup_v1_warns_on_26_05_only() -> None:
    for version in ("22.05", "24.11"):
        assert [f[0]
                for f in evaluate(V[version], _conf(version), "autodetect", host_cgroup_v2=False)] == ["pass"]
    found = evaluate(V["26.05"], _conf("26.05"), "autodetect", host_cgroup_v2=False)
    assert [f[0] for f in found] == ["pass", "warn"] and "deprecated in Slurm 26.05" in found[1][1]
    assert "set in cgroup.conf" in evaluate(V["26.05"], None, "cgroup/v1", host_cgroup_v2=True)[1][1]
    assert len(evaluate(V["26.05"], None, "cgroup/v2", host_cgroup_v2=False)) == 1


@pytest.mark.parametrize("version", sorted(V))
def test_multiple_sharing_gres_fails(version: str) -> None:
    found = evaluate(V[version], _conf(version, "\nSelectTypeParameters=CR_Core,MULTIPLE_SHARING_GRES_PJ\n"),
                     "autodetect", host_cgroup_v2=True)
    assert found[-1][0] == "fail" and "MULTIPLE_SHARING_GRES_PJ" in found[-1][1]
    assert ("does not know it" in found[-1][1]) == (version == "22.05")


def test_untested_release_warns_and_cgroup_conf_is_read(tmp_path: Path) -> None:
    found = evaluate(SlurmVersion(23, 11, 10), None, "autodetect", host_cgroup_v2=True)
    assert found[0][0] == "warn" and "23.11.10 is not a tested release" in found[0][1]
    assert cgroup_plugin(tmp_path) == "autodetect"
    (tmp_path / "cgroup.conf").write_text("# c\nCgroupPlugin = cgroup/v1  # old\nConstrainCores=yes\n")
    assert cgroup_plugin(tmp_path) == "cgroup/v1"
