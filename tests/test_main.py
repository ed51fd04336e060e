"""``python -m slurm_coloc``: the list of commands and dispatch to ``coloc-<command>``."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "slurm_coloc", *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO)


def test_help_lists_every_command() -> None:
    out = _run("--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: python -m slurm_coloc COMMAND")
    for name in ("sbatch", "estimate", "report", "admin", "sampler", "hook", "replay"):
        assert f"(coloc-{name})" in out.stdout
    assert _run().stdout == out.stdout  # no command: the same help, exit 0


@pytest.mark.slow
def test_dispatches_to_the_command() -> None:
    out = _run("estimate", "--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Usage: coloc-estimate [OPTIONS]") and "--input-shape" in out.stdout
    bad = _run("estimate", "--model", "nosuch_mod_xyz:f", "--input-shape", "3", "--batch-size", "1",
               "--no-server")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert bad.stderr.startswith("coloc-estimate: error:")


def test_unknown_command_is_one_error_line() -> None:
    out = _run("nosuch")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "unknown command 'nosuch'" in out.stderr


def test_commands_match_the_console_scripts() -> None:
    from slurm_coloc.__main__ import COMMANDS

    with open(REPO / "pyproject.toml", "rb") as fh:
        scripts = tomllib.load(fh)["project"]["scripts"]
    assert {f"coloc-{name}": entry for name, (entry, _) in COMMANDS.items()} == scripts
