"""What MPS enforces, as the Prolog/Epilog apply it (node/mps.py + node/mps.py), in-process as root.

CI has no NVIDIA driver: ``nvidia-cuda-mps-control`` is the TEST DOUBLE of tests/test_mps_lifecycle.py (it
logs every command it is sent; ``get_server_list`` answers the pids a test writes to ``pipe/fake_servers``).
Compute modes come from the H100's recorded state (``compute_mode`` in
``benchmarks/device/results/h100-mps-limits/mps_limits.json``) through ``RecordedComputeModes``: never a real
GPU. The same paths run under real Slurm in tests/test_mps_lifecycle.py.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import List

import pytest

from slurm_coloc.config import Config
from slurm_coloc.node import mps
from slurm_coloc.nvml.reader import mode_name
from slurm_coloc.nvml.readings import RecordedComputeModes
from tests.cluster.test_mps_lifecycle import FAKE_MPS

REPO = Path(__file__).resolve().parents[1]
LIMITS = REPO / "benchmarks" / "device" / "results" / "h100-mps-limits" / "mps_limits.json"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="MPS daemons are started by root")


@pytest.fixture()
def cfg(tmp_path: Path) -> Config:
    fake = tmp_path / "bin" / "nvidia-cuda-mps-control"
    fake.parent.mkdir(mode=0o755)
    fake.write_text(FAKE_MPS)
    fake.chmod(0o755)
    os.chmod(tmp_path, 0o755)
    return dataclasses.replace(Config(), state_dir=str(tmp_path / "state"), run_dir=str(tmp_path / "run"),
                               log_dir=str(tmp_path / "log"), mps_control_bin=str(fake))


def _log(cfg: Config, key: str = "idx0") -> List[str]:
    return (Path(cfg.run_dir) / "mps" / key / "log" / "control.log").read_text().splitlines()


def _recorded_modes(**kw: bool) -> RecordedComputeModes:
    return RecordedComputeModes({0: str(mode_name(json.loads(LIMITS.read_text())["compute_mode"]))}, **kw)


def test_plan_ceiling_never_below_a_running_tenant() -> None:
    plan = mps.plan_ceiling
    assert plan({"1": 2048}, None, "1") == 2048                    # first tenant
    assert plan({"1": 2048, "2": 8192}, 2048, "2") == 8192         # larger grant arrives: raise
    assert plan({"1": 2048, "2": 8192, "3": 4096}, 8192, "3") is None  # smaller one: keep
    assert plan({"1": 2048, "3": 4096}, 8192, None) == 4096        # largest leaves: lower to the largest left
    assert plan({"1": 2048}, 8192, "1") == 2048                    # alone again on a warm daemon
    assert plan({}, 2048, None) is None
    assert mps.limit_value(2048) == "2G" and mps.limit_value(1500) == "1500M"


def test_ceiling_commands_through_acquire_and_release(cfg: Config) -> None:
    assert mps.acquire(cfg, 1, 0, None, grant_mib=2048).event == "mps-start"
    assert _log(cfg)[1:] == ["cmd set_default_device_pinned_mem_limit 0 2G", "cmd get_server_list"]
    # a client started one
    (Path(cfg.run_dir) / "mps" / "idx0" / "pipe" / "fake_servers").write_text("4242\n")
    out = mps.acquire(cfg, 2, 0, None, grant_mib=8192)
    assert out.event == "mps-running" and out.detail["ceiling"]["errors"] == []
    assert _log(cfg)[3:] == ["cmd set_default_device_pinned_mem_limit 0 8G", "cmd get_server_list",
                             "cmd set_device_pinned_mem_limit 4242 0 8G"]
    n = len(_log(cfg))
    mps.acquire(cfg, 3, 0, None, grant_mib=4096)
    assert len(_log(cfg)) == n  # below the ceiling: nothing sent
    assert [o.event for o in mps.release(cfg, 2)] == ["mps-kept"]
    assert _log(cfg)[n:] == ["cmd set_default_device_pinned_mem_limit 0 4G", "cmd get_server_list",
                             "cmd set_device_pinned_mem_limit 4242 0 4G"]
    mps.release(cfg, 3)
    assert _log(cfg)[-3] == "cmd set_default_device_pinned_mem_limit 0 2G"
    assert [o.event for o in mps.release(cfg, 1)] == ["mps-stop"] and _log(cfg)[-1] == "quit"
    (Path(cfg.run_dir) / "mps" / "idx0" / "pipe" / "fake_servers").unlink()  # its server went with it
    mps.acquire(cfg, 4, 0, None, grant_mib=2048)  # a new daemon gets its limit even if equal to the old one
    assert _log(cfg)[-2:] == ["cmd set_default_device_pinned_mem_limit 0 2G", "cmd get_server_list"]
    mps.release(cfg, 4)


def test_ceiling_off_sends_nothing(cfg: Config) -> None:
    cfg = dataclasses.replace(cfg, mps_ceiling=False)
    mps.acquire(cfg, 1, 0, None, grant_mib=2048)
    mps.release(cfg, 1)
    assert [ln for ln in _log(cfg) if ln.startswith("cmd")] == []


def test_exclusive_process_while_shared_restored_when_whole(cfg: Config) -> None:
    cfg = dataclasses.replace(cfg, mps_compute_mode="exclusive-process")
    modes = _recorded_modes()
    assert modes.get(0) == "DEFAULT"  # the H100 test machine, as measured
    out = mps.acquire(cfg, 1, 0, None, grant_mib=2048, modes=modes)
    assert (out.ok and out.detail["compute_mode"] == "EXCLUSIVE_PROCESS"
            and modes.get(0) == "EXCLUSIVE_PROCESS")
    mps.acquire(cfg, 2, 0, None, grant_mib=2048, modes=modes)
    mps.release(cfg, 1, modes=modes)
    assert modes.get(0) == "EXCLUSIVE_PROCESS"  # still shared by job 2
    out2 = mps.release(cfg, 2, modes=modes)
    assert modes.get(0) == "DEFAULT" and out2[0].detail["compute_mode"] == "DEFAULT"
    assert modes.calls == [("set", 0, "EXCLUSIVE_PROCESS"), ("set", 0, "DEFAULT")]


def test_compute_mode_left_alone_by_default_and_failure_keeps_mps(cfg: Config) -> None:
    modes = _recorded_modes()
    mps.acquire(cfg, 1, 0, None, grant_mib=2048, modes=modes)
    mps.release(cfg, 1, modes=modes)
    assert modes.calls == []
    cfg = dataclasses.replace(cfg, mps_compute_mode="exclusive-process")
    failing = _recorded_modes(fail_set=True)
    out = mps.acquire(cfg, 2, 0, None, grant_mib=2048, modes=failing)
    assert out.ok and "Insufficient Permissions" in out.detail["compute_mode_error"]
    mps.release(cfg, 2, modes=failing)


def test_failed_daemon_start_restores_the_mode(cfg: Config, tmp_path: Path) -> None:
    bad = tmp_path / "bin" / "broken-mps-control"
    bad.write_text("#!/bin/sh\nexit 3\n")
    bad.chmod(0o755)
    cfg = dataclasses.replace(cfg, mps_compute_mode="exclusive-process", mps_control_bin=str(bad))
    modes = _recorded_modes()
    out = mps.acquire(cfg, 1, 0, None, grant_mib=2048, modes=modes)
    assert out.event == "mps-start-failed" and modes.get(0) == "DEFAULT"  # the job runs time-sliced


def test_admin_check_reports_a_shared_gpu_without_exclusive_process(cfg: Config) -> None:
    from slurm_coloc.admin import host_checks
    assert host_checks.check_mps_protection(cfg, False)[0].status == "pass"  # nothing shared yet
    mps.acquire(cfg, 1, 0, None, grant_mib=2048)
    assert host_checks.shared_gpus(cfg) == {"idx0": 1}
    recorded = _recorded_modes()  # the H100 as measured: DEFAULT, where a job allocated 20 GiB outside MPS
    (res,) = host_checks.evaluate_mps_protection(cfg, host_checks.shared_gpus(cfg), {"idx0": recorded.get(0)})
    assert res.status == "fail" and "compute mode DEFAULT" in res.what and "exclusive-process" in res.fix
    recorded.set(0, "EXCLUSIVE_PROCESS")
    (res,) = host_checks.evaluate_mps_protection(cfg, host_checks.shared_gpus(cfg), {"idx0": recorded.get(0)})
    assert res.status == "pass"
    (live,) = host_checks.check_mps_protection(cfg, False)  # CI: no NVML: mode unknown, not protected
    assert live.status == "fail" and "unknown" in live.what
    assert host_checks.check_mps_protection(cfg, True)[0].status == "skip"
    mps.release(cfg, 1)
    assert host_checks.shared_gpus(cfg) == {}
