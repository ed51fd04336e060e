"""The sample config and the effective config (``slurm_coloc/config/__init__.py``, ``coloc-admin config``)."""
from __future__ import annotations

import logging
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from slurm_coloc import config as config_mod
from slurm_coloc.config import checks

REPO = Path(__file__).resolve().parents[1]
ADMIN = [sys.executable, "-m", "slurm_coloc", "admin"]


def test_the_sample_lists_every_key_commented_out_at_its_default_with_a_description() -> None:
    text = config_mod.sample_yaml()
    keys = [f.name for f in fields(config_mod.Config)]
    commented = re.findall(r"^#([a-z_]+): ", text, re.MULTILINE)
    assert commented == keys                                   # every key, once, in the dataclass's order
    assert yaml.safe_load(text) is None                        # as shipped it sets nothing: all defaults
    uncommented = yaml.safe_load(re.sub(r"^#([a-z_]+: )", r"\1", text, flags=re.MULTILINE))
    for key in keys:                                           # each default, as the loader reads it back
        assert checks._coerce_field(next(f for f in fields(config_mod.Config) if f.name == key),
                                    uncommented[key]) == getattr(config_mod.Config(), key)
    blocks = text.split("\n\n")[1:]
    assert all(b.startswith("# ") and "(no description)" not in b for b in blocks)
    assert "the saturation gate" in text and "diag_loader_busy_pct" in text


def test_the_shipped_sample_is_the_generated_one(tmp_path: Path) -> None:
    """deploy/coloc.yaml (the package's /etc/slurm-coloc/coloc.yaml) cannot drift from config.py."""
    assert (REPO / "deploy" / "coloc.yaml").read_text() == config_mod.sample_yaml(), \
        "regenerate: coloc-admin config --sample > deploy/coloc.yaml"
    out = subprocess.run([*ADMIN, "config", "--sample"], capture_output=True, text=True, check=True)
    assert out.stdout == config_mod.sample_yaml()
    cfg = tmp_path / "coloc.yaml"
    cfg.write_text(out.stdout)
    assert config_mod.load(str(cfg), environ={}) == config_mod.Config()


def test_effective_config_names_the_file_and_each_value_s_source(tmp_path: Path) -> None:
    cfg = tmp_path / "coloc.yaml"
    cfg.write_text("gpu_mem_gib: 40\nmps_mode: per-user\n")
    env = {"COLOC_CONFIG": str(cfg), "COLOC_SAMPLER_INTERVAL_S": "0.5", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([*ADMIN, "config"], capture_output=True, text=True, env=env, check=True).stdout
    lines = out.splitlines()
    assert lines[0] == f"# effective slurm-coloc configuration; file: {cfg}"
    assert f"gpu_mem_gib: 40  # {cfg}" in lines and f"mps_mode: per-user  # {cfg}" in lines
    assert "sampler_interval_s: 0.5  # env COLOC_SAMPLER_INTERVAL_S" in lines
    assert "headroom_mib: 256  # default" in lines
    assert len(lines) == 1 + len(fields(config_mod.Config))


@pytest.mark.slow
def test_bad_or_partial_config_is_one_line_and_exit_2(tmp_path: Path) -> None:
    cases = {"truncated": "gpu_mem_gib: [80\n", "unknown": "gpu_mem: 80\n",
             "bad value": "gpu_mem_gib: lots\n",
             "missing": None}
    for name, text in cases.items():
        cfg = tmp_path / f"{name}.yaml"
        if text is not None:
            cfg.write_text(text)
        for argv in ([*ADMIN, "config"],
                     [sys.executable, "-m", "slurm_coloc", "sampler", "run", "--node", "x"],
                     [sys.executable, "-m", "slurm_coloc", "placer", "run", "--rounds", "1"]):
            out = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                                 env={"COLOC_CONFIG": str(cfg), "PATH": "/usr/bin:/bin"})
            assert out.returncode == 2 and out.stdout == "", (name, argv, out)
            assert len(out.stderr.strip().splitlines()) == 1 and str(cfg) in out.stderr, (name, argv,
                                                                                          out.stderr)


def test_daemon_logs_survive_rotation(tmp_path: Path) -> None:
    """The sampler's log file is reopened after logrotate renames it (WatchedFileHandler; no copytruncate)."""
    from slurm_coloc.cli import sampler

    cfg = config_mod.Config(log_dir=str(tmp_path))
    sampler._logging(cfg, "n1", True)
    log = logging.getLogger("slurm_coloc.sampler")
    log.info("before rotation")
    path = tmp_path / "sampler-n1.log"
    path.rename(tmp_path / "sampler-n1.log.1")
    log.info("after rotation")
    for h in logging.getLogger("slurm_coloc").handlers:
        h.flush()
    assert "before rotation" in (tmp_path / "sampler-n1.log.1").read_text()
    assert "after rotation" in path.read_text() and "before" not in path.read_text()
    logging.getLogger("slurm_coloc").handlers[:] = []
