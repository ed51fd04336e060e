"""The device harness on a real GPU.

Run on the device machine as root, after benchmarks/device/build_bundle.sh here and with ``.carry`` carried:
the carried Slurm bundle (22.05, or 24.11/26.05 from ``COLOC_SLURM=26.05 benchmarks/device/build_bundle.sh``)
starts over the real GPU(s), two small-CNN jobs submitted through coloc-sbatch run at the same time as MPS
clients with their memory fence, and no library of the bundle leaks into the jobs' environment.

Run: ``/opt/torch/.venv/bin/python3 -m pytest -m gpu tests/gpu/test_device_harness.py``
(``COLOC_EXPECT_SLURM=26.05`` makes the first test check that the running Slurm is that release).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]
DEV = REPO / "benchmarks" / "device"
ROOT = Path(os.environ.get("COLOC_BENCH_ROOT", "/opt/coloc"))


@pytest.fixture(scope="module")
def gpu_cluster():
    if os.geteuid() != 0 or shutil.which("nvidia-smi") is None:
        pytest.skip("needs root on a machine with an NVIDIA GPU")
    if not (REPO / ".carry" / "slurm-bundle.tar.gz").exists():
        pytest.skip("no .carry/slurm-bundle.tar.gz (run benchmarks/device/build_bundle.sh and carry .carry)")
    up = subprocess.run([str(DEV / "cluster_gpu.sh"), "start"], capture_output=True, text=True, timeout=180)
    assert up.returncode == 0, up.stdout + up.stderr
    yield
    subprocess.run([str(DEV / "cluster_gpu.sh"), "stop"], capture_output=True, text=True, timeout=120)


def test_the_cluster_runs_the_bundled_release(gpu_cluster) -> None:
    """The running slurmctld is the release the bundle names (``bundle.env``), and ``COLOC_EXPECT_SLURM`` when
    set."""
    bundled = (ROOT / "slurm" / "bundle.env").read_text().split()[0].split("=")[1]
    env = {**os.environ, "SLURM_CONF": str(ROOT / "etc" / "slurm.conf")}
    out = subprocess.run([str(ROOT / "bin" / "scontrol"), "show", "config"], capture_output=True, text=True,
                         env=env, timeout=30)
    assert out.returncode == 0, out.stderr
    running = next(line.split("=", 1)[1].strip() for line in out.stdout.splitlines()
                   if line.startswith("SLURM_VERSION"))
    print(f"\nSlurm running on the device: {running} (bundle: {bundled})")
    assert running.startswith(bundled + ".")
    expected = os.environ.get("COLOC_EXPECT_SLURM")
    assert not expected or running.startswith(expected + "."), (running, expected)


def test_two_jobs_share_the_gpu_under_mps(gpu_cluster, tmp_path: Path) -> None:
    env = {**os.environ, "COLOC_BENCH_ROOT": str(ROOT),
           "COLOC_BENCH_LD_LIBRARY_PATH": os.environ.get("LD_LIBRARY_PATH", "")}
    run = subprocess.run([str(ROOT / "venv" / "bin" / "python3"), "-m", "benchmarks.device.bench",
                          "--out", str(tmp_path), "collocate", "--workload", "small_cnn", "--k", "2",
                          "--coloc-only", "--warmup-s", "2", "--measure-s", "8", "--timeout-s", "240"],
                         capture_output=True, text=True, env=env, timeout=300, cwd=ROOT / "src")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    res = json.loads((tmp_path / "results.jsonl").read_text().splitlines()[-1])
    co = res["runs"]["coloc"]
    assert co["completed"] == 2 and co["not_completed"] == [] and co["oom_retries"] == []
    assert co["mps_jobs"] == 2
    assert co["overlap_window_s"] > 3 and co["aggregate_samples_per_s"] > 0
    for job in co["jobs"]:
        b = job["bench"]
        assert b["device"] == "cuda"
        assert b["env"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={b['env']['SLURM_SHARDS_ON_NODE']}G"
        assert str(ROOT / "slurm") not in (b["env"]["LD_LIBRARY_PATH"] or "")
