"""Finding the job's Python: the script's own setup lines run in bash as the user (``probe/preamble.py``), the
interpreter looked up on the PATH they leave (``probe/discover.py``).

Every form runs the real discovery (``find_command`` -> ``discover_job``: bash runs the preamble, PATH lookup,
``#!`` lines) on scripts in tmp dirs. Interpreters are real venvs (``python3 -m venv --without-pip``) where an
``activate`` script is needed, else small executables named ``python``; ``conda`` and ``module`` are shell
functions defined in a file the script sources (as conda's ``conda.sh`` and Lmod's init do) or exported by the
submitting environment (``BASH_FUNC_module%%``, as Lmod exports it). No program is probed here.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_coloc.probe.command import find_command
from slurm_coloc.probe.discover import discover_job, torch_version
from slurm_coloc.probe.preamble import preamble

TRAIN = "import torch\nloss.backward()  # reads like training\n"


def fake_python(bindir: Path, name: str = "python") -> Path:
    """An executable named like an interpreter; running it leaves a marker (the discovery must not run it)."""
    bindir.mkdir(parents=True, exist_ok=True)
    p = bindir / name
    p.write_text(f"#!/bin/sh\ntouch {bindir}/RAN\necho '[]'\n")
    p.chmod(0o755)
    if name == "python":
        (bindir / "python3").symlink_to("python")
    return p


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("venvs") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(d)], check=True)
    return d


def discover(tmp_path: Path, script: str, environ=None, args=()):
    (tmp_path / "train.py").write_text(TRAIN)
    env = dict(os.environ if environ is None else environ)
    found = find_command(script, args, str(tmp_path), env)
    assert found.command is not None, found.reason
    return found.command, discover_job(script, found.command, args, str(tmp_path), env)


def base_env(tmp_path: Path) -> dict:
    """A submitting environment whose PATH has a decoy python (the one a bare `python` would find)."""
    decoy = fake_python(tmp_path / "decoy" / "bin")
    return {**os.environ, "PATH": f"{decoy.parent}:/usr/bin:/bin"}


def test_export_path_venv(tmp_path, venv):
    script = f"#!/bin/bash\n#SBATCH --gres=gpu:1\nexport PATH={venv}/bin:$PATH\npython train.py --lr 0.1\n"
    cmd, job = discover(tmp_path, script, base_env(tmp_path))
    assert job.python == f"{venv}/bin/python" and job.env["PATH"].startswith(f"{venv}/bin:")
    assert cmd.args == ("--lr", "0.1")


def test_export_path_through_a_variable_and_submit_dir(tmp_path):
    py = fake_python(tmp_path / "envs" / "a" / "bin")
    script = 'ENVDIR="$SLURM_SUBMIT_DIR/envs/a"\nexport PATH="${ENVDIR}/bin:${PATH}"\nsrun python3 train.py\n'
    _, job = discover(tmp_path, script, base_env(tmp_path))
    assert job.python == str(py.parent / "python3")
    assert not (py.parent / "RAN").exists()  # looked up, never run


def test_source_activate_real_venv(tmp_path, venv):
    script = f"#!/bin/bash\nsource {venv}/bin/activate\npython train.py\n"
    _, job = discover(tmp_path, script, base_env(tmp_path))
    assert job.python == f"{venv}/bin/python" and job.env["VIRTUAL_ENV"] == str(venv)


def test_conda_activate_from_a_sourced_conda_sh(tmp_path):
    env_py = fake_python(tmp_path / "miniconda" / "envs" / "torch" / "bin")
    (tmp_path / "conda.sh").write_text(
        "conda() {\n  if [ \"$1\" = activate ]; then\n"
        f"    export CONDA_PREFIX={tmp_path}/miniconda/envs/$2\n"
        "    export PATH=$CONDA_PREFIX/bin:$PATH\n  fi\n}\n")
    script = (f"#!/bin/bash\nsource {tmp_path}/conda.sh\neval \"$(echo)\"\nconda activate torch\n"
              "python train.py\n")
    _, job = discover(tmp_path, script, base_env(tmp_path))
    assert job.python == str(env_py) and job.env["CONDA_PREFIX"] == str(env_py.parent.parent)


def test_module_load_then_venv(tmp_path, venv):
    mod_py = fake_python(tmp_path / "apps" / "python-3.11" / "bin")
    (tmp_path / "lmod.sh").write_text(
        f"module() {{ [ \"$1\" = load ] && export PATH={mod_py.parent}:$PATH; true; }}\n")
    script = (f"#!/bin/bash\nsource {tmp_path}/lmod.sh\nmodule purge\nmodule load python/3.11 cuda/12.4\n"
              f"source {venv}/bin/activate\nsrun --ntasks=1 python train.py\n")
    _, job = discover(tmp_path, script, base_env(tmp_path))
    assert job.python == f"{venv}/bin/python"
    assert str(mod_py.parent) in job.env["PATH"].split(":")


def test_module_exported_by_the_submitting_shell(tmp_path):
    mod_py = fake_python(tmp_path / "apps" / "py" / "bin")
    env = dict(base_env(tmp_path), **{"BASH_FUNC_module%%": f"() {{ export PATH={mod_py.parent}:$PATH; }}"})
    _, job = discover(tmp_path, "#!/bin/bash\nmodule load python\npython train.py\n", env)
    assert job.python == str(mod_py)


@pytest.mark.parametrize("line", ["srun python train.py", "srun --ntasks=1 python train.py",
                                  "srun -n 1 --gpus=1 python -u train.py"])
def test_srun_forms_use_the_preamble_path(tmp_path, line):
    py = fake_python(tmp_path / "venv" / "bin")
    script = f"#!/bin/bash\nexport PATH={py.parent}:$PATH\n{line}\n"
    cmd, job = discover(tmp_path, script, base_env(tmp_path))
    assert cmd.launcher == "srun" and job.python == str(py)


def _console_script(bindir: Path, name: str, shebang: str) -> None:
    p = bindir / name
    p.write_text(f"{shebang}\nimport sys\n")
    p.chmod(0o755)


@pytest.mark.parametrize("line,launcher", [
    ("torchrun --nproc_per_node=1 train.py", "torchrun"),
    ("torchrun --standalone --nproc-per-node 1 train.py --epochs 1", "torchrun"),
    ("accelerate launch --num_processes 1 train.py", "accelerate"),
    ("accelerate launch train.py", "accelerate"),
])
def test_launchers_run_under_their_own_python(tmp_path, line, launcher):
    py = fake_python(tmp_path / "venv" / "bin")
    _console_script(py.parent, "torchrun", f"#!{py}")
    _console_script(py.parent, "accelerate", "#!/usr/bin/env python3")  # conda's form
    script = f"#!/bin/bash\nexport PATH={py.parent}:$PATH\n{line}\n"
    cmd, job = discover(tmp_path, script, base_env(tmp_path))
    assert cmd.launcher == launcher
    assert job.python in (str(py), str(py.parent / "python3"))


def test_pip_long_shebang_form(tmp_path):
    py = fake_python(tmp_path / "venv" / "bin")
    (py.parent / "torchrun").write_text(f"#!/bin/sh\n'''exec' \"{py}\" \"$0\" \"$@\"\n' '''\nimport sys\n")
    (py.parent / "torchrun").chmod(0o755)
    _, job = discover(tmp_path, f"export PATH={py.parent}:$PATH\ntorchrun --nproc_per_node 1 train.py\n",
                      base_env(tmp_path))
    assert job.python == str(py)


def test_relocatable_shebang_form_takes_the_venvs_own_python(tmp_path):
    """uv's and newer pip's relocatable console scripts name no path on their exec line: the launcher's own
    bin directory holds the Python (on the GPU machine the torchrun script itself was taken as the
    interpreter)."""
    py = fake_python(tmp_path / "venv" / "bin")
    exec_line = "'''exec' \"$(dirname -- \"$(realpath -- \"$0\")\")\"/'python' \"$0\" \"$@\""
    (py.parent / "torchrun").write_text(f"#!/bin/sh\n{exec_line}\n' '''\nimport sys\n")
    (py.parent / "torchrun").chmod(0o755)
    _, job = discover(tmp_path, f"export PATH={py.parent}:$PATH\ntorchrun --nproc_per_node 1 train.py\n",
                      base_env(tmp_path))
    assert job.python is not None and os.path.dirname(job.python) == str(py.parent)
    assert "python" in os.path.basename(job.python)


def test_launcher_after_sourcing_a_venv_runs_under_the_venvs_python(tmp_path):
    """``source venv/bin/activate`` then ``torchrun ...`` (the public corpus's DDP script on the GPU machine):
    the Python is the launcher's, not the launcher itself (the probe once ran ``torchrun -c ...``)."""
    py = fake_python(tmp_path / "venv" / "bin")
    _console_script(py.parent, "torchrun", f"#!{py}")
    (py.parent / "activate").write_text(f"export PATH={py.parent}:$PATH\n")
    script = f"#!/bin/bash\nsource {py.parent}/activate\ntorchrun --standalone --nproc_per_node=1 train.py\n"
    cmd, job = discover(tmp_path, script, base_env(tmp_path))
    assert cmd.launcher == "torchrun"
    assert job.python == str(py)


def test_python_m_torch_distributed_run(tmp_path):
    py = fake_python(tmp_path / "venv" / "bin")
    script = f"export PATH={py.parent}:$PATH\npython -m torch.distributed.run --nproc_per_node=1 train.py\n"
    cmd, job = discover(tmp_path, script, base_env(tmp_path))
    assert cmd.launcher == "torchrun" and dict(cmd.env)["WORLD_SIZE"] == "1" and job.python == str(py)


def test_no_setup_lines_means_the_submitting_path(tmp_path):
    env = base_env(tmp_path)
    _, job = discover(tmp_path, "#!/bin/bash\n#SBATCH -t 1:00\npython train.py\n", env)
    assert job.python == str(tmp_path / "decoy" / "bin" / "python")


def test_python_missing_from_the_path_is_one_line(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path / "empty")}
    _, job = discover(tmp_path, "export X=1\npython train.py\n", env)
    assert job.python is None and "python was not found" in job.reason and "\n" not in job.reason


def test_work_lines_and_the_command_never_run(tmp_path):
    py = fake_python(tmp_path / "venv" / "bin")
    script = (f"#!/bin/bash\nmkdir -p {tmp_path}/made\ntouch {tmp_path}/touched\necho hi > "
              f"{tmp_path}/out.txt\n"
              f"if [ -d {py.parent} ]; then\n  export PATH={py.parent}:$PATH\n  python prepare.py\nfi\n"
              f"cat <<EOF > {tmp_path}/heredoc.txt\nexport PATH=/nowhere\nEOF\n"
              f"python train.py\ntouch {tmp_path}/after\n")
    _, job = discover(tmp_path, script, base_env(tmp_path))
    assert job.python == str(py) and not job.notes
    for name in ("made", "touched", "out.txt", "heredoc.txt", "after"):
        assert not (tmp_path / name).exists(), name
    assert not (py.parent / "RAN").exists()


def test_preamble_text_keeps_blocks_balanced():
    text = ("#!/bin/bash\n#SBATCH -N 1\nset -euo pipefail\nif [ -f ~/.bashrc ]; then\n  python x.py\nfi\n"
            "source venv/bin/activate 2>/dev/null || true\nnvidia-smi > gpu.txt\npython train.py\n")
    assert preamble(text, 8) == ("set -euo pipefail\nif [ -f ~/.bashrc ]; then\n:\nfi\n"
                                 "source venv/bin/activate 2>/dev/null || true\n:\n")
    assert preamble("#!/bin/sh\nhostname\npython train.py\n", 2) is None


@pytest.mark.slow
def test_hanging_setup_line_is_bounded_and_noted(tmp_path):
    (tmp_path / "slow.sh").write_text("sleep 60\n")
    t0 = time.monotonic()
    _, job = discover(tmp_path, f"source {tmp_path}/slow.sh\npython3 train.py\n", base_env(tmp_path))
    assert time.monotonic() - t0 < 15
    assert job.python == str(tmp_path / "decoy" / "bin" / "python3")
    assert job.notes and "did not finish within 5 s" in job.notes[0]
    out = subprocess.run(["pgrep", "-f", "sleep 60"], capture_output=True, text=True)
    assert out.stdout.strip() == ""


def test_script_arguments_reach_the_preamble(tmp_path):
    py = fake_python(tmp_path / "envs" / "b" / "bin")
    _, job = discover(tmp_path, f"export PATH={tmp_path}/envs/$1/bin:$PATH\npython train.py\n",
                      base_env(tmp_path), args=("b",))
    assert job.python == str(py)


def test_torch_version_read_without_importing_and_follows_installs(tmp_path, venv):
    cache = tmp_path / "cache"
    py = str(venv / "bin" / "python")
    env = dict(os.environ)
    assert torch_version(py, env, str(cache)) == "none"
    import torch

    site = next(Path(venv / "lib").glob("python3*/site-packages"))
    (site / "chain.pth").write_text(str(Path(torch.__file__).parent.parent) + "\n")  # "pip install torch"
    assert torch_version(py, env, str(cache)) == torch.__version__
    (site / "chain.pth").unlink()
    assert torch_version(py, env, str(cache)) == "none"
