"""Living beside what sites run (pure parts; the real-cluster side is tests/cluster/test_coexistence.py):
AdminComment merging (jobstats' ``JS1:`` summary, other tools' text), the ``admin_comment`` config key, and
``coloc-admin check`` on a production gres.conf with ``AutoDetect=nvml``."""
from __future__ import annotations

from pathlib import Path

import pytest

from slurm_coloc.admin.checks import check_gres_conf
from slurm_coloc.admin.slurmconf import parse_slurm_conf
from slurm_coloc.config import Config, load
from slurm_coloc.errors import ConfigError
from slurm_coloc.hooks.ctld import merge_admin_comment

OURS = '{"coloc":1,"shards":2}'
START = '{"coloc":{"mode":"shard","shards":2}}'
JS1 = "JS1:H4sIAAAAAAACA6tWystPSS1WslKoVsozBFPJBaUgvmFtrY6CUkl+SWJOfElmbipYCABWMz9kLwAAAA=="


@pytest.mark.parametrize("mode", ["merge", "if-empty"])
def test_empty_or_our_own_field_gets_our_summary(mode: str) -> None:
    assert merge_admin_comment("", OURS, mode) == OURS
    assert merge_admin_comment(START, OURS, mode) == OURS  # our start note is replaced, not repeated


def test_merge_keeps_other_text_and_replaces_only_our_part() -> None:
    assert merge_admin_comment("site=abc", START, "merge") == f"site=abc {START}"
    assert merge_admin_comment(f"site=abc {START}", OURS, "merge") == f"site=abc {OURS}"
    assert merge_admin_comment(f"site=abc {START}", OURS, "if-empty") is None


@pytest.mark.parametrize("mode", ["merge", "if-empty", "off"])
def test_a_jobstats_summary_is_never_touched(mode: str) -> None:
    assert merge_admin_comment(JS1, OURS, mode) is None


def test_off_never_writes() -> None:
    assert merge_admin_comment("", OURS, "off") is None


def test_admin_comment_key_is_checked(tmp_path: Path) -> None:
    path = tmp_path / "coloc.yaml"
    path.write_text("admin_comment: overwrite\n")
    with pytest.raises(ConfigError, match="admin_comment.*merge, if-empty, off"):
        load(str(path))
    path.write_text("admin_comment: if-empty\n")
    assert load(str(path)).admin_comment == "if-empty"


def _gres_check(tmp_path: Path, gres: str, gpu_mem_gib: int = 80) -> list:
    devs = tmp_path / "dev"
    devs.mkdir(exist_ok=True)
    for i in range(2):
        (devs / f"nvidia{i}").touch()
    conf = parse_slurm_conf("GresTypes=gpu,shard\nNodeName=gpu01 Gres=gpu:2,shard:160 CPUs=8\n")
    path = tmp_path / "gres.conf"
    path.write_text(gres.replace("/dev/", f"{devs}/"))
    return check_gres_conf(path, conf, Config(gpu_mem_gib=gpu_mem_gib))


def test_autodetect_nvml_production_gres_conf_passes(tmp_path: Path) -> None:
    """docs/admin.md's production gres.conf: GPUs from NVML, one shard line per GPU."""
    checks = _gres_check(tmp_path, "AutoDetect=nvml\nName=shard Count=80 File=/dev/nvidia0\n"
                                   "Name=shard Count=80 File=/dev/nvidia1\n")
    assert [c.status for c in checks] == ["pass"], [c.to_json() for c in checks]
    assert "2 GPUs x 80 shards (GPUs from AutoDetect=nvml)" in checks[0].what


def test_autodetect_still_checks_shard_counts_and_lines(tmp_path: Path) -> None:
    checks = _gres_check(tmp_path, "AutoDetect=nvml\nName=shard Count=40 File=/dev/nvidia0\n")
    assert [c.status for c in checks] == ["fail"] and "40 shards, gpu_mem_gib is 80" in checks[0].what
    checks = _gres_check(tmp_path, "AutoDetect=nvml\nName=shard Count=160\n")
    assert [c.status for c in checks] == ["fail"] and "no Name=shard line names a GPU" in checks[0].what
    # autodetection switched off for this node: a Name=gpu File= line is needed again
    checks = _gres_check(tmp_path, "AutoDetect=nvml\nNodeName=gpu01 AutoDetect=off\n"
                                   "Name=shard Count=80 File=/dev/nvidia0\n")
    assert [c.status for c in checks] == ["fail"] and "no Name=gpu line with File=" in checks[0].what
