"""The host checks of ``coloc-admin check``, and its result type ``Check``: munge, the hook programs, and a
GPU node's NVML, MPS, metrics endpoint and MPS protection (``checks.py``'s ``run_all`` runs them after the
cluster config checks). A check never raises for a broken setup: it reports ``fail`` with the fix.

- munge: with ``AuthType=auth/munge`` the host needs the site's key and a running munged, or
  slurmd/slurmctld cannot authenticate (the node never registers). Key and socket are munged(8)'s defaults;
  ``AuthInfo=socket=`` names another socket.
- hooks: each program slurm.conf's hook keys name exists, is executable and cannot be replaced by a non-root
  user. A ``Prolog``/``Epilog`` glob (jobstats' ``/etc/slurm/prolog.d/*.sh``) is checked file by file and must
  hold slurm-coloc's script.
- GPU checks are skipped with ``--no-gpu`` or on a host that is not a compute node (the reason is given).
- ``coloc-admin torch DIR`` (``check_torch_site``, ``pth_path``): the venv gets a site's PyTorch and NumPy
  (several GiB, not in the Debian package) by a ``.pth`` file, checked first; its path is appended to
  ``sys.path``, so the venv's own packages come first and are never replaced.
"""
from __future__ import annotations

import glob
import json
import os
import stat
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional, Union

from slurm_coloc.admin.slurmconf import SlurmConf, expand_hostlist
from slurm_coloc.admin.switch import GLOB_KEYS, MARK, is_glob
from slurm_coloc.config import Config
from slurm_coloc.errors import ColocError


@dataclass(frozen=True)
class Check:
    """One result: ``status`` pass|fail|skip|warn (works, but see ``fix``), ``what`` the finding, ``fix`` what
    to do (empty when passing)."""

    name: str
    status: str
    what: str
    fix: str = ""

    def to_json(self) -> Dict[str, str]:
        return asdict(self)


def ok(name: str, what: str) -> Check:
    return Check(name, "pass", what)


def fail(name: str, what: str, fix: str) -> Check:
    return Check(name, "fail", what, fix)


KEY = Path("/etc/munge/munge.key")
SOCKET = "/run/munge/munge.socket.2"


def _socket(conf: SlurmConf) -> str:
    for item in conf.get("AuthInfo").split(","):
        key, _, value = item.partition("=")
        if key.strip().lower() == "socket" and value.strip():
            return value.strip()
    return SOCKET


def check_munge(conf: Optional[SlurmConf], key: Path = KEY, timeout_s: float = 5.0) -> List[Check]:
    """``skip`` (not munge/root), ``fail`` (no key; munge/unmunge fails in ``timeout_s``) or ``pass``."""
    name = "munge"
    if conf is None or conf.get("AuthType", "auth/munge") != "auth/munge":
        return [Check(name, "skip", "AuthType is not auth/munge")]
    if os.geteuid() != 0:
        return [Check(name, "skip", f"{key} is readable by root only: run as root to check it")]
    if not key.is_file():
        return [fail(name,
                     f"no munge key at {key}: munged cannot start and Slurm cannot authenticate on this host",
                     "copy the site's key from the controller: install -o munge -g munge -m 0400 munge.key "
                     f"{key}")]
    sock = _socket(conf)
    try:
        cred = subprocess.run(["munge", "-n", "-S", sock], capture_output=True, timeout=timeout_s)
        back = subprocess.run(["unmunge", "-S", sock], input=cred.stdout, capture_output=True,
                              timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [fail(name, f"munge/unmunge could not run: {exc}", "apt-get install munge")]
    if cred.returncode != 0 or back.returncode != 0:
        why = " ".join((cred.stderr or back.stderr).decode(errors="replace").split())[:200]
        return [fail(name, f"munged does not answer at {sock}: {why}",
                     "systemctl start munge (journalctl -u munge)")]
    return [ok(name, f"key {key}, munged answers at {sock}")]


HOOK_KEYS = ("Prolog", "Epilog", "PrologSlurmctld", "EpilogSlurmctld", "TaskProlog")


def unsafe_path(path: Path) -> Optional[str]:
    """Why ``path`` (links resolved) or a directory above it could be replaced by a non-root user; None when
    safe.

    Safe: owned by root and not writable by group or others; a world-writable directory only with the sticky
    bit and root ownership (``/tmp``). A path that cannot be read gives its error; never raises ``OSError``.
    """
    p = path.resolve()
    for q in [p, *p.parents]:
        try:
            st = q.stat()
        except OSError as exc:
            return f"{q}: {exc.strerror or exc}"
        if st.st_uid != 0:
            return f"{q} is owned by uid {st.st_uid}, not root"
        mode = stat.S_IMODE(st.st_mode)
        if mode & (stat.S_IWGRP | stat.S_IWOTH):
            if stat.S_ISDIR(st.st_mode) and mode & stat.S_ISVTX and q != p:
                continue
            return f"{q} is writable by {'others' if mode & stat.S_IWOTH else 'its group'} (mode {mode:o})"
    return None


def _one(key: str, p: Path) -> Check:
    if not p.is_file():
        return fail("hooks", f"{key}={p} does not exist", f"install the hook at {p} or fix {key}=")
    if not os.access(p, os.X_OK):
        return fail("hooks", f"{key}={p} is not executable", f"chmod 0755 {p}")
    why = unsafe_path(p)
    if why:
        return fail("hooks", f"{key}={p} runs as root but {why}",
                    f"chown root:root {p} and its directories; chmod go-w them")
    return ok("hooks", f"{key}={p}")


def _ours(p: str) -> bool:
    try:
        return MARK in Path(p).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


def check_hooks(conf: SlurmConf) -> List[Check]:
    """One ``Check`` per configured hook program (a glob's files each, one of them slurm-coloc's)."""
    out: List[Check] = []
    for key in HOOK_KEYS:
        value = conf.get(key)
        if not value:
            continue
        if key in GLOB_KEYS and is_glob(value) and "[" not in value:
            files = sorted(glob.glob(value))
            out += [_one(key, Path(f)) for f in files]
            if not any(_ours(f) for f in files):
                out.append(fail("hooks", f"{key}={value} matches no slurm-coloc hook",
                                "coloc-admin enable --write puts one in that directory"))
            continue
        paths = [Path(p) for p in expand_hostlist(value)] if "[" in value else [Path(value)]
        out += [Check("hooks", "skip", f"{key}={p}: a glob, check its files by hand") if is_glob(str(p))
                else _one(key, p) for p in paths]
    return out


def _why(no_gpu: Union[bool, str]) -> str:
    return no_gpu if isinstance(no_gpu, str) else "--no-gpu"


def check_gpu(cfg: Config, no_gpu: Union[bool, str]) -> List[Check]:
    """NVML answers and lists GPUs; the MPS control and server binaries exist (unless mps_mode is off)."""
    if no_gpu:
        return [Check("NVML", "skip", f"{_why(no_gpu)}: not a GPU node"),
                Check("MPS", "skip", f"{_why(no_gpu)}: not a GPU node")]
    from slurm_coloc.errors import ColocError
    from slurm_coloc.node import mps_daemon
    from slurm_coloc.nvml import reader

    out: List[Check] = []
    try:
        uuids = reader.gpu_uuids()
        out.append(ok("NVML", f"{len(uuids)} GPU(s): {', '.join(uuids.values())}") if uuids else fail(
            "NVML", "NVML answers but lists no GPU", "check nvidia-smi; is this a GPU node?"))
    except ColocError as exc:
        out.append(fail("NVML", f"NVML not available: {exc.message}",
                        (exc.hint or "install the NVIDIA driver")
                        + "; on a node without GPUs run with --no-gpu"))
    if cfg.mps_mode == "off":
        out.append(Check("MPS", "skip", "mps_mode: off"))
        return out
    control = mps_daemon.resolve_binary(cfg)
    if not control:
        out.append(fail("MPS", f"{cfg.mps_control_bin} not found "
                               f"(PATH and {', '.join(mps_daemon.EXTRA_BIN_DIRS)})",
                        "install the CUDA MPS binaries (nvidia-cuda-mps-control/-server), set "
                        "mps_control_bin, "
                        "or set mps_mode: off"))
    else:
        server = Path(control).with_name("nvidia-cuda-mps-server")
        out.append(ok("MPS", f"{control} and {server}") if os.access(server, os.X_OK) else fail(
            "MPS", f"{server} missing next to {control}", "install nvidia-cuda-mps-server with the driver"))
    return out


def check_metrics(cfg: Config, no_gpu: Union[bool, str], node: Optional[str] = None,
                  timeout_s: float = 3.0) -> List[Check]:
    """The sampler's Prometheus endpoint answers ``/metrics`` with slurm-coloc's families (docs/metrics.md).

    Skipped without GPUs, with ``exporter_port: 0``, or while no sampler runs on ``node`` (default: the short
    hostname; the Prolog starts one with the first GPU job).
    """
    import socket
    import urllib.error
    import urllib.request

    from slurm_coloc.node.sampler_daemon import running_pid
    name = "metrics endpoint"
    if no_gpu:
        return [Check(name, "skip", f"{_why(no_gpu)}: not a GPU node")]
    if not cfg.exporter_port:
        return [Check(name, "skip", "exporter_port: 0 (endpoint off)")]
    node = node or socket.gethostname().split(".")[0]
    pid = running_pid(cfg, node)
    if not pid:
        return [Check(name, "skip",
                      f"no sampler runs on {node} yet (the Prolog starts one with the first GPU job)")]
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(cfg.exporter_bind_address,
                                                                     cfg.exporter_bind_address)
    url = f"http://{'[' + host + ']' if ':' in host else host}:{cfg.exporter_port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            body = resp.read(8 << 20).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:  # something answers, with an error status
        body = f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        return [fail(name,
                     f"the sampler (pid {pid}) runs but {url} does not answer: {getattr(exc, 'reason', exc)}",
                     f"see {Path(cfg.log_dir) / f'sampler-{node}.log'} (port in use?); set exporter_port and "
                     "exporter_bind_address in coloc.yaml, or exporter_port: 0 to turn it off")]
    if "coloc_exporter_collect_errors" not in body:
        return [fail(name, f"{url} answers but is not slurm-coloc's sampler endpoint",
                     "another program holds exporter_port: choose a free port in coloc.yaml")]
    return [ok(name, f"{url} answers ({len(body.splitlines())} lines, {cfg.exporter_names} names)")]


def shared_gpus(cfg: Config) -> Dict[str, int]:
    """Daemon directory name -> member count of this node's MPS daemons serving a shard job now, from
    ``<run_dir>/mps/<key>[.uid<uid>]/members/*`` (the Prolog's); empty when unreadable."""
    out: Dict[str, int] = {}
    base = Path(cfg.run_dir) / "mps"
    try:
        roots = sorted(p for p in base.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return out
    for root in roots:
        try:
            n = sum(1 for m in (root / "members").iterdir() if not m.name.startswith("."))
        except OSError:
            continue
        if n:
            out[root.name] = n
    return out


def evaluate_mps_protection(cfg: Config, shared: Dict[str, int],
                            mode_of: Dict[str, Optional[str]]) -> List[Check]:
    """Per shared GPU: pass in ``EXCLUSIVE_PROCESS`` (only the MPS server opens a context), else fail: a job
    can allocate outside MPS (measured on the H100: 20 GiB in compute mode DEFAULT). ``mode_of``: GPU key
    (``GPU-<uuid>`` or ``idx<N>``) -> mode name, None when NVML could not say."""
    name = "MPS protection"
    if not shared:
        return [ok(name, "no GPU is shared under MPS now")]
    out: List[Check] = []
    fix = ("set mps_compute_mode: exclusive-process (mps_mode multi-user) or `nvidia-smi -i <gpu> -c "
           "EXCLUSIVE_PROCESS` while the GPU is shared; the watchdog (watchdog_action: stop) stops such a "
           "job "
           "after the fact but cannot prevent its allocation")
    for key in sorted({k.split(".uid")[0] for k in shared}):
        mode = mode_of.get(key)
        members = sum(n for k, n in shared.items() if k.split(".uid")[0] == key)
        if mode == "EXCLUSIVE_PROCESS":
            out.append(ok(name, f"{key}: shared by {members} job(s), compute mode EXCLUSIVE_PROCESS"))
        else:
            out.append(fail(name, f"{key}: shared by {members} job(s) under MPS in compute mode "
                                  f"{mode or 'unknown (NVML did not answer)'}: a job can open a context "
                                  "outside "
                                  f"MPS and take its neighbours' memory", fix))
    return out


def check_mps_protection(cfg: Config, no_gpu: Union[bool, str]) -> List[Check]:
    """Shared GPUs not in ``EXCLUSIVE_PROCESS`` (read through NVML, nothing changed; never raises)."""
    if no_gpu:
        return [Check("MPS protection", "skip", f"{_why(no_gpu)}: not a GPU node")]
    shared = shared_gpus(cfg)
    mode_of: Dict[str, Optional[str]] = {}
    if shared:
        try:
            from slurm_coloc.nvml import reader
            modes = reader.NvmlComputeModes()
            for index, uuid in reader.gpu_uuids().items():
                try:
                    mode: Optional[str] = modes.get(index)
                except Exception:  # one GPU not answering: unknown
                    mode = None
                mode_of[uuid] = mode_of[f"idx{index}"] = mode
        except Exception:  # no NVML: every mode unknown
            pass
    return evaluate_mps_protection(cfg, shared, mode_of)


PTH_NAME = "coloc-site-torch.pth"
PROBE = ("import json, sys; sys.path.append(sys.argv[1]); import numpy, torch; "
         "print(json.dumps({'torch': torch.__version__, 'numpy': numpy.__version__, "
         "'where': torch.__file__}))")


@dataclass
class TorchSite:
    """A checked site-packages directory and the ``torch`` and ``numpy`` versions found there."""

    path: Path
    torch: str
    numpy: str


def site_packages(target: Path) -> Path:
    """``target``'s ``lib/pythonX.Y/site-packages`` (X.Y this interpreter's), else ``target`` itself;
    ``ColocError`` when not absolute, not a directory, or a prefix for another Python version."""
    if not target.is_absolute():
        raise ColocError(f"{target}: give an absolute path", hint="e.g. coloc-admin torch /opt/coloc-torch")
    if not target.is_dir():
        raise ColocError(f"{target}: no such directory",
                         hint="python3 -m venv /opt/coloc-torch && "
                              "/opt/coloc-torch/bin/pip install torch numpy")
    xy = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    inner = target / "lib" / xy / "site-packages"
    if inner.is_dir():
        return inner
    others = sorted(p.parent.name for p in target.glob("lib/python3*/site-packages"))
    if others:
        raise ColocError(f"{target} is a Python environment for {', '.join(others)}, slurm-coloc runs {xy}",
                         hint=f"create it with /usr/bin/{xy} -m venv")
    return target


def check_torch_site(target: Path, python: str = sys.executable, timeout_s: float = 120.0) -> TorchSite:
    """Import torch and numpy from ``target`` in a fresh ``python`` within ``timeout_s``; ``ColocError``
    (with the import error's last line) when they do not import from it."""
    site = site_packages(target)
    try:
        # -I -S: nothing but the standard library and ``site`` (not the venv's own site-packages, nor a link
        # made earlier): torch and numpy must come from there
        proc = subprocess.run([python, "-I", "-S", "-c", PROBE, str(site)], capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ColocError(f"importing torch from {site} took over {timeout_s:.0f} s") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["exit status %d" % proc.returncode])[-1]
        raise ColocError(f"torch and numpy do not import from {site}: {last}",
                         hint=f"install them there: {target}/bin/pip install torch numpy")
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    return TorchSite(site, found["torch"], found["numpy"])


def pth_path(prefix: Optional[str] = None) -> Path:
    """``<prefix or sys.prefix>/lib/pythonX.Y/site-packages/coloc-site-torch.pth``."""
    xy = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    return Path(prefix or sys.prefix) / "lib" / xy / "site-packages" / PTH_NAME
