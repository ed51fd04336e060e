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
    ("gpu_model: ''\n", "'gpu_model' is empty"),
    ("gpu_model_by_partition: [a100]\n", "'gpu_model_by_partition'"),
    ("gpu_model_by_partition: {a100: [A100]}\n", "'gpu_model_by_partition'"),
    ("gpu_model_by_partition: {a100: ''}\n", "'gpu_model_by_partition'"),
    ("gpu_model_by_partition: a100\n", "expected key=value"),
    ("gpu_model: [H100]\n", "'gpu_model'"),
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


def test_gpu_model_by_partition(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("gpu_model: H200\ngpu_model_by_partition:\n  old: A100\n  7: H100\n")
    cfg = load(str(f), environ={})
    assert cfg.gpu_model_by_partition == {"old": "A100", "7": "H100"}
    assert (cfg.gpu_model_for("old"), cfg.gpu_model_for("7"), cfg.gpu_model_for("x"), cfg.gpu_model_for(None)) == \
        ("A100", "H100", "H200", "H200")
    env = {"COLOC_GPU_MODEL_BY_PARTITION": "a = A100, b=H200,", "COLOC_GPU_MODEL": "A100"}
    cfg = load(str(f), environ=env)  # the environment replaces the file's mapping as a whole
    assert cfg.gpu_model_by_partition == {"a": "A100", "b": "H200"} and cfg.gpu_model == "A100"
    assert load(str(f), environ={"COLOC_GPU_MODEL_BY_PARTITION": ""}).gpu_model_by_partition == {}
    with pytest.raises(ConfigError, match="'gpu_model_by_partition'"):
        load(str(f), environ={"COLOC_GPU_MODEL_BY_PARTITION": "a:A100"})
    assert load(environ={"COLOC_CONFIG": str(f)}) != Config() and hash(Config()) == hash(Config())
