"""The config described from ``config.Config`` itself: the commented sample ``coloc.yaml`` (every key at its
default, section by section, each with its meaning from its section's docstring) and the effective config with
the source of each value.

``deploy/coloc.yaml`` (shipped as ``/etc/slurm-coloc/coloc.yaml`` by the Debian package) is ``sample_yaml()``;
tests/test_config_doc.py fails when it drifts from the fields.
"""
from __future__ import annotations

import os
import re
import textwrap
from dataclasses import fields
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

import yaml

from slurm_coloc import config as config_mod
from slurm_coloc.config import checks, sections

HEADER = """\
# slurm-coloc configuration: /etc/slurm-coloc/coloc.yaml
# Generated from slurm_coloc/config/ (`coloc-admin config --sample`); every key is listed, commented out, at
# its default. Uncomment a key to change it. Precedence: defaults < this file (or $COLOC_CONFIG) < COLOC_<KEY>
# environment variables. Unknown keys are errors. `coloc-admin config` prints the effective values and where
# each comes from; `coloc-admin check` checks them against slurm.conf and gres.conf.
"""


def _descriptions(section: type) -> List[Tuple[List[str], str]]:
    """``[(names, text)]`` from the ``Attributes:`` section of a config section's docstring
    (``config.sections.SECTIONS``), in order. ``names`` are the comma-separated names of an entry (``diag_*``
    stays a pattern)."""
    doc = section.__doc__ or ""
    body = doc.split("Attributes:", 1)[1] if "Attributes:" in doc else ""
    entries: List[Tuple[List[str], str]] = []
    for line in body.splitlines():
        m = re.match(r"^        ([a-z_*, ]+?):\s(.*)$", line)
        if m:
            entries.append(([n.strip() for n in m.group(1).split(",")], m.group(2).strip()))
        elif entries and line.strip():
            entries[-1] = (entries[-1][0], entries[-1][1] + " " + line.strip())
    return entries


def _entry_of(name: str, entries: List[Tuple[List[str], str]]) -> int:
    """Index of the docstring entry describing key ``name`` (-1: none)."""
    for i, (names, _) in enumerate(entries):
        if any(n == name or (n.endswith("*") and name.startswith(n[:-1])) for n in names):
            return i
    return -1


def _item(name: str, value: object) -> str:
    """``name: value``, the value in YAML flow style (``{}`` for an empty mapping, ``''`` for "")."""
    text = yaml.safe_dump({name: value}, default_flow_style=True, width=1000).strip()
    return text[1:-1].strip()  # without the braces of the one-item mapping


def _comment(text: str) -> List[str]:
    """``text`` as comment lines of at most 110 characters (``code`` quoted once)."""
    return ["# " + line for line in textwrap.wrap(text.replace("``", "`"), 108, break_on_hyphens=False)]


def sample_yaml() -> str:
    """The sample config: for each section of ``config.sections.SECTIONS`` its title, then every key it
    declares commented out at its default, after its description (a group of keys described together, e.g.
    ``diag_*``, gets its text once) and followed by the values it allows (``config.checks.allowed``). The keys
    come in ``fields(Config)`` order."""
    defaults = config_mod.Config()
    out = [HEADER.rstrip("\n")]
    for section in sections.SECTIONS:
        title = (section.__doc__ or section.__name__).strip().splitlines()[0]
        out.extend(["", "# " + "=" * 108, *_comment(title), "# " + "=" * 108])
        entries = _descriptions(section)
        last = -2
        for f in fields(section):
            i = _entry_of(f.name, entries)
            if i != last or i == -1:
                out.append("")
                out.extend(_comment(entries[i][1] if i >= 0 else "(no description)"))
            last = i
            allowed = checks.allowed(f)
            out.append("#" + _item(f.name, getattr(defaults, f.name)) + (f"  # {allowed}" if allowed else ""))
    return "\n".join(out) + "\n"


def config_path(path: Optional[str], environ: Mapping[str, str]) -> Tuple[Path, bool]:
    """``(file, named)``: the file ``config.load`` reads; named by ``path`` or ``$COLOC_CONFIG``."""
    explicit = path or environ.get("COLOC_CONFIG")
    return Path(explicit or config_mod.DEFAULT_CONFIG_PATH), bool(explicit)


def effective(path: Optional[str] = None, environ: Optional[Mapping[str, str]] = None
              ) -> Tuple[config_mod.Config, Path, bool, Dict[str, str]]:
    """``(cfg, file, file_read, sources)``: the effective config and where each value comes from.

    ``file_read`` is False for a missing default file (all defaults); ``sources`` maps each key to
    ``"default"``, ``"file"`` or ``"env COLOC_<KEY>"``. ``environ`` None: ``os.environ``.

    Raises:
        ConfigError: as ``config.load`` (unreadable or malformed file, unknown key, bad value).
    """
    env = os.environ if environ is None else environ
    cfg = config_mod.load(path, env)
    file, _ = config_path(path, env)
    in_file: Dict[str, Any] = {}
    read = file.exists()
    if read:
        in_file = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
    sources: Dict[str, str] = {}
    for f in fields(config_mod.Config):
        var = f"COLOC_{f.name.upper()}"
        in_env = env.get(var) is not None
        sources[f.name] = f"env {var}" if in_env else "file" if f.name in in_file else "default"
    return cfg, file, read, sources


def effective_yaml(cfg: config_mod.Config, file: Path, read: bool, sources: Dict[str, str]) -> str:
    """``effective``'s result as YAML: a header naming the file, then every key with its source."""
    head = (f"# effective slurm-coloc configuration; file: {file}" if read
            else f"# effective slurm-coloc configuration; file: {file} (not present: defaults)")
    lines = [head]
    for f in fields(config_mod.Config):
        src = sources[f.name]
        lines.append(f"{_item(f.name, getattr(cfg, f.name))}  # {file if src == 'file' else src}")
    return "\n".join(lines) + "\n"
