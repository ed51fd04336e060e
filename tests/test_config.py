"""Config loading: defaults, file, COLOC_* env, and errors that name the key."""
from __future__ import annotations

import pytest

from slurm_coloc.config import Config, load
from slurm_coloc.errors import ConfigError


def test_defaults_without_file(tmp_path):
    import os
    if os.path.exists("/etc/slurm-coloc/coloc.yaml"):
        pytest.skip("this machine has a real config")
    assert load(environ={}) == Config()


def test_file_and_env_precedence(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("gpu_mem_gib: 40\nheadroom_mib: 100\n")
    cfg = load(str(f), environ={"COLOC_HEADROOM_MIB": "7"})
    assert cfg.gpu_mem_gib == 40 and cfg.headroom_mib == 7
    assert cfg.ctld_db_path.name == "ctld.db" and cfg.node_db_path("n1").name == "n1.db"


@pytest.mark.parametrize("text, fragment", [
    ("gpu_mem_gib: lots\n", "'gpu_mem_gib'"),
    ("colour: blue\n", "unknown key 'colour'"),
    ("mps_mode: sometimes\n", "'mps_mode'"),
    ("- a\n- b\n", "mapping"),
    ("a: [\n", "not valid YAML"),
    ("sampler_interval_s: 0.01\n", "GPM minimum"),
    ("gpu_mem_gib: 1.5\n", "'gpu_mem_gib'"),
])
def test_bad_files(tmp_path, text, fragment):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as err:
        load(str(f), environ={})
    assert fragment in err.value.one_line()


def test_missing_explicit_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config"):
        load(environ={"COLOC_CONFIG": str(tmp_path / "missing.yaml")})


def test_bad_env_value(tmp_path):
    with pytest.raises(ConfigError, match="'hook_timeout_s'"):
        load(environ={"COLOC_HOOK_TIMEOUT_S": "soon"})
