"""Which role this host has in the cluster, for ``coloc-admin check``: ``controller`` (named by
``SlurmctldHost``, or the older ``ControlMachine``/``BackupController``), ``compute`` (a ``NodeName`` or
``NodeHostname`` of slurm.conf), or ``login`` (neither: where users submit). A host can be controller and
compute at once (a one-host cluster): then the compute node's checks apply.

A controller or login host has no GPUs of its own: the GPU device files of gres.conf, NVML, MPS and the
sampler's endpoint are checked only on a compute node, and there only for its own node's lines.
"""
from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from typing import FrozenSet, List, Optional, Set

from slurm_coloc.admin.slurmconf import SlurmConf, expand_hostlist

ROLES = ("controller", "compute", "login")
_CTLD = re.compile(r"^\s*(SlurmctldHost|ControlMachine|BackupController)\s*=\s*([^\s#]+)", re.IGNORECASE)


@dataclass(frozen=True)
class HostRole:
    """``roles`` (a subset of ``ROLES``), the host ``name`` it was told by, and ``nodes``: this host's own
    NodeNames (empty unless compute)."""

    roles: FrozenSet[str]
    name: str
    nodes: FrozenSet[str]
    how: str

    @property
    def gpu(self) -> bool:
        """Whether GPU checks apply (a compute node)."""
        return "compute" in self.roles

    def describe(self) -> str:
        """One line: ``ctl: controller (SlurmctldHost)``."""
        return f"{self.name}: {' and '.join(r for r in ROLES if r in self.roles)} ({self.how})"


def controllers(slurm_text: str) -> FrozenSet[str]:
    """Short names of every ``SlurmctldHost=``/``ControlMachine=``/``BackupController=`` host."""
    out = set()
    for line in slurm_text.splitlines():
        m = _CTLD.match(line)
        if m:
            out.add(m.group(2).split("(", 1)[0].split(".", 1)[0])
    return frozenset(out)


def detect(conf: Optional[SlurmConf], slurm_text: str, role: str = "auto",
           hostname: Optional[str] = None) -> HostRole:
    """This host's ``HostRole`` from slurm.conf (None: ``login``), or ``role`` when not ``auto``."""
    name = (hostname or socket.gethostname()).split(".", 1)[0]
    nodes: Set[str] = set()
    for node in (conf.nodes if conf else []):
        names = expand_hostlist(node.get("nodename", ""))
        hosts = expand_hostlist(node.get("nodehostname", "")) or names
        if names and names[0].lower() != "default":
            nodes.update(n for n, h in zip(names, hosts + names[len(hosts):]) if name in (n, h.split(".")[0]))
    if role != "auto":
        return HostRole(frozenset({role}), name, frozenset(nodes) if role == "compute" else frozenset(),
                        "--role")
    roles: Set[str] = set()
    how: List[str] = []
    if name in controllers(slurm_text):
        roles.add("controller")
        how.append("SlurmctldHost")
    if nodes:
        roles.add("compute")
        how.append(f"NodeName={','.join(sorted(nodes))}")
    if not roles:
        return HostRole(frozenset({"login"}), name, frozenset(), "not in SlurmctldHost or NodeName")
    return HostRole(frozenset(roles), name, frozenset(nodes), ", ".join(how))
