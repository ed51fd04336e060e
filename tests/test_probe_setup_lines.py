"""The probe runs only a batch script's setup lines (F8): no ``$(...)`` but path tools and
environment managers' hooks, no backticks, ``eval`` of a hook only, no redirection but to ``/dev/null``.

Each attack line is run through the real discovery (``find_command`` -> ``discover_job``: bash runs the kept
lines in the submission directory) and must leave no marker file; each allowed form is kept and its effect
(the PATH it sets) reaches the job's Python.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurm_coloc.probe.command import find_command
from slurm_coloc.probe.discover import discover_job
from slurm_coloc.probe.preamble import is_setup, preamble

TRAIN = "import torch\nloss.backward()\n"
# a sourced conda.sh: ``conda run`` would run its arguments, ``conda shell.bash hook`` prints shell code
CONDA_SH = ('conda() {\n  case "$1" in\n    run) shift; "$@";;\n    shell.bash) echo "export HOOKED=1";;\n'
            '    info) echo /opt/conda;;\n    activate) export PATH="$ENVBIN:$PATH";;\n  esac\n}\n')

ATTACKS = {
    "command substitution": "export X=$(touch {m})",
    "nested substitution": "export X=$(dirname $(touch {m}))",
    "backticks": "export X=`touch {m}`",
    "eval of a string": "eval 'touch {m}'",
    "eval of a variable": "CMD='touch {m}'; eval \"$CMD\"",
    "eval of another substitution": "eval \"$(echo touch {m})\"",
    "output to a file": "echo hi > {m}",
    "output to a file with >&": "echo hi >& {m}",
    "output and errors to a file": "export A=1 &> {m}",
    "append to a file": "echo hi >> {m}",
    "here-string": "source /dev/stdin <<< 'touch {m}'",
    "process substitution": "source <(echo touch {m})",
    "input from a file": "source < {m}.src",
    "arithmetic hiding a substitution": "export N=$(( $(touch {m}) + 1 ))",
    "substitution in a path": "cd \"$(touch {m}; pwd)\"",
    "conda run": "conda run touch {m}",
    "a tool with a redirection inside": "export X=$(dirname x > {m})",
}


def _discover(tmp_path: Path, lines: str):
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "conda.sh").write_text(CONDA_SH)
    script = f"#!/bin/bash\nsource {tmp_path}/conda.sh\n{lines}\npython3 train.py\n"
    env = {**os.environ, "ENVBIN": str(tmp_path / "env" / "bin")}
    found = find_command(script, (), str(tmp_path), env)
    assert found.command is not None, found.reason
    return script, discover_job(script, found.command, (), str(tmp_path), env)


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_line_never_runs(name: str, tmp_path: Path) -> None:
    marker = tmp_path / "MARK"
    (tmp_path / "MARK.src").write_text(f"touch {marker}\n")
    line = ATTACKS[name].format(m=marker)
    assert not is_setup(line)
    script, _ = _discover(tmp_path, line)
    assert line not in (preamble(script, 3) or "")
    assert not marker.exists(), f"{name}: the probe's setup lines ran it"


@pytest.mark.parametrize("line", [
    'eval "$(conda shell.bash hook)"',
    "eval $(conda shell.bash hook)",
    'eval "$(pyenv init -)"',
    'eval "$(micromamba shell hook --shell bash)"',
    'cd "$(dirname "$0")"',
    'source "$(conda info --base)/etc/profile.d/conda.sh" 2>/dev/null || true',
    "export NPROC=$(nproc) N=$((2 * 3))",
    "echo setting up >&2",
    "conda activate torch >/dev/null 2>&1",
    "module load cuda/12.4 2>&1",
])
def test_setup_forms_are_kept(line: str) -> None:
    assert is_setup(line), line


def test_kept_hook_and_activate_take_effect(tmp_path: Path) -> None:
    py = tmp_path / "env" / "bin" / "python3"
    py.parent.mkdir(parents=True)
    py.write_text("#!/bin/sh\n")
    py.chmod(0o755)
    _, job = _discover(tmp_path, 'eval "$(conda shell.bash hook)"\nconda activate torch >/dev/null 2>&1')
    assert job.python == str(py), job.reason
    assert job.env.get("HOOKED") == "1"
