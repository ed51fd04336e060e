"""Reading slurm.conf, gres.conf, plugstack.conf and cgroup.conf (pure functions on text; keys
case-insensitive), and what they say for ``coloc-admin check``: this host's role, and the settings whose
meaning differs by release.

Formats: slurm.conf(5), gres.conf(5), spank(8) of Slurm 22.05. ``Include`` lines are reported, not followed.
Host lists (``NodeName=gpu[01-04]``, ``File=/dev/nvidia[0-1]``) expand with ``slurm.parse.expand_hostlist``.

Roles: ``controller`` (``SlurmctldHost``, or the older ``ControlMachine``/``BackupController``), ``compute``
(a ``NodeName`` or ``NodeHostname``), else ``login``. A controller that is also compute gets the compute
checks; GPU device files, NVML, MPS and the sampler's endpoint are checked only on a compute node, for its own
nodes.

Per release (``docs/admin.md`` "Slurm versions", facts in ``docs/slurm-versions.md``): 22.05, 24.11 and 26.05
are tested, another is ``warn``; ``MULTIPLE_SHARING_GRES_PJ`` (23.11+; 22.05 refuses it) lets one job take
shards from several GPUs, breaking the one-GPU memory fence: ``fail``; ``cgroup/v1`` on 26.05+ works but is
deprecated: ``warn``.
"""
from __future__ import annotations

import re
import shlex
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, FrozenSet, List, Optional, Set, Tuple

from slurm_coloc.slurm.parse import expand_hostlist as expand_hostlist
from slurm_coloc.slurm.run import CGROUP_V1_DEPRECATED, MULTIPLE_SHARING_GRES, TESTED, SlurmVersion


@dataclass
class SlurmConf:
    """slurm.conf: global ``options`` (lower-case key -> value), ``nodes`` (NodeName lines), ``includes``."""

    options: Dict[str, str] = field(default_factory=dict)
    nodes: List[Dict[str, str]] = field(default_factory=list)
    partitions: List[Dict[str, str]] = field(default_factory=list)
    includes: List[str] = field(default_factory=list)

    def get(self, key: str, default: str = "") -> str:
        return self.options.get(key.lower(), default)


def _pairs(line: str) -> List[Tuple[str, str]]:
    try:
        words = shlex.split(line, comments=False, posix=True)
    except ValueError:
        words = line.split()
    return [(w.split("=", 1)[0].strip().lower(), w.split("=", 1)[1].strip()) for w in words if "=" in w]


def _lines(text: str) -> List[str]:
    out = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            out.append(line)
    return out


def parse_slurm_conf(text: str) -> SlurmConf:
    """NodeName/PartitionName lines become dicts (keys lower-case); an unbalanced quote falls back to
    splitting at spaces; never raises."""
    conf = SlurmConf()
    for line in _lines(text):
        if line.lower().startswith("include "):
            conf.includes.append(line.split(None, 1)[1])
            continue
        pairs = _pairs(line)
        if not pairs:
            continue
        if pairs[0][0] == "nodename":
            conf.nodes.append(dict(pairs))
        elif pairs[0][0] == "partitionname":
            conf.partitions.append(dict(pairs))
        else:
            for k, v in pairs:
                conf.options[k] = v
    return conf


def parse_gres_conf(text: str) -> List[Dict[str, str]]:
    """gres.conf lines as dicts (keys lower-case); global lines (``AutoDetect=off``) have no ``name``."""
    return [dict(_pairs(line)) for line in _lines(text)]


def parse_gres_counts(spec: str) -> Dict[str, int]:
    """``gpu:2,shard:160`` / ``gpu:h100:2`` -> ``{"gpu": 2, "shard": 160}`` (no count: 1; summed)."""
    out: Dict[str, int] = {}
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        parts = item.split(":")
        count = parts[-1] if len(parts) > 1 and parts[-1].isdigit() else "1"
        out[parts[0]] = out.get(parts[0], 0) + int(count)
    return out


def parse_plugstack(text: str) -> List[Tuple[str, str, List[str]]]:
    """``(required|optional, path, args)``, ``("include", glob, [])`` or ``("?", word, [])`` per line."""
    out: List[Tuple[str, str, List[str]]] = []
    for line in _lines(text):
        words = line.split()
        if words[0] == "include" and len(words) > 1:
            out.append(("include", words[1], []))
        elif len(words) >= 2:
            out.append((words[0], words[1], words[2:]))
        else:
            out.append(("?", words[0], []))
    return out


ROLES = ("controller", "compute", "login")
_CTLD = re.compile(r"^\s*(SlurmctldHost|ControlMachine|BackupController)\s*=\s*([^\s#]+)", re.IGNORECASE)


@dataclass(frozen=True)
class HostRole:
    """``roles`` (a subset of ``ROLES``); ``nodes``: this host's own NodeNames (empty unless compute)."""

    roles: FrozenSet[str]
    name: str
    nodes: FrozenSet[str]
    how: str

    @property
    def gpu(self) -> bool:
        return "compute" in self.roles

    def describe(self) -> str:
        """One line: ``ctl: controller (SlurmctldHost)``."""
        return f"{self.name}: {' and '.join(r for r in ROLES if r in self.roles)} ({self.how})"


def controllers(slurm_text: str) -> FrozenSet[str]:
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


#: One finding: (status pass|fail|warn, what, fix).
Finding = Tuple[str, str, str]

CGROUP2_MAGIC_PATH = Path("/sys/fs/cgroup/cgroup.controllers")  # present only on a cgroup v2 (unified) host


def _tested() -> str:
    return ", ".join(f"{a}.{b:02d}" for a, b in TESTED)


def cgroup_plugin(conf_dir: Path) -> str:
    """``CgroupPlugin`` of ``<conf_dir>/cgroup.conf`` (lower-case); ``"autodetect"`` when unset or no file."""
    try:
        text = (conf_dir / "cgroup.conf").read_text(errors="replace")
    except OSError:
        return "autodetect"
    for line in text.splitlines():
        key, _, value = line.split("#", 1)[0].partition("=")
        if key.strip().lower() == "cgroupplugin" and value.strip():
            return value.strip().lower()
    return "autodetect"


def evaluate(version: SlurmVersion, conf: Optional[SlurmConf], cgroup: str,
             host_cgroup_v2: bool) -> List[Finding]:
    """The release, then each per-release setting (left out when ``conf`` is None: unreadable)."""
    out: List[Finding] = []
    if version.tested:
        out.append(("pass", f"Slurm {version.release} (tested releases: {_tested()})", ""))
    else:
        out.append(("warn", f"Slurm {version.release} is not a tested release ({_tested()}): "
                                       "slurm-coloc uses its 22.05 paths on it",
                         "run a tested release, or run the cluster tests on this one (README 'Slurm "
                         "versions')"))
    if conf is not None:
        params = {p.strip().upper() for p in conf.get("SelectTypeParameters").split(",") if p.strip()}
        if "MULTIPLE_SHARING_GRES_PJ" in params:
            why = ("one job may take shards from several GPUs, so its memory fence no longer matches one GPU"
                   if version.at_least(MULTIPLE_SHARING_GRES)
                   else f"Slurm {version.release} does not know it")
            out.append(("fail", f"SelectTypeParameters has MULTIPLE_SHARING_GRES_PJ: {why}",
                        "remove MULTIPLE_SHARING_GRES_PJ from SelectTypeParameters and restart slurmctld"))
    v1 = cgroup == "cgroup/v1" or (cgroup == "autodetect" and not host_cgroup_v2)
    if version.at_least(CGROUP_V1_DEPRECATED) and v1:
        how = "set in cgroup.conf" if cgroup == "cgroup/v1" else "autodetected"
        out.append(("warn",
                    f"cgroup/v1 ({how}) is deprecated in Slurm {version.major}.{version.minor:02d}: it "
                            "works, slurmd logs a warning",
                    "move the nodes to cgroup v2 (CgroupPlugin=cgroup/v2 or autodetect on a unified host)"))
    return out
