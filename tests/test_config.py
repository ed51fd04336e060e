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
    assert (cfg.gpu_model_for("old"), cfg.gpu_model_for("7"), cfg.gpu_model_for("x"),
            cfg.gpu_model_for(None)) == \
        ("A100", "H100", "H200", "H200")
    env = {"COLOC_GPU_MODEL_BY_PARTITION": "a = A100, b=H200,", "COLOC_GPU_MODEL": "A100"}
    cfg = load(str(f), environ=env)  # the environment replaces the file's mapping as a whole
    assert cfg.gpu_model_by_partition == {"a": "A100", "b": "H200"} and cfg.gpu_model == "A100"
    assert load(str(f), environ={"COLOC_GPU_MODEL_BY_PARTITION": ""}).gpu_model_by_partition == {}
    with pytest.raises(ConfigError, match="'gpu_model_by_partition'"):
        load(str(f), environ={"COLOC_GPU_MODEL_BY_PARTITION": "a:A100"})
    assert load(environ={"COLOC_CONFIG": str(f)}) != Config() and hash(Config()) == hash(Config())


@pytest.mark.parametrize("text, line", [
    ("gpu_mem_gib: 0\n", "config key 'gpu_mem_gib': 0 is outside [1, 4096]"),
    ("gpu_mem_gib: 4097\n", "config key 'gpu_mem_gib': 4097 is outside [1, 4096]"),
    ("hook_timeout_s: 0\n", "config key 'hook_timeout_s': 0.0 is outside (0, 3600]"),
    ("sampler_interval_s: 0.05\n",
     "config key 'sampler_interval_s': 0.05 is outside [0.1, inf) (GPM minimum)"),
    ("placement_smact_gate: 1.5\n", "config key 'placement_smact_gate': 1.5 is outside (0, 1]"),
    ("diag_loader_busy_pct: -1\n", "config key 'diag_loader_busy_pct': -1.0 is outside [0, 100]"),
    ("exporter_port: 70000\n", "config key 'exporter_port': 70000 is outside [0, 65535] (0: off)"),
    ("watchdog_action: kill\n", "config key 'watchdog_action': 'kill' is not one of stop, record, off"),
    ("exporter_names: nvidia\n", "config key 'exporter_names': 'nvidia' is not one of coloc, jobstats, dcgm"),
    ("mps_control_bin: ' '\n", "config key 'mps_control_bin' is empty"),
    ("placement_window_s: .nan\n", "config key 'placement_window_s': nan is not a finite number"),
    ("mps_mode: per-user\nmps_compute_mode: exclusive-process\n",
     "config key 'mps_compute_mode': 'exclusive-process': exclusive-process needs mps_mode multi-user"),
    ("sampler_retention_days: 0.5\n",
     "config key 'sampler_raw_retention_h': 24.0: must be <= 24 x sampler_retention_days"),
    ("diag_train_busy_cores: 0.5\n",
     "config key 'diag_train_waiting_cores': 0.5: must be < diag_train_busy_cores"),
])
def test_a_bad_value_is_one_line_naming_the_key_the_value_and_what_is_allowed(tmp_path, text, line):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as err:
        load(str(f), environ={})
    msg = err.value.one_line()
    assert "\n" not in msg and msg.startswith(f"config file {str(f)!r}: ") and line in msg
    env = {f"COLOC_{k.upper()}": v.strip().strip("'").replace(".nan", "nan")
           for k, v in (kv.split(":", 1) for kv in text.splitlines())}
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(ConfigError) as err:  # the same values from the environment: the same line
        load(str(empty), environ=env)
    assert "\n" not in err.value.one_line() and line in err.value.one_line()


def test_every_declared_bound_and_choice_is_enforced_and_its_edges_accepted():
    """Each key's declaration (config.sections._key) decides: its bounds are accepted, just past them is
    refused."""
    import dataclasses

    from slurm_coloc import config as config_mod

    checked = 0
    for f in dataclasses.fields(Config):
        meta = f.metadata
        if not meta:
            continue
        refused, accepted = [], []
        for bound, inside in (("ge", True), ("gt", False), ("le", True)):
            edge = meta[bound]
            if edge is None:
                continue
            step = 1 if f.type == "int" else 1e-6
            past = edge - step if bound in ("ge", "gt") else edge + step
            refused.append(past)
            (accepted if inside else refused).append(edge)
        for choice in meta["choices"]:
            accepted.append(choice)
        if meta["choices"]:
            refused.append("no-such-choice")
        for value in accepted:
            if f.name == "sampler_raw_retention_h" and value > 24 * Config().sampler_retention_days:
                continue
            if f.name == "diag_train_waiting_cores" and value >= Config().diag_train_busy_cores:
                continue
            if f.name == "mps_compute_mode":
                continue  # exclusive-process is checked with mps_mode above
            config_mod._validate(dataclasses.replace(Config(), **{f.name: value}))
        for value in refused:
            with pytest.raises(ConfigError, match=f"config key '{f.name}'"):
                config_mod._validate(dataclasses.replace(Config(), **{f.name: value}))
            checked += 1
    assert checked >= 50


def test_the_keys_are_flat_and_grouped_in_sections():
    import dataclasses

    from slurm_coloc.config import sections

    names = [f.name for f in dataclasses.fields(Config)]
    in_sections = [f.name for s in sections.SECTIONS for f in dataclasses.fields(s)]
    assert names == in_sections and len(set(names)) == len(names)  # each key in one section, in section order
    assert sections.section_of("placement_smact_gate") is sections.PlacementConfig
    assert isinstance(Config(), sections.SamplerConfig) and Config(gpu_mem_gib=40).gpu_mem_gib == 40
