"""``coloc-admin enable`` and ``disable``: the slurm.conf, gres.conf and plugstack.conf changes that turn
slurm-coloc on and off, as whole new file texts (pure planning; the CLI prints them as diffs or writes them
with a backup).

Enable (docs/admin.md, "What it changes on your cluster"):

- slurm.conf: ``SelectType=select/cons_tres``, ``gpu`` and ``shard`` in ``GresTypes``, the five hooks set to
  the packaged shims, ``PrologEpilogTimeout=120`` when unset, ``shard:<GPUs x gpu_mem_gib>`` in each GPU
  node's ``Gres=``;
- gres.conf: one ``Name=shard Count=<gpu_mem_gib> File=<device>`` line per GPU of a node that has none
  (devices from its ``Name=gpu File=`` lines, else ``/dev/nvidia0..N-1`` as ``AutoDetect=nvml`` finds them);
- plugstack.conf: ``optional <coloc_spank.so> run_dir=<run_dir>`` (a plugin built for another release is
  skipped, not failing every job), in ``<dir>/coloc.conf`` where plugstack.conf includes ``<dir>/*.conf``
  (Debian: plugstack.conf belongs to another package), else in plugstack.conf.

A hook key set to another program is a conflict (``ColocError``; ``replace_hooks`` replaces it). A
``Prolog``/``Epilog`` glob (jobstats' ``/etc/slurm/prolog.d/*.sh``) is none: our script joins its directory.

Disable removes our hook keys, chain scripts, glob-directory script and SPANK line. ``SelectType``,
``GresTypes`` and the shards stay (jobs asking for shards still run): remove them by hand or restore the
``enable`` backups. Run it before removing the package: a Prolog naming a deleted program drains the node.
"""
from __future__ import annotations

import fnmatch
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from slurm_coloc.admin.slurmconf import (
    SlurmConf,
    expand_hostlist,
    parse_gres_conf,
    parse_gres_counts,
    parse_plugstack,
    parse_slurm_conf,
)
from slurm_coloc.config import Config
from slurm_coloc.errors import ColocError

HOOK_DIR = "/usr/lib/slurm-coloc/hooks"
SPANK_SO = "/usr/lib/slurm-coloc/coloc_spank.so"
HOOKS = {"Prolog": "prolog.sh", "Epilog": "epilog.sh", "PrologSlurmctld": "prolog_slurmctld.sh",
         "EpilogSlurmctld": "epilog_slurmctld.sh", "TaskProlog": "task_prolog.sh"}
MARK = "# slurm-coloc (coloc-admin enable)"
GLOB_KEYS = ("Prolog", "Epilog")  # the hook keys Slurm expands as a glob (slurm.conf(5) of 22.05)


@dataclass
class Change:
    """One file's new text; ``old`` is None for a file that does not exist yet. ``mode`` for a new file;
    ``remove``: the file is deleted (``new`` is then empty); ``backup``: whether the old text is kept as
    ``<file>.coloc-backup-<time>`` (not for our own files in a glob directory, where Slurm would run it)."""

    path: Path
    old: Optional[str]
    new: str
    mode: int = 0o644
    remove: bool = False
    backup: bool = True


def is_glob(value: str) -> bool:
    """Whether a hook value is a glob pattern (``*``, ``?`` or ``[``) rather than one program."""
    return any(ch in value for ch in "*?[")


def glob_member(pattern: str, stem: str = "coloc") -> Path:
    """The file named ``stem`` that a directory glob ``pattern`` matches: ``/etc/slurm/prolog.d/*.sh`` ->
    ``/etc/slurm/prolog.d/coloc.sh``.

    Raises:
        ColocError: a pattern whose directory part is a glob or relative, or whose name part no plain name
            fits.
    """
    path = Path(pattern)
    if not path.is_absolute() or is_glob(str(path.parent)):
        raise ColocError(f"{pattern}: only a glob in the last part of an absolute path is supported",
                         hint="add slurm-coloc's hook to your hook directory by hand (docs/admin.md)")
    name = path.name.replace("*", stem, 1).replace("*", "")
    if "?" in name or "[" in name or not fnmatch.fnmatchcase(name, path.name):
        raise ColocError(f"{pattern}: no file name for slurm-coloc's hook fits this pattern",
                         hint="add slurm-coloc's hook to your hook directory by hand (docs/admin.md)")
    return path.parent / name


def glob_hook_text(hook_dir: str, key: str, pattern: str) -> str:
    """The script put in a glob hook directory: runs slurm-coloc's shim for ``key`` (it exits 0)."""
    return (f"#!/bin/sh\n{MARK}: {key}={pattern} runs every file it matches; this one runs slurm-coloc's "
            f"hook\nexec {hook_dir}/{HOOKS[key]} \"$@\"\n")


def _set_global(lines: List[str], key: str, value: str, added: List[str]) -> None:
    """Set global ``key`` (any case, own line) to ``value`` in place, else queue it in ``added``."""
    pat = re.compile(rf"^\s*{key}\s*=\s*(\S*)\s*(#.*)?$", re.IGNORECASE)
    for i, line in enumerate(lines):
        if pat.match(line):
            lines[i] = f"{key}={value}"
            return
    added.append(f"{key}={value}")


def chain_text(hook_dir: str, key: str, site_program: str) -> str:
    """The script ``--chain-hooks`` puts in place of a site's ``key`` program: runs it first (its exit status
    is the script's, so Slurm sees the site's verdict), then slurm-coloc's shim (which always exits 0)."""
    return (f"#!/bin/sh\n{MARK}: {key} chained; the site's program runs first and its exit status is this "
            f"script's, then slurm-coloc's hook (exits 0)\n# chained: {site_program}\n"
            f"{shlex.quote(site_program)} \"$@\"\nrc=$?\n{hook_dir}/{HOOKS[key]} \"$@\"\nexit $rc\n")


def _set_hooks(lines: List[str], conf: SlurmConf, hook_dir: str, replace_hooks: bool, chained: Dict[str, str],
               added: List[str]) -> None:
    """Point each hook key at our shim (or at its chain script, ``chained``), in place; a glob
    ``Prolog``/``Epilog`` is left to the site (our script joins its directory)."""
    for key, name in HOOKS.items():
        ours = chained.get(key, f"{hook_dir}/{name}")
        current = conf.get(key)
        if current == ours or (key in GLOB_KEYS and is_glob(current)):
            continue
        if current and key not in chained and not replace_hooks:
            raise ColocError(f"slurm.conf already has {key}={current}: slurm-coloc needs {key}={ours}",
                             hint="rerun with --chain-hooks (the site's program first, then ours) or "
                                  "--replace-hooks")
        _set_global(lines, key, ours, added)


def _slurm_conf(text: str, cfg: Config, hook_dir: str, replace_hooks: bool,
                chained: Optional[Dict[str, str]] = None) -> str:
    conf = parse_slurm_conf(text)
    lines = text.splitlines()
    added: List[str] = []
    if conf.get("SelectType") != "select/cons_tres":
        _set_global(lines, "SelectType", "select/cons_tres", added)
    types = [t for t in conf.get("GresTypes").split(",") if t]
    if not {"gpu", "shard"} <= set(types):
        _set_global(lines, "GresTypes", ",".join(types + [t for t in ("gpu", "shard") if t not in types]),
                    added)
    _set_hooks(lines, conf, hook_dir, replace_hooks, chained or {}, added)
    if not conf.get("PrologEpilogTimeout"):
        added.append("PrologEpilogTimeout=120")
    for i, line in enumerate(lines):
        if not re.match(r"^\s*NodeName\s*=", line, re.IGNORECASE) or line.lstrip().startswith("#"):
            continue
        m = re.search(r"\bGres=(\S+)", line, re.IGNORECASE)
        counts = parse_gres_counts(m.group(1)) if m else {}
        if m and counts.get("gpu") and not counts.get("shard"):
            gres = f"{m.group(1)},shard:{counts['gpu'] * cfg.gpu_mem_gib}"
            lines[i] = line[:m.start(1)] + gres + line[m.end(1):]
    if added:
        lines += ["", MARK, *added]
    return "\n".join(lines) + "\n"


def _gres_conf(text: str, slurm_text: str, cfg: Config) -> str:
    conf = parse_slurm_conf(slurm_text)
    entries = parse_gres_conf(text)
    autodetect = any(e.get("autodetect", "").lower() == "nvml" for e in entries)
    gpu_files: Dict[str, List[str]] = {}
    has_shards = set()
    for e in entries:
        nodes = expand_hostlist(e.get("nodename", "")) or ["*"]
        for n in nodes:
            if e.get("name") == "gpu" and e.get("file"):
                gpu_files.setdefault(n, []).extend(expand_hostlist(e["file"]))
            elif e.get("name") == "shard":
                has_shards.add(n)
    new: List[str] = []
    for node in conf.nodes:
        gpus = parse_gres_counts(node.get("gres", "")).get("gpu", 0)
        names = node.get("nodename", "")
        hosts = expand_hostlist(names)
        if not gpus or names.upper() == "DEFAULT" or any(h in has_shards for h in hosts) or "*" in has_shards:
            continue
        files = gpu_files.get(hosts[0], []) + gpu_files.get("*", []) if hosts else []
        if not files and autodetect:
            files = [f"/dev/nvidia{i}" for i in range(gpus)]
        if not files:
            raise ColocError(f"gres.conf: node {names} has Gres=gpu:{gpus} but no Name=gpu File= line and no "
                             "AutoDetect=nvml",
                             hint=f"add 'NodeName={names} Name=gpu File=/dev/nvidia[0-{gpus - 1}]'")
        new += [f"NodeName={names} Name=shard Count={cfg.gpu_mem_gib} File={f}" for f in files]
    if not new:
        return text
    body = text if text.endswith("\n") or not text else text + "\n"
    return body + ("\n" if body else "") + MARK + "\n" + "\n".join(new) + "\n"


def _plugstack(text: str, cfg: Config, spank_so: str) -> str:
    # Slurm's plugstack parser (src/common/spank.c) cuts a line at '#', splits it at white space and reads
    # lines of at most 4095 bytes: a path holding any of these would not reach the plugin as written.
    for what, value in (("run_dir", cfg.run_dir), ("the SPANK plugin's path", spank_so)):
        if not value or "#" in value or len(value.encode()) > 2000 or any(
                c.isspace() or not c.isprintable() for c in value):
            raise ColocError(f"{what} {value[:200]!r} cannot go into plugstack.conf, which cuts a plugin's "
                             "line at '#' and white space: choose a path without spaces, '#' or control "
                             "characters",
                             hint="set run_dir in coloc.yaml")
    if any(Path(plugin).name == "coloc_spank.so" for _, plugin, _ in parse_plugstack(text)):
        return text
    body = text if text.endswith("\n") or not text else text + "\n"
    return body + f"{MARK}\noptional {spank_so} run_dir={cfg.run_dir}\n"


def read_text(p: Path) -> Optional[str]:
    """A config file's text, or None when it does not exist; ``ColocError`` when unreadable or not UTF-8."""
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ColocError(f"cannot read {p}: {exc}") from None


def _slurm_text(slurm_conf: Path) -> str:
    text = read_text(slurm_conf)
    if text is None:
        raise ColocError(f"cannot read {slurm_conf}: no such file",
                         hint="name it with --slurm-conf or SLURM_CONF")
    return text


def _plugstack_change(plug: Path, cfg: Config, spank_so: str) -> Change:
    """The plugin's line in ``<dir>/coloc.conf`` when ``plug`` (plugstack.conf) includes ``<dir>/*.conf`` and
    does not list the plugin itself (Debian: plugstack.conf belongs to another package), else in ``plug``."""
    plug_text = read_text(plug)
    entries = parse_plugstack(plug_text or "")
    dirs = [p for kind, p, _ in entries if kind == "include" and is_glob(p) and Path(p).parent.is_dir()]
    if dirs and not any(Path(p).name == "coloc_spank.so" for kind, p, _ in entries if kind != "include"):
        target = glob_member(dirs[0])
        text = read_text(target)
        return Change(target, text, _plugstack(text or "", cfg, spank_so), backup=False)
    return Change(plug, plug_text, _plugstack(plug_text or "", cfg, spank_so))


def _chains(slurm_conf: Path, conf: SlurmConf, hook_dir: str) -> Tuple[Dict[str, str], List[Change]]:
    """``--chain-hooks``: ``{key: chain script}`` for each hook key set to another program (not a glob), and
    the scripts' files (``<slurm.conf dir>/coloc-chain-<shim>``)."""
    chained: Dict[str, str] = {}
    files: List[Change] = []
    for key, name in HOOKS.items():
        current, path = conf.get(key), slurm_conf.parent / f"coloc-chain-{name}"
        if current == str(path):
            chained[key] = current
        elif current and current != f"{hook_dir}/{name}" and not (key in GLOB_KEYS and is_glob(current)):
            chained[key] = str(path)
            files.append(Change(path, read_text(path), chain_text(hook_dir, key, current), 0o755))
    return chained, files


def plan_enable(slurm_conf: Path, cfg: Config, hook_dir: str = HOOK_DIR, spank_so: str = SPANK_SO,
                spank: bool = True, replace_hooks: bool = False, chain_hooks: bool = False) -> List[Change]:
    """The ``Change`` of each file that changes (slurm.conf, gres.conf beside it, plugstack.conf when
    ``spank``); nothing is written, and a second run plans nothing. ``chain_hooks`` (wins over
    ``replace_hooks``): a hook key set to another program names its chain script (``chain_text``) instead.

    Raises:
        ColocError: slurm.conf unreadable, a hook key set to another program (without ``replace_hooks``), a
            GPU node whose device files cannot be known.
    """
    slurm_text = _slurm_text(slurm_conf)
    chained, chain_changes = _chains(slurm_conf, parse_slurm_conf(slurm_text), hook_dir) \
        if chain_hooks else ({}, [])
    new_slurm = _slurm_conf(slurm_text, cfg, hook_dir, replace_hooks, chained)
    changes = [Change(slurm_conf, slurm_text, new_slurm), *chain_changes]
    gres_path = slurm_conf.parent / "gres.conf"
    gres_text = read_text(gres_path)
    changes.append(Change(gres_path, gres_text, _gres_conf(gres_text or "", new_slurm, cfg)))
    conf = parse_slurm_conf(new_slurm)
    for key in GLOB_KEYS:
        if is_glob(conf.get(key)):
            member = glob_member(conf.get(key))
            if not member.parent.is_dir():
                raise ColocError(f"{key}={conf.get(key)}: directory {member.parent} does not exist")
            changes.append(Change(member, read_text(member), glob_hook_text(hook_dir, key, conf.get(key)),
                                  0o755, backup=False))
    if spank:
        plug = Path(conf.get("PlugStackConfig") or slurm_conf.parent / "plugstack.conf")
        changes.append(_plugstack_change(plug, cfg, spank_so))
    return [c for c in changes if c.new != (c.old or "")]


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


def plan_disable(slurm_conf: Path, hook_dir: str = HOOK_DIR, spank_so: str = SPANK_SO) -> List[Change]:
    """The ``Change`` of each file that turns slurm-coloc off (``remove`` for our own; nothing written;
    gres.conf left alone); ``ColocError`` when slurm.conf is missing or unreadable."""
    text = _slurm_text(slurm_conf)
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
