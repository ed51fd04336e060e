"""Command-line conventions: ``--version`` on every command, ``coloc-sbatch -h`` is help, a missing optional
extra is one line with its install hint, a bare ``--coloc-mem`` number is said to be GiB, and
``scripts/main.sh`` says it is a demo and refuses a host where a production slurmctld runs (a real slurmctld,
started here)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_coloc import __version__
from tests.slurm_cluster import REPO, VENV_BIN

COMMANDS = ("coloc-sbatch", "coloc-report", "coloc-admin", "coloc-estimate", "coloc-placer", "coloc-replay",
            "coloc-sampler", "coloc-hook")


def _run(argv, env=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=REPO)


@pytest.mark.parametrize("cmd", COMMANDS)
def test_every_command_has_version(cmd: str) -> None:
    out = _run([VENV_BIN / cmd, "--version"])
    assert out.returncode == 0 and out.stdout == f"{cmd} (slurm-coloc) {__version__}\n", (out.stdout,
                                                                                          out.stderr)


def test_coloc_sbatch_h_is_help_and_names_the_mem_unit() -> None:
    out = _run([VENV_BIN / "coloc-sbatch", "-h"])
    assert out.returncode == 0 and out.stdout.startswith("Usage: coloc-sbatch"), out.stderr
    assert "bare number is GiB" in " ".join(out.stdout.split())
    assert _run([VENV_BIN / "coloc-sbatch", "--help"]).stdout == out.stdout


def _without(module: str, *argv: str) -> subprocess.CompletedProcess:
    """Run a console entry point in a Python where ``import <module>`` fails as when it is not installed
    (``sys.modules[module] = None``: ModuleNotFoundError, and importlib finds no spec)."""
    mod, fn = argv[0].split(":")
    code = (f"import sys; sys.modules[{module!r}] = None; sys.argv = [{mod!r}, *sys.argv[1:]]; "
            f"from {mod} import {fn}; {fn}()")
    return _run([sys.executable, "-c", code, *argv[1:]], env={"COLOC_ESTIMATE_SERVER": "0"})


def test_missing_extras_give_one_line_with_the_install_hint(tmp_path: Path) -> None:
    est = _without("torch", "slurm_coloc.cli.estimate:main", "--model", "torchvision.models:resnet18",
                   "--input-shape", "3,32,32", "--batch-size", "2", "--no-cache", "--no-server")
    assert est.returncode == 2 and est.stderr.count("\n") == 1, est.stderr
    assert "torch is not installed" in est.stderr and "pip install 'slurm-coloc[estimator]'" in est.stderr
    (tmp_path / "coloc.yaml").write_text(f"state_dir: {tmp_path}/state\n")
    plot = _without("matplotlib", "slurm_coloc.cli.report:main", "plot", "--config",
                    str(tmp_path / "coloc.yaml"),
                    "--out", str(tmp_path / "plots"))
    assert (plot.returncode == 2 and plot.stderr.count("\n") == 1
            and "Traceback" not in plot.stderr), plot.stderr
    assert "matplotlib is not installed" in plot.stderr and "pip install matplotlib" in plot.stderr
    assert not (tmp_path / "plots").exists()


def _minimal_slurm_conf(directory: Path, port: int) -> Path:
    (directory / "state").mkdir(parents=True, exist_ok=True)
    conf = directory / "slurm.conf"
    conf.write_text(f"ClusterName=prodtest\nSlurmctldHost=localhost\nSlurmctldPort={port}\n"
                    f"SlurmdPort={port + 1}\n"
                    f"SlurmUser=root\nStateSaveLocation={directory}/state\n"
                    f"SlurmctldPidFile={directory}/slurmctld.pid\nSlurmctldLogFile={directory}/slurmctld.log\n"
                    "NodeName=p1 NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN\nPartitionName=p Nodes=p1\n")
    return conf


def test_bare_coloc_mem_number_is_said_to_be_gib(tmp_path: Path) -> None:
    if not os.path.exists("/usr/bin/sbatch"):
        pytest.skip("no sbatch")
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\ntrue\n")
    (tmp_path / "coloc.yaml").write_text(f"state_dir: {tmp_path}/state\nprobe: off\ngpu_mem_gib: 80\n")
    env = {"COLOC_CONFIG": str(tmp_path / "coloc.yaml"),
           "SLURM_CONF": str(_minimal_slurm_conf(tmp_path, 29990)),
           "XDG_CACHE_HOME": str(tmp_path / "cache")}
    bare = _run([VENV_BIN / "coloc-sbatch", "--dry-run", "--coloc-mem", "6", script], env=env)
    assert bare.returncode == 0, bare.stderr
    assert "--coloc-mem 6 is read as 6 GiB (sbatch --mem 6 would be MB)" in bare.stderr
    assert "--gres=shard:6" in bare.stdout
    unit = _run([VENV_BIN / "coloc-sbatch", "--dry-run", "--coloc-mem", "6144M", script], env=env)
    assert unit.returncode == 0 and "is read as" not in unit.stderr and "--gres=shard:6" in unit.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_main_sh_says_demo_and_refuses_a_production_slurmctld(tmp_path: Path) -> None:
    if os.geteuid() != 0 or not os.path.exists("/usr/sbin/slurmctld"):
        pytest.skip("needs root and slurmctld")
    main = REPO / "scripts" / "main.sh"
    conf = _minimal_slurm_conf(tmp_path, _free_port())
    proc = subprocess.Popen(["/usr/sbin/slurmctld", "-D", "-f", str(conf)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)
        assert proc.poll() is None, (tmp_path / "slurmctld.log").read_text(errors="replace")
        refused = _run([main], timeout=60)
        assert refused.returncode == 3, refused.stderr
        lines = refused.stderr.splitlines()
        assert lines[0].startswith("main.sh: this sets up a DEMO of slurm-coloc on THIS host")
        assert f"refusing: a production slurmctld runs on this host (pid {proc.pid}" in refused.stderr
        assert "+ Slurm" not in refused.stdout and "install.sh" not in refused.stdout + refused.stderr
        for forced in ([main, "--force", "--preflight"], [main, "--preflight"]):
            env = {"COLOC_DEMO_FORCE": "1"} if "--force" not in forced else {}
            ok = _run(forced, env=env, timeout=60)
            assert ok.returncode == 0 and "going on (forced)" in ok.stderr and "preflight passed" in ok.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    # with it gone (only clusters of scripts/cluster.sh may run): the preflight passes without forcing
    clean = _run([main, "--preflight"], timeout=60)
    assert clean.returncode == 0 and "going on" not in clean.stderr, clean.stderr
