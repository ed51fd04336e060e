"""A real multi-host cluster: the controller and two compute nodes, each a host of its own (network, UTS,
mount, IPC and PID namespaces; own address on a bridge, own hostname, own root filesystem:
tests/netns_hosts.py), with slurm-coloc installed on each from the built Debian package by the host's own apt,
and Debian's Slurm 22.05.

Set up as a site would: one munge key made on the controller and copied to each host's /etc/munge (each host
runs its own munged on its own socket); slurm.conf written for the site, then ``coloc-admin enable --write``
on the controller and the files copied to the nodes; the state directory shared by all hosts (the NFS mount
admin.md asks for); job files in a shared home. Daemons run from the package's systemd units
(no systemd in CI): the placer through its init script (docs/admin.md, "Without systemd"), the reader service
as its unit's ExecStart/Environment under the unit's hardening (tests/netns_hosts.unit_command). The nodes'
GPUs are fake (char devices 195,N), n1's sampler replays an H100 NVML recording, n2 has no NVML at all (its
sampler cannot start). PyTorch is a site's choice, not in the package: this machine's torch and numpy are
shared with every host at /opt/coloc-torch (an NFS install's layout; the mount's source resolved here, so the
test passes wherever the checkout and its venv live, /tmp included), and
``coloc-admin torch /opt/coloc-torch`` links them into the package's venv, the documented step.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from tests.netns_hosts import SITE_TORCH, Host, Hosts, site_torch_share, unit_command
from tests.slurm_cluster import REPO

pytestmark = pytest.mark.slurm
APT = "apt-get -q -y -o DPkg::Options::=--force-unsafe-io"
RECORDING = REPO / "tests" / "data" / "nvml" / "h100_mps_2jobs.jsonl"
USER = "colocuser"
SITE_SLURM_CONF = """\
ClusterName=mh
SlurmctldHost=ctl(10.201.0.10)
AuthType=auth/munge
AuthInfo=cred_expire=10
SlurmUser=root
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
GresTypes=gpu
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=/var/log/slurm/jobcomp.txt
MinJobAge=86400
ReturnToService=2
MailProg=/bin/true
SchedulerParameters=batch_sched_delay=0,sched_interval=2,bf_interval=2
NodeName=n1 NodeAddr=10.201.0.11 CPUs=8 RealMemory=4000 Gres=gpu:g0:1,gpu:g1:1,shard:g0:80,shard:g1:80
NodeName=n2 NodeAddr=10.201.0.12 CPUs=8 RealMemory=4000 Gres=gpu:g0:1,gpu:g1:1,shard:g0:80,shard:g1:80
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
SITE_GRES_CONF = "AutoDetect=off\n" + "".join(
    f"NodeName={n} Name=gpu Type=g{i} File=/opt/fakegpu/nvidia{i}\n"
    f"NodeName={n} Name=shard Type=g{i} Count=80 File=/opt/fakegpu/nvidia{i}\n" for n in ("n1", "n2")
    for i in (0, 1))
COLOC_YAML = "gpu_mem_gib: 80\nprobe: false\noom_rerun_per_user_max: 100\nplacement_recent_s: 4\n"


def _install(h: Host, deb: str) -> None:
    """What a site does on every host: the package, the job user (directory service), the shared munge key."""
    h.run("rm -f /var/lib/man-db/auto-update")  # this test host skips man-db's index rebuild (20 s)
    h.run(f"{APT} install /srv/pkg/{deb}", timeout=600)
    h.run(f"id {USER} >/dev/null 2>&1 || useradd -m -u 2001 {USER}")
    h.run("install -o munge -g munge -m 0400 /srv/site/munge.key /etc/munge/munge.key && "
          "install -d -o munge -g munge -m 0755 /run/munge && runuser -u munge -- /usr/sbin/munged")
    h.run(f"coloc-admin torch {SITE_TORCH}", timeout=300)  # "Production install", step 10
    h.run("install -d /var/spool/slurmctld /var/spool/slurmd /var/log/slurm")


def _start_unit(h: Host, unit: str) -> None:
    """The unit's command as systemd runs it, with the hardening that can be had without systemd."""
    h.spawn(unit_command(h.run(f"cat /lib/systemd/system/{unit}").stdout), f"/var/log/{unit}.log")


@pytest.fixture(scope="module")
def site(deb_package: Path) -> Iterator[Hosts]:
    if shutil.which("ip") is None:
        pytest.skip("iproute2 is not installed (scripts/install.sh installs it)")
    tag = str(os.getpid() % 100000)
    base = Path(f"/tmp/coloc-mh-{tag}")
    shared = {d: base / "shared" / d for d in ("pkg", "site", "home", "state")}
    for d in shared.values():
        d.mkdir(parents=True, exist_ok=True)
    shared["site"].chmod(0o700)
    (shared["home"] / "jobs").mkdir(mode=0o1777)
    os.chmod(shared["home"] / "jobs", 0o1777)
    shutil.copy(deb_package, shared["pkg"] / deb_package.name)
    shutil.copy(RECORDING, shared["pkg"] / "rec.jsonl")
    shutil.copytree(REPO / "examples", shared["home"] / "examples")
    subprocess.run(["chmod", "-R", "a+rX", str(shared["home"] / "examples"), str(shared["pkg"])], check=True)
    # the site's one munge key (mungekey(8) of munge 0.5.15), copied to every host below
    subprocess.run(["mungekey", "--create", "--keyfile", str(shared["site"] / "munge.key")], check=True)
    hosts = Hosts(tag, base / "hosts", {str(shared["pkg"]): "/srv/pkg", str(shared["site"]): "/srv/site",
                                        str(shared["home"]): "/srv/home",
                                        str(shared["state"]): "/var/lib/slurm-coloc", **site_torch_share()})
    try:
        hosts.start(["ctl", "n1", "n2"])
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda h: _install(h, deb_package.name), hosts.hosts.values()))
        ctl = hosts["ctl"]
        ctl.run(f"printf %s '{SITE_SLURM_CONF}' > /etc/slurm/slurm.conf; printf %s '{SITE_GRES_CONF}' > "
                "/etc/slurm/gres.conf")
        hosts.enable_out = ctl.run("coloc-admin enable --write").stdout  # type: ignore[attr-defined]
        # step 5: the files enable wrote (plugstack.conf.d/coloc.conf: Debian's plugstack.conf includes it)
        ctl.run("install -d /srv/site/slurm && cp -r /etc/slurm/. /srv/site/slurm/")
        for name, h in hosts.hosts.items():
            yaml = COLOC_YAML + ("sampler_replay_path: /srv/pkg/rec.jsonl\n" if name == "n1" else "")
            h.run(f"printf %s '{yaml}' > /etc/slurm-coloc/coloc.yaml")
            if name != "ctl":
                h.run("cp -r /srv/site/slurm/. /etc/slurm/ && install -d /opt/fakegpu && "
                      "mknod /opt/fakegpu/nvidia0 c 195 0 && mknod /opt/fakegpu/nvidia1 c 195 1")
        ctl.run("slurmctld")
        hosts["n1"].run("slurmd")
        hosts["n2"].run("slurmd")
        ctl.run("for i in $(seq 150); do s=$(sinfo -h -N -o '%N %t' | sort -u | tr '\\n' ' '); "
                "[ \"$s\" = 'n1 idle n2 idle ' ] && exit 0; sleep 0.2; done; echo \"$s\"; exit 1")
        assert "coloc-placer started" in ctl.run("/etc/init.d/coloc-placer start").stdout
        _start_unit(ctl, "coloc-report.service")
        ctl.run("for i in $(seq 100); do [ -s /run/slurm-coloc/placer.json ] && exit 0; sleep 0.1; done; "
                "exit 1")
    except Exception:
        for h in hosts.hosts.values():  # what the daemons said, for the failure report
            print(f"== {h.name}\n" + h.run("tail -n 20 /var/log/slurm/*.log /var/log/munge/munged.log 2>&1; "
                                             "cat /var/log/*.service.log 2>/dev/null", check=False).stdout)
        _teardown(hosts, base)
        raise
    try:
        yield hosts
    finally:
        _teardown(hosts, base)


def _teardown(hosts: Hosts, base: Path) -> None:
    hosts.stop()
    if os.environ.get("COLOC_TEST_KEEP") != "1":
        shutil.rmtree(base, ignore_errors=True)


def _job(ctl: Host, job_id: int) -> Dict[str, str]:
    """``scontrol show job -o`` as a dict."""
    text = ctl.run(f"scontrol show job -o {job_id}").stdout
    return dict(w.split("=", 1) for w in text.split() if "=" in w)


def _wait(ctl: Host, job_id: int, timeout: float = 240) -> Dict[str, str]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        job = _job(ctl, job_id)
        if job["JobState"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"):
            return job
        time.sleep(1)
    raise TimeoutError(f"job {job_id}: {_job(ctl, job_id)}")


def _sbatch(ctl: Host, args: str, env: str = "") -> subprocess.CompletedProcess:
    return ctl.run(f"cd /srv/home/jobs && env HOME=/tmp XDG_CACHE_HOME=/tmp/xdg-{USER} {env} {args}",
                   user=USER,
                   check=False, timeout=300)


def _drained(ctl: Host) -> str:
    return ctl.run("sinfo -h -N -o '%N %t' | grep -E 'drain|drng|drained' || true").stdout.strip()


def _live_commands(h: Host, single: str, wait_s: float = 10.0) -> List[str]:
    """The command names of the host's live processes (zombies left out), read again for up to ``wait_s``
    while ``single`` runs more or less than once: a daemon's fork while it starts, and the exited intermediate
    of its double fork until the host's PID 1 reaps it, show its name too (one CI run saw two "munged")."""
    deadline = time.time() + wait_s
    while True:
        rows = [ln.split(None, 1) for ln in h.run("ps -eo stat=,comm=").stdout.splitlines() if ln.strip()]
        procs = [r[1].strip() for r in rows if len(r) == 2 and not r[0].startswith("Z")]
        if procs.count(single) == 1 or time.time() > deadline:
            return procs
        time.sleep(0.5)


def test_hosts_are_separate_and_share_one_munge_key(site: Hosts) -> None:
    for name, addr in (("ctl", "10.201.0.10"), ("n1", "10.201.0.11"), ("n2", "10.201.0.12")):
        h = site[name]
        assert h.run("hostname").stdout.strip() == name
        assert f"inet {addr}/24" in h.run("ip -4 -o addr show eth0").stdout
        procs = _live_commands(h, "munged")
        assert procs.count("munged") == 1 and ("slurmctld" in procs) == (name == "ctl"), procs
        assert ("slurmd" in procs) == (name != "ctl")
        assert h.run("test -S /run/munge/munge.socket.2 && echo ok").stdout == "ok\n"
        # the package, not the repository: the product runs from /usr/lib/slurm-coloc
        where = h.run("/usr/lib/slurm-coloc/venv/bin/python3 -c 'import slurm_coloc; "
                      "print(slurm_coloc.__file__)'")
        assert where.stdout.startswith("/usr/lib/slurm-coloc/venv/lib/")
    # a credential made on n1 decodes on the controller: the same key, two munged
    cred = site["n1"].run("munge -n").stdout
    assert "STATUS:          Success" in site["ctl"].run(f"echo '{cred.strip()}' | unmunge").stdout
    assert "NodeAddr=10.201.0.11" in site["ctl"].run("scontrol show node n1").stdout
    assert "backup: /etc/slurm/slurm.conf.coloc-backup-" in site.enable_out  # type: ignore[attr-defined]
    assert "Prolog=/usr/lib/slurm-coloc/hooks/prolog.sh" in site["n2"].run("cat /etc/slurm/slurm.conf").stdout
    # step 9 of the production install: the node passes coloc-admin check (no NVML here: --no-gpu), and so
    # does the controller as it is, without options: it knows it is the controller and looks for no GPU
    check = site["n1"].run("coloc-admin check --no-gpu", check=False)
    assert check.returncode == 0 and "PASS  role: n1: compute (NodeName=n1)" in check.stdout, check.stdout
    check = site["ctl"].run("coloc-admin check", check=False)
    assert check.returncode == 0 and "PASS  role: ctl: controller (SlurmctldHost)" in check.stdout, \
        check.stdout
    assert "/opt/fakegpu" not in check.stdout
    assert site["ctl"].run("cat /etc/slurm/plugstack.conf").stdout == \
        "include /etc/slurm/plugstack.conf.d/*.conf\n"  # Debian's file, untouched: ours is coloc.conf
    # the placer fallback (a oneshot every 30 s) under its unit's hardening: the placer lives, nothing to do
    fallback = site["ctl"].run(unit_command(site["ctl"].run(
        "cat /lib/systemd/system/coloc-placer-fallback.service").stdout), check=False, timeout=120)
    assert fallback.returncode == 0, fallback.stdout + fallback.stderr
    # the packaged SPANK plugin, enabled by coloc-admin enable, is loaded by sbatch
    assert "--coloc-mem" in site["ctl"].run("sbatch --help").stdout


def test_main_job_through_coloc_sbatch_and_the_placer(site: Hosts) -> None:
    ctl = site["ctl"]
    env = "PYTHON=/usr/lib/slurm-coloc/venv/bin/python3 COLOC_EXAMPLES=/srv/home/examples"
    out = _sbatch(ctl, "coloc-sbatch --parsable -o digits-%j.out /srv/home/examples/train_digits.sh --epochs "
                       "15", env)
    assert out.returncode == 0, out.stderr
    assert "held for coloc-placer" in out.stderr, out.stderr
    job_id = int(out.stdout.strip())
    job = _wait(ctl, job_id)
    assert job["JobState"] == "COMPLETED", job
    node = job["NodeList"]
    assert node in ("n1", "n2")
    text = ctl.run(f"cat /srv/home/jobs/digits-{job_id}.out").stdout
    assert float(text.split("test_accuracy")[1].split()[0]) >= 0.95, text
    time.sleep(1.5)  # EpilogSlurmctld may still be writing
    # the node's hooks wrote the node's database (shared state directory), the controller's hooks ctld.db
    rows = ctl.run("/usr/bin/python3 -c \"import sqlite3, json; c = "
                   "sqlite3.connect('/var/lib/slurm-coloc/nodes/"
                   f"{node}.db'); print(json.dumps([list(r) for r in c.execute("
                   f"'SELECT hook, ok FROM hook_runs WHERE job_id = {job_id}')]))\"").stdout
    assert ["prolog", 1] in json.loads(rows) and ["epilog", 1] in json.loads(rows)
    report = ctl.run("coloc-report --json")
    view = next(j for j in json.loads(report.stdout)["jobs"] if j["job_id"] == job_id)
    assert (view["state"] == "COMPLETED" and view["user"] == USER if "user" in view
            else view["state"] == "COMPLETED")
    # the user's own report through the reader service on the controller
    mine = _sbatch(ctl, "coloc-report --json")
    assert mine.returncode == 0 and job_id in [j["job_id"]
                                               for j in json.loads(mine.stdout)["jobs"]], mine.stderr
    assert json.loads(ctl.run("cat /var/lib/slurm-coloc/placer.json").stdout)
    assert _drained(ctl) == ""


def test_coloc_mem_with_the_placer_and_spank_plugin_says_nothing_wrong_and_dry_run_is_what_is_submitted(
        site: Hosts) -> None:
    """The documented set-up (placer running, SPANK plugin enabled): --coloc-mem goes in held for the placer
    without the plugin's "reserves no GPU" note, and --dry-run prints the command that is then submitted."""
    ctl = site["ctl"]
    args = "--coloc-mem 3G -o mem-%j.out /srv/home/examples/train_digits.sh --epochs 15"
    env = "PYTHON=/usr/lib/slurm-coloc/venv/bin/python3 COLOC_EXAMPLES=/srv/home/examples"
    dry = _sbatch(ctl, f"coloc-sbatch --dry-run {args}", env)
    # the placer's form, as submit() runs it: held, no GRES, the comment asks for placement
    assert dry.returncode == 0 and dry.stdout.startswith("sbatch --hold "), dry.stdout + dry.stderr
    assert "--gres" not in dry.stdout and "--coloc-mem=3072M" in dry.stdout and '"place":true' in dry.stdout
    out = _sbatch(ctl, f"coloc-sbatch --parsable {args}", env)
    assert out.returncode == 0 and "held for coloc-placer" in out.stderr, out.stderr
    assert "reserves no GPU" not in out.stderr, out.stderr
    job_id = int(out.stdout.strip().splitlines()[-1])
    job = _wait(ctl, job_id)
    said = ctl.run(f"cat /srv/home/jobs/mem-{job_id}.out", check=False).stdout[-3000:]
    assert job["JobState"] == "COMPLETED", (job, said)
    assert re.search(r"shard(:g\d)?:3\b", job.get("TresPerNode", "")), job


def test_oom_on_shards_reruns_once_on_a_whole_gpu_on_a_node_without_sampler(site: Hosts) -> None:
    ctl = site["ctl"]
    comment = '--comment=coloc:{"v":1,"mode":"shard","shards":4,"mem_mib":3500,"sha256":"' + "ab" * 32 + '"}'
    out = _sbatch(ctl, f"sbatch --parsable -J oom-mh -w n2 --gres=shard:4 -o oom.out -e oom.err '{comment}' "
                       "/srv/home/examples/oom_job.sh 8")
    assert out.returncode == 0, out.stderr
    job_id = int(out.stdout.strip())
    assert _wait(ctl, job_id)["JobState"] == "FAILED"
    deadline, retry = time.time() + 120, None
    while retry is None and time.time() < deadline:
        found = ctl.run(f"squeue -h --states=all -o '%i %k' | grep 'oom-retry-of-{job_id}' "
                        "|| true").stdout.split()
        retry = int(found[0]) if found else None
        time.sleep(1)
    assert retry is not None, ctl.run("tail -5 /var/log/slurm-coloc/hooks.log", check=False).stdout
    done = _wait(ctl, retry)
    assert done["JobState"] == "COMPLETED" and "shard:80" in done.get("TresPerNode", ""), done
    assert "trained 10 steps with 80 GiB" in ctl.run("cat /srv/home/jobs/oom.out").stdout
    # n2 has no NVML: its sampler could not start, said so in one line per attempt, and n2 ran both jobs
    # undrained
    log = site["n2"].run("cat /var/log/slurm-coloc/sampler-n2.log 2>/dev/null || true").stdout
    errors = [ln for ln in log.splitlines() if " ERROR " in ln]
    assert errors and all("NVML" in ln or "nvml" in ln for ln in errors), log
    assert _drained(ctl) == ""


def test_bad_config_on_a_node_and_a_missing_munge_key_give_one_line_and_drain_nothing(site: Hosts) -> None:
    ctl, n1, n2 = site["ctl"], site["n1"], site["n2"]
    n1.run("cp /etc/slurm-coloc/coloc.yaml /tmp/coloc.yaml.good && printf 'gpu_mem_gib: [80\\n' > "
           "/etc/slurm-coloc/coloc.yaml")
    try:
        out = n1.run("coloc-admin config", check=False)
        assert (out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
                and "not valid YAML" in out.stderr)
        out = _sbatch(ctl, "sbatch --parsable -w n1 --gres=shard:2 -o bad.out --wrap 'echo ran'")
        job = _wait(ctl, int(out.stdout.strip()))
        assert job["JobState"] == "COMPLETED"
        assert "not valid YAML" in n1.run("cat /var/log/slurm-coloc/hooks.log").stdout
    finally:
        n1.run("cp /tmp/coloc.yaml.good /etc/slurm-coloc/coloc.yaml")
    n2.run("mv /etc/munge/munge.key /root/munge.key.away")
    try:
        out = n2.run("coloc-admin check --no-gpu -q", check=False)
        fails = [ln for ln in out.stdout.splitlines() if ln.startswith("FAIL  munge")]
        assert out.returncode == 1 and len(fails) == 1, out.stdout
        assert "no munge key at /etc/munge/munge.key" in fails[0]
    finally:
        n2.run("mv /root/munge.key.away /etc/munge/munge.key")
    assert "PASS  munge" in n2.run("coloc-admin check --no-gpu", check=False).stdout
    assert _drained(ctl) == ""
