"""The munge check of ``coloc-admin check``: with ``AuthType=auth/munge`` this host needs the site's key and a
running munged, or slurmd/slurmctld cannot authenticate (a node without them never registers; it is not
drained).

The key path and socket are munged's defaults (munged(8)): ``/etc/munge/munge.key``,
``/run/munge/munge.socket.2``; ``AuthInfo=socket=...`` in slurm.conf names another socket.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import List, Optional

from slurm_coloc.admin.result import Check, fail, ok
from slurm_coloc.admin.slurmconf import SlurmConf

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
