"""The hooks of ``coloc-admin check``: each program slurm.conf's hook keys name exists, is executable and
cannot be replaced by a non-root user. A ``Prolog``/``Epilog`` glob (jobstats' ``/etc/slurm/prolog.d/*.sh``;
Slurm runs every file it matches) is checked file by file, and must hold slurm-coloc's script
(``coloc-admin enable`` puts ``coloc.sh`` there).
"""
from __future__ import annotations

import glob
import os
import stat
from pathlib import Path
from typing import List, Optional

from slurm_coloc.admin.enable import GLOB_KEYS, MARK, is_glob
from slurm_coloc.admin.result import Check, fail, ok
from slurm_coloc.admin.slurmconf import SlurmConf, expand_hostlist

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
    """The check of one hook program ``p`` of ``key``."""
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
    """One ``Check`` per configured hook program: it exists, is executable, and neither it nor a directory
    above it is writable by non-root; a glob's files each, one of them slurm-coloc's.
    """
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
