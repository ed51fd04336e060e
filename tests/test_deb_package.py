"""The Debian package on a fresh host (a namespace host whose root is an overlay of this machine: its own dpkg
database, nothing reaches the machine's /): first install, a unit started before the config exists, upgrade
(config and databases kept, daemons stopped), removal (nothing left running, config and databases kept) and
purge.

No systemd runs in CI, so a unit is started the way systemd would start it: its ``Environment=`` and
``ExecStart=`` as root.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from tests.netns_hosts import Host, Hosts, unit_exec

pytestmark = pytest.mark.slurm  # root, namespaces; no Slurm daemons
RECORDING = Path(__file__).parent / "data" / "nvml" / "h100_mps_2jobs.jsonl"
APT = "apt-get -q -y -o DPkg::Options::=--force-unsafe-io"  # no fsync per file: this host is a tmpfs anyway
UNITS = ("coloc-sampler.service", "coloc-placer.service", "coloc-placer-fallback.service",
         "coloc-report.service")


def _ours_running(h: Host) -> str:
    """Command lines of processes that run the package's Python (empty: none)."""
    return h.run("for d in /proc/[0-9]*; do tr '\\0' ' ' < $d/cmdline 2>/dev/null | grep "
                 "'^/usr/lib/slurm-coloc/'"
                 " || true; done").stdout.strip()


@pytest.fixture(scope="module")
def host(deb_package: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    pkg = tmp_path_factory.mktemp("pkg")
    shutil.copy(deb_package, pkg / deb_package.name)
    # the upgrade: the same payload as version <v>-2 (dpkg-deb's raw extract, Version changed, rebuilt)
    raw = pkg / "raw"
    subprocess.run(["dpkg-deb", "-R", str(deb_package), str(raw)], check=True)
    control = raw / "DEBIAN" / "control"
    control.write_text(control.read_text().replace("-1\n", "-2\n", 1))
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zxz", "-z1", "-b", str(raw),
                    str(pkg / "upgrade.deb")],
                   check=True, capture_output=True)
    shutil.rmtree(raw)
    shutil.copy(RECORDING, pkg / "rec.jsonl")
    hosts = Hosts(f"p{os.getpid() % 10000}", Path(f"/tmp/coloc-pkg-{os.getpid()}"), {str(pkg): "/srv/pkg"})
    try:
        hosts.start(["h1"])
        # no man-db index rebuild (20 s) in this test host
        hosts["h1"].run("rm -f /var/lib/man-db/auto-update")
        yield hosts["h1"]
    finally:
        hosts.stop()


def test_first_install_puts_everything_in_its_place(host: Host, deb_package: Path) -> None:
    out = host.run(f"{APT} install /srv/pkg/{deb_package.name}")
    assert "Next: coloc-admin enable --dry-run" in out.stdout
    files = host.run("ls /usr/bin/coloc-* /lib/systemd/system/coloc-* /usr/lib/slurm-coloc/hooks "
                     "/usr/share/man/man1/coloc-* /usr/lib/slurm-coloc/coloc_spank.so").stdout
    for name in ("coloc-sbatch", "coloc-hook", "coloc-sampler", "coloc-placer", "coloc-report",
                 "coloc-admin"):
        assert f"/usr/bin/{name}\n" in files and f"/usr/share/man/man1/{name}.1.gz" in files
    for unit in (*UNITS, "coloc-placer-fallback.timer"):
        assert f"/lib/systemd/system/{unit}" in files
    assert "prolog.sh" in files and "epilog_slurmctld.sh" in files and "task_prolog.sh" in files
    # systemd's own checker (offline: no systemd runs here) finds nothing wrong with the units as installed
    verify = host.run("systemd-analyze verify --man=no /lib/systemd/system/coloc-* 2>&1", check=False)
    assert verify.returncode == 0 and "coloc" not in verify.stdout, verify.stdout
    assert host.run("dpkg-query -W -f='${Conffiles}' slurm-coloc").stdout.split()[0] == "/etc/slurm-coloc/coloc.yaml"
    # the product runs from the package's venv over Debian's python3, without torch (a site's choice)
    where = host.run("/usr/lib/slurm-coloc/venv/bin/python3 -c 'import slurm_coloc, sys; "
                     "print(slurm_coloc.__file__,"
                     " sys.base_prefix)'").stdout.split()
    assert where[0].startswith("/usr/lib/slurm-coloc/venv/lib/python3") and where[1] == "/usr"
    assert host.run("/usr/lib/slurm-coloc/venv/bin/python3 -c 'import torch'", check=False).returncode != 0
    assert host.run("/usr/bin/python3 -c 'import slurm_coloc'",
                    check=False).returncode != 0  # Debian's untouched
    cfg = host.run("coloc-admin config").stdout
    assert cfg.startswith("# effective slurm-coloc configuration; file: /etc/slurm-coloc/coloc.yaml\n")
    assert "gpu_mem_gib: 80  # default" in cfg
    assert "NAME" in host.run("man -P cat coloc-admin 2>/dev/null || zcat "
                              "/usr/share/man/man1/coloc-admin.1.gz").stdout
    assert "SPANK" in host.run("strings /usr/lib/slurm-coloc/coloc_spank.so | grep -m1 -i spank || true").stdout \
        or host.run("nm -D /usr/lib/slurm-coloc/coloc_spank.so").stdout.count("slurm_spank_") >= 2


def test_a_unit_started_before_the_config_exists_says_so_in_one_line(host: Host) -> None:
    host.run("mv /etc/slurm-coloc/coloc.yaml /srv/pkg/coloc.yaml.kept")
    try:
        for unit in UNITS:
            spec = unit_exec(host.run(f"cat /lib/systemd/system/{unit}").stdout)
            out = host.run(f"env {spec['Environment']} {spec['ExecStart']}", check=False, timeout=60)
            lines = out.stderr.strip().splitlines()
            assert out.returncode == 2, (unit, out.stdout, out.stderr)
            assert (len(lines) == 1 and "/etc/slurm-coloc/coloc.yaml" in lines[0]
                    and "error" in lines[0]), (unit, lines)
            assert "RestartPreventExitStatus=2" in host.run(f"cat /lib/systemd/system/{unit}").stdout \
                or unit == "coloc-placer-fallback.service"  # oneshot: never restarted
    finally:
        host.run("mv /srv/pkg/coloc.yaml.kept /etc/slurm-coloc/coloc.yaml")


def _rows(host: Host) -> int:
    """Rows in every table of the node database (Debian's python3 and sqlite3)."""
    code = ("import sqlite3; c = sqlite3.connect('file:/var/lib/slurm-coloc/nodes/h1.db?mode=ro', uri=True); "
            "names = [r[0] for r in c.execute('SELECT name FROM sqlite_master WHERE type=?', ('table',))]; "
            "print(sum(c.execute('SELECT count(*) FROM ' + n).fetchone()[0] for n in names))")
    return int(host.run(f"/usr/bin/python3 -c {shlex.quote(code)}").stdout)


def _start_sampler(host: Host) -> None:
    host.spawn("COLOC_CONFIG=/etc/slurm-coloc/coloc.yaml coloc-sampler run --node h1 --replay "
               "/srv/pkg/rec.jsonl "
               "--foreground-log", "/tmp/sampler.log")
    host.run("for i in $(seq 100); do [ -s /var/lib/slurm-coloc/nodes/h1.db ] && exit 0; sleep 0.1; done; "
             "exit 1")
    assert "coloc-sampler" in _ours_running(host)


def test_upgrade_keeps_config_and_databases_and_stops_the_old_daemons(host: Host) -> None:
    host.run("echo 'gpu_mem_gib: 40' >> /etc/slurm-coloc/coloc.yaml")
    _start_sampler(host)
    before = _rows(host)
    assert before > 0
    out = host.run(f"{APT} install /srv/pkg/upgrade.deb")
    assert "Unpacking slurm-coloc (0.1.0-2) over (0.1.0-1)" in out.stdout, out.stdout
    assert host.run("dpkg-query -W -f='${Version}' slurm-coloc").stdout.endswith("-2")
    assert _ours_running(host) == ""                       # the old sampler did not outlive its code
    assert "gpu_mem_gib: 40  # /etc/slurm-coloc/coloc.yaml" in host.run("coloc-admin config").stdout
    assert _rows(host) >= before  # the database of the old version, with every row it had


def test_removal_leaves_nothing_running_and_keeps_config_and_databases(host: Host) -> None:
    _start_sampler(host)
    host.run(f"{APT} remove slurm-coloc")
    assert _ours_running(host) == ""
    assert host.run("test -e /usr/bin/coloc-admin || test -e /usr/lib/slurm-coloc || echo gone").stdout == "gone\n"
    assert "gpu_mem_gib: 40" in host.run("cat /etc/slurm-coloc/coloc.yaml").stdout
    assert host.run("test -s /var/lib/slurm-coloc/nodes/h1.db && echo kept").stdout == "kept\n"
    out = host.run(f"{APT} purge slurm-coloc")
    assert "databases in /var/lib/slurm-coloc are kept" in out.stdout + out.stderr
    assert host.run("test -e /etc/slurm-coloc || echo gone; test -s /var/lib/slurm-coloc/nodes/h1.db && echo "
                    "kept"
                    ).stdout == "gone\nkept\n"
