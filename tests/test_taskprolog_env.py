"""What the TaskProlog trusts (N6, N9), without a cluster: the job id from the title of the
root-owned slurmstepd above it (a /proc tree of real files with real owners; needs root), and the config from
the admin's file only. The same on the real cluster: tests/cluster/reliability/test_rerun_attacks.py."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurm_coloc import config as config_mod
from slurm_coloc.errors import ConfigError
from slurm_coloc.node.lifecycle import stepd_job_id
from slurm_coloc.slurm.parse import parse_stepd_title

USER_UID = 2001


def test_stepd_title() -> None:
    assert parse_stepd_title(b"slurmstepd: [6.1]\x00") == 6
    assert parse_stepd_title(b"slurmstepd: [5.batch]") == 5
    assert parse_stepd_title(b"slurmstepd: [5.extern]   ") == 5
    assert parse_stepd_title(b"sleep 100") is None
    assert parse_stepd_title(b"x slurmstepd: [7.0]") is None


def _proc(root: Path, pid: int, ppid: int, cmdline: bytes, uid: int) -> None:
    d = root / str(pid)
    d.mkdir()
    (d / "cmdline").write_bytes(cmdline)
    (d / "stat").write_bytes(f"{pid} (a (b) c) S {ppid} 1 1 0".encode())
    os.chown(d, uid, uid)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the fake /proc entries their owners")
def test_the_job_comes_from_the_root_owned_slurmstepd(tmp_path: Path) -> None:
    """Het component 1 of job 5: the task environment says 5, slurmstepd says 6. A user-owned process titled
    like slurmstepd below it (the fork that runs the task) is passed over; a root-owned one that is not
    slurmstepd ends the walk with None (the caller falls back to SLURM_JOB_ID)."""
    _proc(tmp_path, 100, 1, b"slurmstepd: [6.1]\x00", 0)
    _proc(tmp_path, 200, 100, b"slurmstepd: [9.1]\x00", USER_UID)   # the user-owned fork: not trusted
    _proc(tmp_path, 300, 200, b"/bin/sh\x00task_prolog.sh\x00", USER_UID)
    assert stepd_job_id(300, proc=str(tmp_path)) == 6
    _proc(tmp_path, 400, 1, b"/usr/sbin/cron\x00", 0)
    _proc(tmp_path, 500, 400, b"slurmstepd: [9.1]\x00", USER_UID)
    assert stepd_job_id(500, proc=str(tmp_path)) is None
    assert stepd_job_id(999, proc=str(tmp_path)) is None  # gone


def test_taskprolog_config_takes_no_override_from_the_jobs_environment(tmp_path: Path) -> None:
    admin = tmp_path / "coloc.yaml"
    admin.write_text(f"run_dir: {tmp_path}/run\nstate_dir: {tmp_path}/state\n")
    os.chmod(admin, 0o644)
    env = {"COLOC_CONFIG": str(admin), "COLOC_RUN_DIR": "/home/u/run", "COLOC_MPS_MODE": "off"}
    cfg = config_mod.load_in_job_environment(env)
    assert cfg.run_dir == f"{tmp_path}/run" and cfg.mps_mode == config_mod.Config().mps_mode
    assert config_mod.load(environ=env).run_dir == "/home/u/run"  # what the root hooks' loader would do


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to own the admin's file")
def test_taskprolog_config_named_by_the_user_is_not_used(tmp_path: Path) -> None:
    """A COLOC_CONFIG the user wrote (or one that does not load) is passed over for the default path."""
    mine = tmp_path / "mine.yaml"
    mine.write_text(f"run_dir: {tmp_path}/mine\n")
    os.chown(mine, USER_UID, USER_UID)
    # no /etc/slurm-coloc/coloc.yaml here: the default is what it tried
    with pytest.raises(ConfigError) as err:
        config_mod.load_in_job_environment({"COLOC_CONFIG": str(mine)})
    assert config_mod.DEFAULT_CONFIG_PATH in str(err.value)
    loose = tmp_path / "loose.yaml"
    loose.write_text(f"run_dir: {tmp_path}/loose\n")
    os.chmod(loose, 0o666)
    with pytest.raises(ConfigError):
        config_mod.load_in_job_environment({"COLOC_CONFIG": str(loose)})


def test_taskprolog_config_error_names_the_admins_file(tmp_path: Path) -> None:
    """A root-owned COLOC_CONFIG that does not load is reported as itself when the default path does not load
    either (the log names the file the admin must fix)."""
    broken = tmp_path / "coloc.yaml"
    broken.write_text("run_dir: [\n")
    os.chmod(broken, 0o644)
    if os.stat(broken).st_uid != 0:
        pytest.skip("needs root to own the admin's file")
    with pytest.raises(ConfigError) as err:
        config_mod.load_in_job_environment({"COLOC_CONFIG": str(broken)})
    assert str(broken) in str(err.value)
