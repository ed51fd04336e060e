"""The Debian package on a fresh host (a namespace host whose root is an overlay of this machine: its own dpkg
database, nothing reaches the machine's /): first install, a unit started before the config exists, each
daemon through its init script (hosts without systemd) and through its unit with the unit's hardening, the
documented torch step (``coloc-admin torch``) and an estimate after it, upgrade (config and databases kept,
daemons stopped), removal (nothing left running, config and databases kept, a warning about slurm.conf hooks,
no stall on a user's hostile command line) and purge (no link to a unit or init script left).

No systemd runs in CI (nor here: no /run/systemd/system), so a unit is started the way systemd would start it:
its ``Environment=`` and ``ExecStart=`` as root, under the hardening ``tests/netns_hosts.unit_command`` can
apply without systemd (capability bounding set, no-new-privileges, private /tmp, read-only /usr, /etc, /home);
``systemd-analyze verify`` checks the unit files offline.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from typing import Iterator, List

import pytest

from tests.netns_hosts import SITE_TORCH, Host, Hosts, site_torch_share, unit_command, unit_exec

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
    hosts = Hosts(f"p{os.getpid() % 10000}", Path(f"/tmp/coloc-pkg-{os.getpid()}"),
                  {str(pkg): "/srv/pkg", **site_torch_share()})
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
    # and rates their hardening (exposure 0-10; 9.6 "UNSAFE" for these units without it)
    for unit in UNITS:
        rated = host.run("systemd-analyze security --offline=true "
                         f"/lib/systemd/system/{unit} | tail -n 1").stdout
        exposure = float(rated.split("exposure level for")[1].split(":")[1].split()[0])
        assert exposure <= 5.5, rated
    conffiles = host.run("dpkg-query -W -f='${Conffiles}' slurm-coloc").stdout.split()
    assert conffiles[0] == "/etc/slurm-coloc/coloc.yaml"
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
    hook_man = host.run("zcat /usr/share/man/man1/coloc-hook.1.gz").stdout.splitlines()
    assert hook_man[hook_man.index(".SH NAME") + 1] == \
        "coloc-hook \\- Run one slurm-coloc hook for the job in the environment (called by Slurm, as root)"
    assert "Prolog=/usr/lib/slurm-coloc/hooks/prolog.sh" in [ln.strip() for ln in hook_man]
    pins = host.run("cat /usr/share/slurm-coloc/constraints.txt").stdout
    frozen = host.run("/usr/lib/slurm-coloc/venv/bin/pip freeze --all --disable-pip-version-check").stdout
    assert {ln for ln in frozen.splitlines() if not ln.lower().startswith("slurm")} == \
        {ln for ln in pins.splitlines() if not ln.startswith("#")}
    assert "SPANK" in host.run("strings /usr/lib/slurm-coloc/coloc_spank.so | grep -m1 -i spank "
                               "|| true").stdout \
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


def _our_pids(host: Host, name: str) -> List[str]:
    """Pids of the package's ``name`` daemon on the host (its interpreter and script path)."""
    out = host.run("for d in /proc/[0-9]*; do tr '\\0' ' ' < $d/cmdline 2>/dev/null | grep -q "
                   f"'^/usr/lib/slurm-coloc/venv/bin/python3 /usr/bin/{name} ' && echo ${{d#/proc/}}; "
                   "done; true")
    return out.stdout.split()


def _daemon_config(host: Host) -> None:
    """A config with which the sampler replays an H100 recording (no NVML here) into the node database."""
    host.run("cp /etc/slurm-coloc/coloc.yaml /srv/pkg/coloc.yaml.shipped && "
             "echo 'sampler_replay_path: /srv/pkg/rec.jsonl' >> /etc/slurm-coloc/coloc.yaml")


def _serving(host: Host) -> None:
    """The sampler filled the node database and the reader answers on its socket (as an ordinary user)."""
    host.run("for i in $(seq 150); do [ -s /var/lib/slurm-coloc/nodes/h1.db ] && "
             "[ -S /run/slurm-coloc/report.sock ] && exit 0; sleep 0.2; done; exit 1", timeout=60)
    assert _rows(host) > 0
    host.run("id nobody")
    mine = host.run("coloc-report --json", user="nobody", check=False)
    assert mine.returncode == 0 and json.loads(mine.stdout)["jobs"] == [], mine.stderr


def test_init_scripts_run_the_daemons_on_a_host_without_systemd(host: Host) -> None:
    """docs/admin.md "Without systemd": /etc/init.d/<name> start|status|stop; a config error is one line at
    start."""
    assert host.run("test -d /run/systemd/system || echo none").stdout == "none\n"
    _daemon_config(host)
    try:
        for name in ("coloc-sampler", "coloc-report"):
            out = host.run(f"/etc/init.d/{name} start")
            assert f"{name} started (pid " in out.stdout, out.stdout + out.stderr
            assert host.run(f"/etc/init.d/{name} status").stdout.startswith(f"{name} is running")
        _serving(host)
        # the init script's hardening: no new privileges and the unit's capability bounding set
        pid = host.run("cat /run/slurm-coloc/init/coloc-report.pid").stdout.strip()
        status = host.run(f"grep -E '^(NoNewPrivs|CapBnd)' /proc/{pid}/status").stdout
        assert "NoNewPrivs:\t1" in status and "CapBnd:\t00000000000000" in status, status
        for name in ("coloc-sampler", "coloc-report"):
            assert f"{name} stopped" in host.run(f"/etc/init.d/{name} stop").stdout
            assert host.run(f"/etc/init.d/{name} status", check=False).returncode == 3
        assert _ours_running(host) == ""
        host.run("echo 'gpu_mem_gib: [80' >> /etc/slurm-coloc/coloc.yaml")
        bad = host.run("/etc/init.d/coloc-report start", check=False, timeout=60)
        assert bad.returncode == 1 and "coloc-report did not start: coloc-report: error:" in bad.stderr, \
            bad.stderr
    finally:
        host.run("cp /srv/pkg/coloc.yaml.shipped /etc/slurm-coloc/coloc.yaml")
        host.run("rm -f /var/lib/slurm-coloc/nodes/h1.db*")


def test_each_unit_starts_and_serves_under_its_hardening(host: Host) -> None:
    """Each long-running unit as systemd would run it with its hardening (NoNewPrivileges, the capability
    bounding set, PrivateTmp, ProtectSystem=full, ProtectHome=read-only): the sampler writes the node
    database and the reader serves a user. (The placer and the fallback run hardened in
    tests/cluster/test_multihost.py, against a real slurmctld.)"""
    _daemon_config(host)
    try:
        for unit in ("coloc-sampler.service", "coloc-report.service"):
            text = host.run(f"cat /lib/systemd/system/{unit}").stdout
            host.spawn(unit_command(text), f"/var/log/{unit}.log")
        _serving(host)
        pid = _our_pids(host, "coloc-sampler")[0]
        status = host.run(f"grep -E '^(NoNewPrivs|CapBnd)' /proc/{pid}/status").stdout
        assert "NoNewPrivs:\t1" in status and "CapBnd:\t0000000000000000" not in status, status
        # its own mount namespace, inside the host's root (-r): /usr read-only there (nothing is written)
        assert host.run(f"nsenter -t {pid} -m -r sh -c '[ -w /usr ] && echo writable || echo read-only; "
                        "[ -w /var/lib/slurm-coloc ] && echo writable'").stdout == "read-only\nwritable\n"
    finally:
        pids = _our_pids(host, "coloc-sampler") + _our_pids(host, "coloc-report")
        host.run(f"kill -TERM {' '.join(pids)} 2>/dev/null; sleep 1" if pids else "true")
        host.run("cp /srv/pkg/coloc.yaml.shipped /etc/slurm-coloc/coloc.yaml; "
                 "rm -f /var/lib/slurm-coloc/nodes/h1.db*")
    assert _ours_running(host) == ""


ESTIMATE = ("coloc-estimate --no-server --no-cache --model torchvision.models:resnet18 --input-shape 3,32,32 "
            "--batch-size 8 --json")


def test_the_documented_torch_step_makes_estimates_work(host: Host) -> None:
    """Step 10 of "Production install": a site environment with torch and numpy (here this machine's, shared
    at /opt/coloc-torch like an NFS install), linked with coloc-admin torch. Before it, one error line."""
    before = host.run(ESTIMATE, check=False, timeout=120)
    assert before.returncode == 2 and len(before.stderr.strip().splitlines()) == 1, before.stderr
    assert "is not installed" in before.stderr and "coloc-admin torch" in before.stderr
    out = host.run(f"coloc-admin torch {SITE_TORCH}", timeout=180)
    assert out.stdout.startswith("torch ") and "numpy" in out.stdout, out.stdout
    est = host.run(ESTIMATE, timeout=300)
    assert json.loads(est.stdout)["estimate_mib"] > 0
    # the bundled packages are the venv's own: what the site's environment also holds does not replace them
    where = host.run("/usr/lib/slurm-coloc/venv/bin/python3 -c 'import click, torch; print(click.__file__);"
                     " print(torch.__file__)'").stdout.split()
    assert where[0].startswith("/usr/lib/slurm-coloc/venv/") and where[1].startswith(SITE_TORCH)
    assert host.run("coloc-admin torch /srv/pkg", check=False).returncode == 2


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


def test_an_upgrade_starts_again_what_the_init_scripts_ran(host: Host) -> None:
    """Without systemd: a daemon its init script ran is stopped before the files change and started again
    after (a new process of the new code); one that was not running stays stopped."""
    host.run("/etc/init.d/coloc-report start")
    before = _our_pids(host, "coloc-report")
    out = host.run(f"{APT} install --reinstall /srv/pkg/upgrade.deb", timeout=300)
    assert "did not start again" not in out.stdout + out.stderr, out.stdout + out.stderr
    after = _our_pids(host, "coloc-report")
    assert len(before) == 1 and len(after) == 1 and after != before
    assert host.run("/etc/init.d/coloc-sampler status", check=False).returncode == 3
    host.run("/etc/init.d/coloc-report stop")
    assert _ours_running(host) == ""


def test_removal_leaves_nothing_running_and_keeps_config_and_databases(host: Host) -> None:
    _start_sampler(host)
    # what an admin enabled: units (as `systemctl enable` links them) and init scripts at boot (update-rc.d)
    enabled = host.run("systemctl enable coloc-sampler.service coloc-report.service coloc-placer.service "
                       "2>&1; update-rc.d coloc-sampler defaults 2>&1; "
                       "ls /etc/systemd/system/*.wants/ /etc/rc2.d/")
    assert enabled.stdout.count("coloc-") >= 4, enabled.stdout
    # a slurm.conf that still names the hooks (coloc-admin enable, never disabled)
    host.run("install -d /etc/slurm && "
             "echo Prolog=/usr/lib/slurm-coloc/hooks/prolog.sh >> /etc/slurm/slurm.conf")
    # F5: a user's process whose command line is a glob of the whole tree (root's shell must not expand it)
    host.run("runuser -u nobody -- setsid python3 -c 'import time; time.sleep(600)' "
             "'/*/*/*/*/*/*/*/*/*/*/*/*' '$(touch /tmp/f5)' </dev/null >/dev/null 2>&1 &")
    t0 = time.monotonic()
    out = host.run(f"{APT} remove slurm-coloc", timeout=300)
    assert time.monotonic() - t0 < 120
    said = out.stdout + out.stderr  # apt shows the maintainer scripts' output on its stdout
    assert "still names /usr/lib/slurm-coloc" in said and "coloc-admin disable" in said, said
    assert "time.sleep(600)" in host.run("ps -eo args").stdout  # not ours: untouched
    assert host.run("test -e /tmp/f5 || echo no").stdout == "no\n"
    assert _ours_running(host) == ""
    assert host.run("test -e /usr/bin/coloc-admin || test -e /usr/lib/slurm-coloc "
                    "|| echo gone").stdout == "gone\n"
    assert "gpu_mem_gib: 40" in host.run("cat /etc/slurm-coloc/coloc.yaml").stdout
    assert host.run("test -s /var/lib/slurm-coloc/nodes/h1.db && echo kept").stdout == "kept\n"
    out = host.run(f"{APT} purge slurm-coloc")
    assert "databases in /var/lib/slurm-coloc are kept" in out.stdout + out.stderr
    left = host.run("find /etc/systemd /etc/rc?.d /etc/init.d -name '*coloc*'; "
                    "find -L /etc/systemd/system -type l").stdout
    assert left == "", left  # no link to a unit or init script that is gone
    assert host.run("test -e /etc/slurm-coloc || echo gone; test -s /var/lib/slurm-coloc/nodes/h1.db && echo "
                    "kept"
                    ).stdout == "gone\nkept\n"
