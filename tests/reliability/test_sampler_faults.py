"""Sampler faults (docs/reliability.md): SIGKILL at random moments under write load (reduced count here; 50 in
benchmarks/load_sampler_kill.py), NVML missing, the node database corrupt or on a full filesystem. The sampler
replays the H100 NVML recording (tests/data/nvml, labelled there) where a reading is needed. Locked database
and failed reads: tests/test_sampler.py.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.load_sampler_kill import INTERVAL_S, REC, kill_campaign
from slurm_coloc.config import Config
from slurm_coloc.node.sampler import JobAttributor, Sampler
from slurm_coloc.nvml import ReplayReader
from slurm_coloc.store import samples as st

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_sigkill_under_write_load_integrity_ok_and_at_most_one_interval_lost(tmp_path: Path) -> None:
    r = kill_campaign(tmp_path, kills=8, seed=8, batch_s=INTERVAL_S)
    assert r["integrity_ok"] == 8, r["results"]
    assert r["rounds_with_frames"] == 8, r["results"]
    assert r["lost_max"] <= 1, r["results"]  # the frame in flight at most: one interval
    assert r["writer_rows"] > 100  # the write load was real


@pytest.mark.slow
def test_sigkill_with_default_batching_loses_at_most_one_interval(tmp_path: Path) -> None:
    ratio = Config().sampler_batch_s / Config().sampler_interval_s
    r = kill_campaign(tmp_path, kills=6, seed=6, batch_s=INTERVAL_S * ratio)
    assert r["integrity_ok"] == 6
    assert r["lost_max"] <= 1, r["results"]


def _cfg(tmp_path: Path, **kw) -> Config:
    return dataclasses.replace(Config(), state_dir=str(tmp_path / "state"), run_dir=str(tmp_path / "run"),
                               log_dir=str(tmp_path / "log"), **kw)


def test_nvml_missing_sampler_exits_with_one_line(tmp_path: Path) -> None:
    try:
        import pynvml
        pynvml.nvmlInit()
        pytest.skip("NVML is present on this machine")
    except Exception:  # the CI case: no driver
        pass
    conf = tmp_path / "c.yaml"
    conf.write_text(json.dumps({"state_dir": str(tmp_path / "s"), "run_dir": str(tmp_path / "r"),
                                "log_dir": str(tmp_path / "l")}))
    p = subprocess.run([sys.executable, "-m", "slurm_coloc.cli.sampler", "run", "--node", "x1",
                        "--foreground-log",
                        "--duration-s", "1"], env={**os.environ, "COLOC_CONFIG": str(conf)}, cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert "NVML" in p.stderr and p.stderr.strip().splitlines()[-1].startswith("Error:"), p.stderr


def test_corrupt_database_then_replaced_sampler_carries_on(tmp_path: Path) -> None:
    s = Sampler(_cfg(tmp_path), "c1", ReplayReader(str(REC)), attributor=JobAttributor(), interval_s=0.1)
    s.step()
    assert s.flush()
    s._open().conn.close()
    s._db = None
    with open(s.db_path, "r+b") as fh:
        fh.write(b"\x5a" * 4096)
    for _ in range(3):
        s.step()
    assert s.flush() is False and len(s.gpu_buf) >= 3  # kept in memory, no exception
    os.rename(s.db_path, str(s.db_path) + ".corrupt")  # the admin sets it aside
    for suffix in ("-wal", "-shm"):
        Path(str(s.db_path) + suffix).unlink(missing_ok=True)
    buffered = len(s.gpu_buf)
    assert s.flush(), "a new database is created and the buffered rows land in it"
    conn = sqlite3.connect(str(s.db_path))
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert conn.execute("SELECT count(*) FROM gpu_samples").fetchone()[0] == buffered


def test_database_on_full_tmpfs_then_space_again(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    state = tmp_path / "state"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(state)], check=True)
    try:
        s = Sampler(_cfg(tmp_path), "f1", ReplayReader(str(REC)), attributor=JobAttributor(), interval_s=0.1)
        s.step()
        assert s.flush()
        s._open().execute("PRAGMA wal_checkpoint(TRUNCATE)")
        subprocess.run(["dd", "if=/dev/zero", f"of={state}/filler", "bs=4k"], capture_output=True)
        for _ in range(200):
            s.step()
        assert s.flush() is False and s.gpu_buf  # ENOSPC: kept, no exception
        os.unlink(state / "filler")
        assert s.flush()
        db = s._open()
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert st.count_samples(db)["gpu_samples"] >= 201
        db.conn.close()
    finally:
        subprocess.run(["umount", str(state)], check=False)
