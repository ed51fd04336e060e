"""``coloc-admin disable``: the changes that turn slurm-coloc's hooks and SPANK plugin off again, as whole new
file texts (pure planning; the CLI prints them as diffs or writes them with a backup, as for ``enable``).

What goes (the inverse of ``admin/enable.py``): each hook key of slurm.conf that names a shim in ``hook_dir``;
our script in a glob hook directory (``Prolog=/etc/slurm/prolog.d/*.sh``); the SPANK plugin's line in
plugstack.conf, and the file ``enable`` wrote in an included directory (``plugstack.conf.d/coloc.conf``).
What stays: ``SelectType``, ``GresTypes``, the shards of ``Gres=`` and gres.conf (jobs that ask for shards
still run; a whole GPU is ``gpu_mem_gib`` shards): remove them by hand, or restore the ``enable`` backups.
Run it before removing the package: a Prolog that names a deleted program fails, and Slurm drains the node.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, List, Tuple

from slurm_coloc.admin.enable import GLOB_KEYS, HOOK_DIR, HOOKS, MARK, SPANK_SO, Change, is_glob, read_text
from slurm_coloc.admin.slurmconf import SlurmConf, parse_plugstack, parse_slurm_conf
from slurm_coloc.errors import ColocError


def _drop_lines(text: str, drop: "re.Pattern[str]") -> str:
    """``text`` without the lines ``drop`` matches, nor our ``MARK`` comment once its block is empty."""
    lines = [ln for ln in text.splitlines() if not drop.match(ln)]
    out: List[str] = []
    for i, ln in enumerate(lines):
        rest = lines[i + 1:]
        block = rest[:next((k for k, r in enumerate(rest) if not r.strip() or r.startswith("#")), len(rest))]
        if ln.strip() == MARK and not block:
            continue
        out.append(ln)
    while out and not out[-1].strip():
        out.pop()
    return "\n".join(out) + "\n" if out else ""


def _glob_members(conf: SlurmConf, hook_dir: str) -> List[Change]:
    """The removal of our script from each glob hook directory (``Prolog=/etc/slurm/prolog.d/*.sh``)."""
    out: List[Change] = []
    for key in GLOB_KEYS:
        pattern = conf.get(key)
        if not is_glob(pattern) or not Path(pattern).parent.is_dir():
            continue
        for member in sorted(Path(pattern).parent.glob(Path(pattern).name)):
            body = read_text(member) if member.is_file() else None
            if body is not None and MARK in body and f"{hook_dir}/" in body:
                out.append(Change(member, body, "", remove=True, backup=False))
    return out


def _put_back(program: str) -> Callable[["re.Match[str]"], str]:
    """A ``re.sub`` replacement that puts ``program`` between the key and the rest of its line."""
    return lambda m: m.group(1) + program + m.group(2)


def _unchain(text: str, conf: SlurmConf) -> Tuple[str, List[Change]]:
    """``enable --chain-hooks`` undone: each hook key naming our chain script names the site's program again
    (the script's ``# chained:`` line), and the script goes. Returns the new text and the removals."""
    removed: List[Change] = []
    for key, name in HOOKS.items():
        chain = Path(conf.get(key))
        body = read_text(chain) if conf.get(key) and chain.name == f"coloc-chain-{name}" else None
        site = re.search(r"^# chained: (.+)$", body or "", re.MULTILINE)
        if body is None or MARK not in body or not site:
            continue
        line = re.compile(rf"^(\s*{key}\s*=\s*){re.escape(str(chain))}(\s*(#.*)?)$",
                          re.IGNORECASE | re.MULTILINE)
        program = site.group(1)
        text = line.sub(_put_back(program), text)
        removed.append(Change(chain, body, "", remove=True, backup=False))
    return text, removed


def plan(slurm_conf: Path, hook_dir: str = HOOK_DIR, spank_so: str = SPANK_SO) -> List[Change]:
    """The ``Change`` of each file that turns slurm-coloc off (``remove`` for our own; nothing written).

    gres.conf is left alone; plugstack.conf is ``PlugStackConfig`` or beside slurm.conf. Empty when nothing of
    ours is configured.

    Raises:
        ColocError: slurm.conf missing or unreadable.
    """
    text = read_text(slurm_conf)
    if text is None:
        raise ColocError(f"cannot read {slurm_conf}: no such file",
                         hint="name it with --slurm-conf or SLURM_CONF")
    conf = parse_slurm_conf(text)
    keys = "|".join(HOOKS)
    ours = re.compile(rf"^\s*({keys})\s*=\s*{re.escape(hook_dir)}/[^\s/]+\s*(#.*)?$", re.IGNORECASE)
    new, removed = _unchain(_drop_lines(text, ours), conf)
    changes = [Change(slurm_conf, text, new), *removed]
    changes += _glob_members(conf, hook_dir)
    plug = Path(conf.get("PlugStackConfig") or slurm_conf.parent / "plugstack.conf")
    plug_text = read_text(plug)
    name = Path(spank_so).name
    plugin_line = re.compile(rf"^\s*(required|optional)\s+\S*/{re.escape(name)}(\s.*)?$")
    if plug_text is not None:
        changes.append(Change(plug, plug_text, _drop_lines(plug_text, plugin_line)))
        for kind, pattern, _ in parse_plugstack(plug_text):
            if kind != "include" or not Path(pattern).parent.is_dir():
                continue
            for member in sorted(Path(pattern).parent.glob(Path(pattern).name)):
                body = read_text(member) if member.is_file() else None
                if body is None or not any(plugin_line.match(ln) for ln in body.splitlines()):
                    continue
                left = _drop_lines(body, plugin_line)
                changes.append(Change(member, body, "", remove=True, backup=False) if not left.strip()
                               else Change(member, body, left, backup=False))
    return [c for c in changes if c.remove or c.new != (c.old or "")]
