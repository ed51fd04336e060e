"""Test helper: separate "hosts" on this machine, each a network, UTS, mount, IPC and PID namespace of its
own.

A host has its own hostname, its own address on a bridge (10.201.0.0/24, in a switch namespace of its own, so
the machine's own network is untouched), its own root filesystem and its own processes:

- root: an overlay of this machine's ``/`` (read-only lower) with an in-memory upper layer, entered with
  ``chroot``: packages are installed into it with the host's own ``apt-get``/``dpkg`` (its own dpkg database
  copy), so each host runs what was installed there and nothing reaches the machine's ``/``;
- ``/run`` and ``/tmp`` are its own (so its munged has its own socket), ``/proc`` shows only its processes;
- ``shared`` directories (``{host path: path inside}``) are bind-mounted on every host, like NFS home and
  state.

``Hosts.stop`` kills each host's PID 1 (the kernel then kills every process of that host), deletes the network
namespaces and removes the directories: nothing is left behind. Needs root, ``ip`` (iproute2), ``unshare``,
``nsenter`` and overlayfs.
"""
from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

SUBNET = "10.201.0"
# PID 1 of a host: reaps every orphan (daemons double-fork), so nothing lingers as a zombie.
REAPER = ("import os, signal, time\nsignal.signal(signal.SIGTERM, lambda *a: os._exit(0))\nwhile True:\n"
          "    try:\n        os.wait()\n    except ChildProcessError:\n        time.sleep(0.5)\n")


@dataclass
class Host:
    """One namespace host: ``name`` (its hostname), ``addr`` (its address), ``pid`` (its PID 1 seen from
    here)."""

    name: str
    addr: str
    dir: Path
    netns: str
    pid: int = 0
    proc: Optional[subprocess.Popen] = None

    def run(self, cmd: str, check: bool = True, timeout: float = 300, user: Optional[str] = None,
            env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
        """Run ``cmd`` (sh) on this host as root or ``user`` (login-like environment: PATH of the host and
        Debian's login umask 022, whatever the umask of the test run)."""
        envs = [f"{k}={v}" for k, v in (env or {}).items()]
        inner = ["env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8", *envs,
                 "/bin/sh", "-c", f"umask 022\n{cmd}"]
        if user:
            inner = ["runuser", "-u", user, "--", *inner]
        argv = ["nsenter", "-t", str(self.pid), "-m", "-u", "-n", "-i", "-p", "-r", "-w", *inner]
        out = subprocess.run(argv, text=True, capture_output=True, timeout=timeout)
        if check and out.returncode != 0:
            raise RuntimeError(f"{self.name}: {cmd!r} exited {out.returncode}: {out.stderr.strip()[-2000:]}")
        return out

    def spawn(self, cmd: str, log: str) -> None:
        """Start ``cmd`` on this host in the background (its own session), output to ``log`` (a path
        inside)."""
        self.run(f"setsid sh -c {shlex.quote(cmd + ' >>' + log + ' 2>&1')} </dev/null >/dev/null 2>&1 &")


@dataclass
class Hosts:
    """The namespace hosts of one test, with their switch."""

    tag: str
    base: Path
    shared: Dict[str, str] = field(default_factory=dict)
    hosts: Dict[str, Host] = field(default_factory=dict)

    @property
    def switch(self) -> str:
        return f"cs{self.tag}"

    def start(self, names: List[str]) -> None:
        """Create the switch, then each host (address .10, .11, ... in order); waits until each is up."""
        self.base.mkdir(parents=True, exist_ok=True)
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, name in enumerate(names):
            self._start_host(name, f"{SUBNET}.{10 + i}")
        hosts_file = "127.0.0.1 localhost\n" + "".join(f"{h.addr} {h.name}\n" for h in self.hosts.values())
        for h in self.hosts.values():
            h.run(f"printf %s {shlex.quote(hosts_file)} > /etc/hosts")

    def _start_host(self, name: str, addr: str) -> None:
        hdir = self.base / name
        for d in ("layer", "root"):
            (hdir / d).mkdir(parents=True, exist_ok=True)
        netns = f"ch{self.tag}{name}"
        _ip("netns", "add", netns)
        _ip("link", "add", "eth0", "netns", netns, "type", "veth", "peer", "name", f"v{name}", "netns",
            self.switch)
        _ip("-n", self.switch, "link", "set", f"v{name}", "master", "br0", "up")
        _ip("-n", netns, "addr", "add", f"{addr}/24", "dev", "eth0")
        _ip("-n", netns, "link", "set", "eth0", "up")
        _ip("-n", netns, "link", "set", "lo", "up")
        r = hdir / "root"
        binds = "".join(f"mkdir -p -m 0755 {r}{inside}; mount --bind {outside} {r}{inside}\n"
                        for outside, inside in self.shared.items())
        init = f"""set -e
umask 022
mount -t tmpfs -o size=4g,mode=0755 layer {hdir}/layer
mkdir -m 0755 {hdir}/layer/upper {hdir}/layer/work
mount -t overlay overlay -o lowerdir=/,upperdir={hdir}/layer/upper,workdir={hdir}/layer/work {r}
mount -t proc proc {r}/proc
mount --rbind /dev {r}/dev
mount --rbind /sys {r}/sys
mount -t tmpfs -o mode=0755 run {r}/run
mount -t tmpfs -o mode=1777 tmp {r}/tmp
{binds}hostname {name}
echo up > {hdir}/ready
exec chroot {r} /usr/bin/python3 -c {shlex.quote(REAPER)}
"""
        # nsenter, not ``ip netns exec``: the latter remounts /sys without the cgroup mounts slurmd needs
        proc = subprocess.Popen(["nsenter", f"--net=/run/netns/{netns}", "unshare", "--mount", "--uts",
                                 "--ipc",
                                 "--pid", "--fork", "--propagation", "private", "/bin/sh", "-c", init],
                                stdout=subprocess.DEVNULL, stderr=open(hdir / "init.log", "w"))
        host = Host(name, addr, hdir, netns, proc=proc)
        self.hosts[name] = host
        deadline = time.time() + 30
        while time.time() < deadline and not (hdir / "ready").exists():
            if proc.poll() is not None:
                raise RuntimeError(f"host {name} did not start: {(hdir / 'init.log').read_text()}")
            time.sleep(0.05)
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        host.pid = int(children[0])
        for _ in range(100):  # until PID 1 runs chrooted
            if os.readlink(f"/proc/{host.pid}/root") != "/":
                break
            time.sleep(0.05)

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def stop(self) -> None:
        """Kill every host (its PID 1: the kernel kills the rest), delete the namespaces and directories."""
        for h in self.hosts.values():
            if h.pid:
                try:
                    os.kill(h.pid, 9)
                except ProcessLookupError:
                    pass
            if h.proc is not None:
                try:
                    h.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    h.proc.kill()
            subprocess.run(["ip", "netns", "del", h.netns], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.switch], capture_output=True)
        if os.environ.get("COLOC_TEST_KEEP") != "1":
            shutil.rmtree(self.base, ignore_errors=True)


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], text=True, capture_output=True)
    if out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")


def built_deb() -> Path:
    """``$COLOC_DEB`` if set, else scripts/build_deb.sh's package of this tree, built once per tree state into
    ``/tmp/coloc-deb-<hash>`` (the hash of HEAD and of the uncommitted changes)."""
    if os.environ.get("COLOC_DEB"):
        return Path(os.environ["COLOC_DEB"])
    repo = Path(__file__).resolve().parents[1]
    state = subprocess.run(["sh", "-c", "git rev-parse HEAD; git status --porcelain; git diff HEAD"],
                           cwd=repo,
                           capture_output=True, text=True).stdout
    out = Path(f"/tmp/coloc-deb-{hashlib.sha256(state.encode()).hexdigest()[:12]}")
    found = sorted(out.glob("slurm-coloc_*.deb"))
    if found:
        return found[-1]
    proc = subprocess.run([str(repo / "scripts" / "build_deb.sh"), str(out)], capture_output=True, text=True,
                          timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"build_deb.sh failed: {proc.stderr.strip()[-2000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


HARDENING = ("NoNewPrivileges", "PrivateTmp", "ProtectSystem", "ProtectHome", "CapabilityBoundingSet")


def unit_exec(text: str) -> Dict[str, str]:
    """``{"ExecStart": ..., "Environment": "K=V ...", "NoNewPrivileges": "yes", ...}`` of a systemd unit's
    text (the keys tests run by hand, ``HARDENING`` included: there is no systemd in CI)."""
    out: Dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key in ("ExecStart", "Environment", *HARDENING):
            out[key] = (out.get(key, "") + " " + value).strip()
    return out


def unit_command(text: str) -> str:
    """A shell command that runs the unit's ``ExecStart`` as systemd would, with the hardening of the unit
    that can be had without systemd: the capability bounding set and no-new-privileges (``setpriv``), a
    private ``/tmp``, ``/usr``, ``/boot`` and ``/etc`` read-only (``ProtectSystem=full``) and
    ``/home``, ``/root`` read-only (``ProtectHome=read-only``) in a mount namespace of its own (``unshare``).
    A unit whose daemon needs more than its unit grants fails here as it would under systemd.

    Args:
        text: the unit file's text.

    Raises:
        ValueError: a hardening value this emulation does not know (so a new setting is never silently
            skipped).
    """
    spec = unit_exec(text)
    mounts: List[str] = []
    if spec.get("PrivateTmp", "no") == "yes":
        mounts.append("mount -t tmpfs -o mode=1777 private-tmp /tmp")
    system = spec.get("ProtectSystem", "no")
    if system not in ("no", "full"):
        raise ValueError(f"ProtectSystem={system}: not emulated")
    home = spec.get("ProtectHome", "no")
    if home not in ("no", "read-only"):
        raise ValueError(f"ProtectHome={home}: not emulated")
    ro = ["/usr", "/boot", "/etc"] if system == "full" else []
    ro += ["/home", "/root"] if home != "no" else []
    mounts += [f"if [ -d {d} ]; then mount --bind {d} {d} && mount -o remount,bind,ro {d}; fi" for d in ro]
    priv = ["setpriv"]
    if spec.get("NoNewPrivileges", "no") == "yes":
        priv.append("--no-new-privs")
    if "CapabilityBoundingSet" in spec:
        caps = spec["CapabilityBoundingSet"].split()
        if any(c.startswith("~") or not c.startswith("CAP_") for c in caps):
            raise ValueError(f"CapabilityBoundingSet={' '.join(caps)}: only an allow list is emulated")
        priv.append("--bounding-set=-all" + "".join(f",+{c[4:].lower()}" for c in caps))
    run = f"exec {' '.join(priv)} env {spec.get('Environment', '')} {spec['ExecStart']}"
    inner = "; ".join(["set -e", *mounts, run])
    return f"unshare -m --propagation private sh -c {shlex.quote(inner)}"


SITE_TORCH = "/opt/coloc-torch"


def site_torch_share() -> Dict[str, str]:
    """A shared mount for ``Hosts(shared=...)`` that gives every host this interpreter's torch and numpy at
    ``SITE_TORCH`` (a Python environment's layout: ``<SITE_TORCH>/lib/pythonX.Y/site-packages``), as a site
    shares one torch install over NFS; ``coloc-admin torch /opt/coloc-torch`` links it into the package's
    venv.

    The source is resolved (``realpath``) on this machine: wherever the checkout and its venv live (a clone
    under ``/tmp``, which every host replaces with its own), the hosts see the files through the mount."""
    import sys

    import numpy
    import torch

    site = os.path.realpath(Path(torch.__file__).parents[1])
    if os.path.realpath(Path(numpy.__file__).parents[1]) != site:
        raise RuntimeError(f"torch ({site}) and numpy are not in one site-packages directory")
    xy = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    return {site: f"{SITE_TORCH}/lib/{xy}/site-packages"}
