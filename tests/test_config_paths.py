"""F9: path keys (and every other text key) refuse newlines and control characters with one clear
line, and ``coloc-admin enable`` never writes such a path, nor one with white space, into plugstack.conf.

Before: ``run_dir: "/run/a\\nrequired /tmp/evil.so"`` loaded, and ``enable`` wrote its second line into
plugstack.conf as a plugin of its own (root's config only, but slurmd would load that ``.so``).
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_coloc import config as config_mod
from slurm_coloc.admin import switch
from slurm_coloc.config import Config
from slurm_coloc.errors import ColocError, ConfigError

SITE = ("ClusterName=site\nSlurmctldHost=ctl\nSelectType=select/cons_tres\nGresTypes=gpu\n"
        "NodeName=gpu01 CPUs=64 Gres=gpu:1 RealMemory=500000\nPartitionName=debug Nodes=ALL Default=YES\n")
BAD = ["/run/a\nrequired /tmp/evil.so", "/run/a\rb", "/run/a\tb", "/run/\x1b[2Ja", "/run/\x7fa", "/run/\x85a",
       "/run/a\x00b", "/run/a\u2028b", "/run/\u202eb"]


@pytest.mark.parametrize("key", ["run_dir", "state_dir", "log_dir", "slurm_bin_dir", "report_socket_path",
                                 "placement_history_path", "mps_control_bin", "admin_group"])
@pytest.mark.parametrize("value", BAD, ids=[repr(v) for v in BAD])
def test_text_keys_refuse_control_characters_in_one_line(tmp_path: Path, key: str, value: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f"{key}: {json.dumps(value)}\n")  # a YAML double-quoted string with the escapes
    with pytest.raises(ConfigError) as err:
        config_mod.load(str(path), environ={})
    line = err.value.one_line()
    assert "\n" not in line and key in line and ("control character" in line or "NUL" in line), line
    path.write_text("gpu_mem_gib: 80\n")
    with pytest.raises(ConfigError):  # the same through a COLOC_* override
        config_mod.load(str(path), environ={f"COLOC_{key.upper()}": value})


def test_mapping_keys_refuse_them_too(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text('gpu_model_by_partition: {"gpu\\nx": H100}\n')
    with pytest.raises(ConfigError, match="control character"):
        config_mod.load(str(path), environ={})


def test_printable_unicode_and_spaces_still_load(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text('log_dir: "/var/log/slurm coloc/été"\n')
    assert config_mod.load(str(path), environ={}).log_dir == "/var/log/slurm coloc/été"


@pytest.mark.parametrize("run_dir", ["/run/a\nrequired /tmp/evil.so", "/run/slurm coloc", "/run/\x1b", "",
                                     "/run/a#b", "/run/\u202eb", "/r" + "x" * 3000])
def test_plugstack_is_never_written_with_such_a_run_dir(run_dir: str) -> None:
    """A Config built in code skips the loader's checks: the plugstack writer refuses on its own."""
    cfg = dataclasses.replace(Config(), run_dir=run_dir)
    with pytest.raises(ColocError) as err:
        switch._plugstack("", cfg, "/usr/lib/slurm-coloc/coloc_spank.so")
    assert "plugstack.conf" in err.value.one_line() and "\n" not in err.value.one_line()
    assert switch._plugstack("", Config(), "/usr/lib/slurm-coloc/coloc_spank.so").endswith(
        "optional /usr/lib/slurm-coloc/coloc_spank.so run_dir=/run/slurm-coloc\n")


def test_enable_with_a_newline_in_run_dir_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "slurm.conf").write_text(SITE)
    (etc / "gres.conf").write_text("Name=gpu File=/dev/nvidia0\n")
    (etc / "plugstack.conf").write_text("")
    cfg = tmp_path / "coloc.yaml"
    cfg.write_text('gpu_mem_gib: 80\nrun_dir: "/run/a\\nrequired /tmp/evil.so"\n')
    before = {p.name: p.read_text() for p in etc.iterdir()}
    out = subprocess.run([sys.executable, "-m", "slurm_coloc", "admin", "enable", "--slurm-conf",
                          str(etc / "slurm.conf"), "--write"], capture_output=True, text=True,
                         env={"COLOC_CONFIG": str(cfg), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert out.returncode != 0 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "run_dir" in out.stderr and "control character" in out.stderr, out.stderr
    assert {p.name: p.read_text() for p in etc.iterdir()} == before
