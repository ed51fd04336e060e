"""The probe's copy of the job's working directory: real directories, one symbolic link per file.

A program run in the mirror reads its relative paths (data, configs) as in the job, and the files it creates
land in the mirror (in the probe's scratch directory), not in the user's tree. ``runner.py`` runs the probe
there.
"""
from __future__ import annotations

import contextlib
import os

MAX_MIRROR_ENTRIES = 5000
MIRROR_UP_LEVELS = 2  # ancestors whose other entries are linked beside the mirror (``../../data``)


def _mirror(src: str, dst: str, budget: int = MAX_MIRROR_ENTRIES) -> int:
    """Mirror ``src`` at ``dst`` (real directories, a link per file); return the ``budget`` (entries) left.

    Directories are real (files the program creates land in the scratch directory) while the budget lasts;
    beyond it, and for a link to a directory, the directory is linked as a whole.
    """
    os.makedirs(dst, exist_ok=True)
    try:
        names = sorted(os.listdir(src))
    except OSError:
        return budget
    subdirs = []
    for name in names:
        s, d = os.path.join(src, name), os.path.join(dst, name)
        if os.path.isdir(s) and not os.path.islink(s) and budget > len(names):
            subdirs.append((s, d))
            continue
        try:
            os.symlink(s, d)
        except OSError:
            continue
    budget -= len(names)
    for s, d in subdirs:
        if budget <= 0 or not _small_dir(s, budget):
            with contextlib.suppress(OSError):
                os.symlink(s, d)
            continue
        budget = _mirror(s, d, budget)
    return budget


def _link_siblings(parent: str, dst: str, skip: str, budget: int = MAX_MIRROR_ENTRIES) -> None:
    """Link each entry of ``parent`` but ``skip`` into ``dst`` (at most ``budget``; the root: none)."""
    if parent in ("", os.sep):
        return
    try:
        with os.scandir(parent) as it:
            for i, entry in enumerate(it):
                if i >= budget:
                    return
                if entry.name != skip:
                    with contextlib.suppress(OSError):
                        os.symlink(entry.path, os.path.join(dst, entry.name))
    except OSError:
        return


def mirror_with_ancestors(workdir: str, up: str, levels: int = MIRROR_UP_LEVELS) -> str:
    """Mirror absolute ``workdir`` under ``up`` with the entries of up to ``levels`` ancestors beside it; its
    path.

    ``up`` stands for the ``levels``-th ancestor (fewer below ``/``): ``up/<a1>/<workdir name>`` for 2 levels,
    each ancestor's stand-in holding links to its other entries, so ``../data`` and ``../../data``
    (pytorch/vision's references/classification) read as in the job.

    Raises:
        OSError: ``up`` or an ancestor's stand-in cannot be made.
    """
    chain = [workdir]
    while len(chain) <= levels:
        parent = os.path.dirname(chain[-1])
        if parent in ("", os.sep, chain[-1]):
            break
        chain.append(parent)
    names = [os.path.basename(d) or "work" for d in chain[:-1]] if len(chain) > 1 else ["work"]
    here = up
    for i in range(len(chain) - 1, 0, -1):  # from the top ancestor down to the working directory's parent
        os.makedirs(here, exist_ok=True)
        _link_siblings(chain[i], here, names[i - 1])
        here = os.path.join(here, names[i - 1])
    _mirror(workdir, here)
    return here


def _small_dir(path: str, budget: int) -> bool:
    """True when ``path`` holds at most ``budget`` entries (read lazily: a data set is not listed)."""
    try:
        with os.scandir(path) as it:
            for i, _ in enumerate(it):
                if i >= budget:
                    return False
    except OSError:
        return False
    return True
