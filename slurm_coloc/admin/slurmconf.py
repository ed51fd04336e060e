"""Reading slurm.conf, gres.conf and plugstack.conf (pure functions on text; by key name, case-insensitive).

Formats: slurm.conf(5), gres.conf(5), spank(8) of Slurm 22.05. ``Include`` lines are reported, not followed.
Host lists (``NodeName=gpu[01-04]``, ``File=/dev/nvidia[0-1]``) expand with ``slurm.parse.expand_hostlist``.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

from slurm_coloc.slurm.parse import expand_hostlist

__all__ = ["SlurmConf", "expand_hostlist", "parse_gres_conf", "parse_gres_counts", "parse_plugstack",
           "parse_slurm_conf"]


@dataclass
class SlurmConf:
    """slurm.conf: global ``options`` (lower-case key -> value), ``nodes`` (NodeName lines), ``includes``."""

    options: Dict[str, str] = field(default_factory=dict)
    nodes: List[Dict[str, str]] = field(default_factory=list)
    partitions: List[Dict[str, str]] = field(default_factory=list)
    includes: List[str] = field(default_factory=list)

    def get(self, key: str, default: str = "") -> str:
        """A global option by name (case-insensitive), ``default`` when it is not set."""
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
    """Parse slurm.conf text; NodeName/PartitionName lines become dicts (keys lower-case); never raises.

    ``#`` comments are dropped; ``Include`` lines are listed, not followed; an unbalanced quote falls back to
    splitting at spaces.
    """
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
    """plugstack.conf lines: ``(required|optional, path, args)``, ``("include", glob, [])`` or ``("?", w,
    [])``.
    """
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
