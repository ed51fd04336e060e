"""sbatch's options read from the installed sbatch (``slurm/sbatch_options.py``) and the command-line split
that uses them (``submit/request.py``): newer options with a space-separated value never take the script's
place.

Inputs: ``sbatch --help`` + ``--usage`` as Slurm 22.05.8 and 26.05.5 print them (tests/data/slurm-*/), and the
real sbatch binaries of this machine (22.05 from apt; 26.05 when ``scripts/slurm_versions.sh`` fetched it).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from slurm_coloc.slurm import sbatch_options as so
from slurm_coloc.submit.request import split_command_line

DATA = Path(__file__).resolve().parent / "data"
T22 = so.parse_sbatch_help((DATA / "slurm-22.05" / "sbatch_help_usage.txt").read_text())
T26 = so.parse_sbatch_help((DATA / "slurm-26.05" / "sbatch_help_usage.txt").read_text())
NEWER = [("--tres-per-task", "cpu=2"), ("--segment", "2"), ("--tres-bind", "gres/gpu:verbose,per_task:1"),
         ("--prefer", "a100"), ("--extra", "site=x"), ("--container-id", "abc123")]


def test_tables_read_the_release_they_come_from() -> None:
    for name in ("tres-per-task", "tres-bind", "container-id", "container-type"):
        assert name in T26.long_value and name not in T22.long_value
    assert "oom-kill-step" in T26.long_optional and "requeue" in T26.long_optional  # --opt[=v]: joined only
    assert "requeue" in T22.long_flag and "spread-segments" in T26.long_flag
    for t in (T22, T26):
        # help shows --export[=names], --wrap[=..] and (22.05) --container without a value: getopt requires
        # one
        assert {"export", "wrap", "container", "job-name", "time", "hint", "mem-bind"} <= t.long_value
        assert {"hold", "parsable", "wait", "exclusive"}.isdisjoint(t.long_value)
        assert t.short_to_long["B"] == "extra-node-info" and "B" in t.short_value
        assert "H" not in t.short_value and "J" in t.short_value


@pytest.mark.parametrize("opt,value", NEWER)
def test_newer_options_with_a_separate_value_keep_the_script(tmp_path: Path, opt: str, value: str) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\ntrue\n")
    cmd = split_command_line([opt, value, "-t", "5", str(script), "--epochs", "3"], T26)
    assert cmd.script == str(script) and cmd.script_args == ("--epochs", "3")
    assert cmd.options[0].tokens == (opt, value) and cmd.options[0].value == value
    assert cmd.last("time") == "5"


def test_an_unknown_option_before_an_existing_file_is_a_flag(tmp_path: Path, monkeypatch) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\ntrue\n")
    cmd = split_command_line(["--brand-new-flag", str(script), "x"], T26)
    assert cmd.script == str(script) and cmd.script_args == ("x",) and cmd.options[0].value is None
    monkeypatch.chdir(tmp_path)  # relative script path, as typed
    cmd = split_command_line(["--brand-new", "v", "train.sh"], T26)
    assert (cmd.script, cmd.options[0].tokens) == ("train.sh", ("--brand-new", "v"))
    # --opt[=v] never takes the next word, although it is no file
    cmd = split_command_line(["--requeue", "train.sh"], T26)
    assert cmd.script == "train.sh" and cmd.options[0].value is None


def test_directive_lines_take_the_word_after_an_unknown_option(tmp_path: Path) -> None:
    from slurm_coloc.submit.directives import parse_script
    from slurm_coloc.submit.request import script_options

    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\n#SBATCH --segment 2 --prefer a100\n#SBATCH --tres-per-task cpu=2 -t "
                      "5\ntrue\n")
    opts, _ = script_options(parse_script(str(script)), T26)
    assert [(o.name, o.value) for o in opts] == [("segment", "2"), ("prefer", "a100"),
                                                 ("tres-per-task", "cpu=2"),
                                                  ("time", "5")]


def _conf(tmp_path: Path) -> Path:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\nSlurmctldHost=localhost\nNodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n")
    return conf


@pytest.mark.skipif(not os.path.exists("/usr/bin/sbatch"), reason="no sbatch installed")
def test_installed_table_is_read_once_per_binary_and_cached(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    so._MEMO.clear()
    env = {**os.environ, "SLURM_CONF": str(_conf(tmp_path))}
    table = so.installed_options("/usr/bin", env)
    assert table.source == os.path.realpath("/usr/bin/sbatch")
    assert table.long_value == T22.long_value and table.long_flag == T22.long_flag
    files = list((tmp_path / "cache" / "slurm-coloc" / "sbatch-options").glob("*.json"))
    assert len(files) == 1
    # a new process: served from the file, without running sbatch (a copy elsewhere would run)
    so._MEMO.clear()
    assert so.installed_options("/usr/bin", env).long_value == table.long_value
    # another binary (a copy: other path) is read on its own
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shutil.copy2("/usr/bin/sbatch", bindir / "sbatch")
    assert so.installed_options(str(bindir), env).source == str(bindir / "sbatch")
    assert len(list(files[0].parent.glob("*.json"))) == 2


@pytest.mark.slow
def test_without_sbatch_or_config_the_builtin_table_says_why(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    t = so.installed_options(str(tmp_path), dict(os.environ))
    assert (t.source.startswith("built-in 22.05:") and "sbatch" in t.source
            and "tres-per-task" not in t.long_value)
    if os.path.exists("/usr/bin/sbatch"):
        env = {**os.environ, "SLURM_CONF": str(tmp_path / "missing.conf")}
        t = so.installed_options("/usr/bin", env)  # sbatch fails (or times out looking for a controller)
        assert t.source.startswith("built-in 22.05:") and t.long_value == so.BUILTIN.long_value


def test_the_26_05_binary_lists_its_own_options(tmp_path: Path, monkeypatch) -> None:
    bin26 = Path(os.environ.get("COLOC_SLURM_CACHE", "/var/cache/slurm-coloc")) / "26.05" / "bin"
    if not (bin26 / "sbatch").exists():
        pytest.skip("Slurm 26.05 not fetched (scripts/slurm_versions.sh fetch 26.05)")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    env = {**os.environ, "SLURM_CONF": str(DATA / "slurm-26.05" / "slurm.conf")}
    t = so.installed_options(str(bin26), env, use_cache=False)
    assert {"tres-per-task", "tres-bind", "container-id"} <= t.long_value, t.source
