"""``coloc-admin check`` knows the host's role: a controller or login host has no GPUs of its own,
so gres.conf's device files, NVML, MPS and the metrics endpoint are checked only on a compute node, for its
own node's lines."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from slurm_coloc.admin.slurmconf import controllers, detect, parse_slurm_conf

SITE = """\
ClusterName=site
SlurmctldHost=ctl(10.0.0.1)
SlurmctldHost=ctl2
SelectType=select/cons_tres
GresTypes=gpu,shard
NodeName=gpu[01-02] NodeHostname=node[1-2] CPUs=64 Gres=gpu:2,shard:160
NodeName=cpu01 CPUs=64
PartitionName=debug Nodes=ALL Default=YES
"""
GRES = "".join(f"NodeName=gpu[01-02] Name={k} {'Count=80 ' if k == 'shard' else ''}File=/dev/coloc-none{i}\n"
               for i in (0, 1) for k in ("gpu", "shard"))


def test_role_from_slurm_conf() -> None:
    conf = parse_slurm_conf(SITE)
    assert controllers(SITE) == {"ctl", "ctl2"}
    assert detect(conf, SITE, hostname="ctl.example.org").roles == {"controller"}
    node = detect(conf, SITE, hostname="node2")
    assert node.roles == {"compute"} and node.nodes == {"gpu02"} and node.gpu
    assert detect(conf, SITE, hostname="gpu01").nodes == {"gpu01"}
    assert detect(conf, SITE, hostname="cpu01").roles == {"compute"}
    assert detect(conf, SITE, hostname="login1").roles == {"login"}
    assert detect(conf, SITE, role="controller", hostname="gpu01").roles == {"controller"}


def _check(tmp_path: Path, *args: str) -> "subprocess.CompletedProcess[str]":
    (tmp_path / "slurm.conf").write_text(SITE)
    (tmp_path / "gres.conf").write_text(GRES)
    (tmp_path / "coloc.yaml").write_text(f"gpu_mem_gib: 80\nstate_dir: {tmp_path}/state\n"
                                         f"run_dir: {tmp_path}/run\n")
    code = ("import socket, sys; host = sys.argv.pop(1); socket.gethostname = lambda: host; "
            "from slurm_coloc.cli.admin import main; sys.argv[0] = 'coloc-admin'; main()")
    return subprocess.run([sys.executable, "-c", code, *args, "check", "--slurm-conf",
                           str(tmp_path / "slurm.conf"), "--config", str(tmp_path / "coloc.yaml")],
                          capture_output=True, text=True, timeout=120)


def test_the_controller_does_not_look_for_the_nodes_gpus(tmp_path: Path) -> None:
    out = _check(tmp_path, "ctl")
    lines = out.stdout.splitlines()
    assert "PASS  role: ctl: controller (SlurmctldHost)" in lines
    assert not [ln for ln in lines if ln.startswith("FAIL") and ("/dev/coloc-none" in ln or "NVML" in ln
                                                                 or "MPS" in ln)], out.stdout
    assert "SKIP  NVML: controller host: not a GPU node" in lines
    assert "PASS  gres.conf: node gpu01: 2 GPUs x 80 shards" in lines


def test_a_compute_node_checks_its_own_devices_only(tmp_path: Path) -> None:
    out = _check(tmp_path, "node1")
    fails = [ln for ln in out.stdout.splitlines() if ln.startswith("FAIL  gres.conf")]
    assert fails and all("node gpu01:" in ln and "does not exist" in ln for ln in fails), out.stdout
    assert "PASS  role: node1: compute (NodeName=gpu01)" in out.stdout
    assert "SKIP  NVML" not in out.stdout  # the GPU checks run on a compute node
