"""coloc-admin check against the real local cluster's config (good) and deliberately broken copies."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List

import pytest

from slurm_coloc.admin.slurmconf import expand_hostlist, parse_gres_counts, parse_slurm_conf
from tests.slurm_cluster import VENV_BIN, Cluster

pytestmark = pytest.mark.slurm


def check(conf: Path, coloc_yaml: Path, *extra: str) -> "tuple[int, List[Dict[str, str]], str]":
    proc = subprocess.run([str(VENV_BIN / "coloc-admin"), "check", "--slurm-conf", str(conf), "--config",
                           str(coloc_yaml), *extra, "--json"], capture_output=True, text=True, timeout=60)
    data = json.loads(proc.stdout)
    assert data["ok"] == (proc.returncode == 0)
    return proc.returncode, [c for c in data["checks"] if c["status"] == "fail"], proc.stderr


@pytest.fixture()
def broken(slurm_cluster: Cluster, tmp_path: Path) -> Path:
    """A root-owned 0755 copy of the cluster's etc/ (slurm.conf, gres.conf, coloc.yaml, hooks) to break."""
    dst = Path("/tmp") / f"coloc-admin-{os.getpid()}-{tmp_path.name}"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(slurm_cluster.dir / "etc", dst)
    os.chmod(dst, 0o755)
    text = (dst / "slurm.conf").read_text().replace(str(slurm_cluster.dir / "etc" / "hooks"),
                                                    str(dst / "hooks"))
    (dst / "slurm.conf").write_text(text)
    yield dst
    shutil.rmtree(dst, ignore_errors=True)


def test_real_cluster_config_passes(slurm_cluster: Cluster):
    rc, fails, _ = check(slurm_cluster.conf, slurm_cluster.coloc_config, "--no-gpu")
    assert rc == 0 and fails == []
    human = subprocess.run([str(VENV_BIN / "coloc-admin"), "check", "--no-gpu", "--slurm-conf",
                            str(slurm_cluster.conf), "--config", str(slurm_cluster.coloc_config)],
                           capture_output=True, text=True, timeout=60)
    assert human.returncode == 0 and "0 failed" in human.stdout and "SKIP  NVML: --no-gpu" in human.stdout


def test_gpu_checks_run_without_no_gpu(slurm_cluster: Cluster):
    # this host is the test cluster's controller and its two nodes' host (NodeHostname): a compute node, whose
    # GPU checks run; as a controller alone (--role) it is not looked at for GPUs
    rc, fails, _ = check(slurm_cluster.conf, slurm_cluster.coloc_config)
    nvml = [f for f in fails if f["name"] == "NVML"]
    if nvml:  # CI (no GPU): reported with the hint, and the run fails
        assert rc == 1 and "--no-gpu" in nvml[0]["fix"]
    rc, fails, out = check(slurm_cluster.conf, slurm_cluster.coloc_config, "--role", "controller")
    assert not [f for f in fails if f["name"] in ("NVML", "MPS", "metrics", "MPS protection")], fails


def test_wrong_shard_count_and_gres_types(broken: Path):
    gres = (broken / "gres.conf").read_text().replace("Name=shard Count=80 File=",
                                                      "Name=shard Count=40 File=", 1)
    (broken / "gres.conf").write_text(gres)
    conf = (broken / "slurm.conf").read_text().replace("GresTypes=gpu,shard", "GresTypes=gpu")
    (broken / "slurm.conf").write_text(conf)
    rc, fails, _ = check(broken / "slurm.conf", broken / "coloc.yaml", "--no-gpu")
    assert rc == 1
    whats = " | ".join(f["what"] for f in fails)
    assert "GresTypes lacks shard" in whats and "has 40 shards, gpu_mem_gib is 80" in whats
    assert any("Count=80" in f["fix"] for f in fails) and any("GresTypes=gpu,shard" in f["fix"]
                                                              for f in fails)


def test_node_shards_disagree_with_gpu_mem(broken: Path):
    yaml = broken / "coloc.yaml"
    yaml.write_text(yaml.read_text().replace("gpu_mem_gib: 80", "gpu_mem_gib: 40"))
    rc, fails, _ = check(broken / "slurm.conf", yaml, "--no-gpu")
    assert rc == 1 and any("Gres=gpu:2,shard:80" in f["fix"] for f in fails)


def test_unsafe_or_missing_hooks(broken: Path):
    os.chmod(broken / "hooks" / "prolog.sh", 0o777)
    os.chown(broken / "hooks" / "epilog.sh", 2001, 2001)
    (broken / "hooks" / "task_prolog.sh").unlink()
    rc, fails, _ = check(broken / "slurm.conf", broken / "coloc.yaml", "--no-gpu")
    assert rc == 1
    by = {f["what"].split("=")[0]: f for f in fails if f["name"] == "hooks"}
    assert "writable by others" in by["Prolog"]["what"] and "chmod go-w" in by["Prolog"]["fix"]
    assert "owned by uid 2001" in by["Epilog"]["what"]
    assert "does not exist" in by["TaskProlog"]["what"]


def test_state_dir_writable_by_others(broken: Path, tmp_path: Path):
    state = Path("/tmp") / f"coloc-admin-state-{os.getpid()}"
    state.mkdir(mode=0o777, exist_ok=True)
    os.chmod(state, 0o777)
    try:
        yaml = broken / "coloc.yaml"
        lines = [ln for ln in yaml.read_text().splitlines() if not ln.startswith("state_dir:")]
        yaml.write_text("\n".join(lines + [f"state_dir: {state}"]) + "\n")
        rc, fails, _ = check(broken / "slurm.conf", yaml, "--no-gpu")
        assert rc == 1 and any("state_dir" in f["what"] and "writable by others" in f["what"] for f in fails)
    finally:
        shutil.rmtree(state, ignore_errors=True)


def test_plugstack_missing_required_plugin(broken: Path):
    (broken / "plugstack.conf").write_text("required /nonexistent/coloc_spank.so\n")
    with open(broken / "slurm.conf", "a") as f:
        f.write(f"PlugStackConfig={broken / 'plugstack.conf'}\n")
    rc, fails, _ = check(broken / "slurm.conf", broken / "coloc.yaml", "--no-gpu")
    assert rc == 1 and any("every job would fail" in f["what"] for f in fails
                           if f["name"] == "plugstack.conf")


def test_missing_slurm_conf_and_bad_config(tmp_path: Path, slurm_cluster: Cluster):
    rc, fails, _ = check(tmp_path / "nope.conf", slurm_cluster.coloc_config, "--no-gpu")
    assert rc == 1 and "cannot read" in fails[0]["what"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpu_mem_gib: lots\n")
    proc = subprocess.run([str(VENV_BIN / "coloc-admin"), "check", "--config", str(bad)], capture_output=True,
                          text=True, timeout=60)
    assert (proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
            and "gpu_mem_gib" in proc.stderr)


def test_parsers():
    assert expand_hostlist("n[1-3,5],gpu[01-02]") == ["n1", "n2", "n3", "n5", "gpu01", "gpu02"]
    assert parse_gres_counts("gpu:h100:2,shard:160") == {"gpu": 2, "shard": 160}
    conf = parse_slurm_conf("GresTypes=gpu,shard # c\nNodeName=n[1-2] Gres=gpu:2,shard:160 CPUs=4\n")
    assert conf.get("grestypes") == "gpu,shard" and conf.nodes[0]["gres"] == "gpu:2,shard:160"
