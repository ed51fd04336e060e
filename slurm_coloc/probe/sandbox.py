"""Who the probe's children run as, and the directories they see (scratch, the mirrored working directory).

Never another user's code as root. A user's ``coloc-sbatch`` probes as that user; root's, with ``--uid=USER``,
runs the setup lines, the ``sys.path`` query and the program as that user (uid, primary or ``--gid`` group,
supplementary groups, own ``HOME``/``USER``/``LOGNAME``) in children that drop root before ``exec``, their
scratch directories handed to the user first; without ``--uid`` only root's own files are probed.
The mirror: real directories, one symbolic link per file, so relative paths read as in the job and created
files land in the scratch directory.
"""
from __future__ import annotations

import contextlib
import grp
import os
import pwd
import stat
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

MAX_MIRROR_ENTRIES = 5000
MIRROR_UP_LEVELS = 2  # ancestors whose other entries are linked beside the mirror (``../../data``)


@dataclass(frozen=True)
class RunAs:
    """A user the probe's children run as."""

    uid: int
    gid: int
    groups: Tuple[int, ...]
    name: str
    home: str

    def popen_kwargs(self) -> Dict[str, Any]:
        """``subprocess.Popen`` keywords that start the child as this user (root only)."""
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups)}

    def environ(self, env: Mapping[str, str]) -> Dict[str, str]:
        return dict(env, HOME=self.home, USER=self.name, LOGNAME=self.name)

    def give(self, path: str) -> None:
        """Hand ``path`` and everything below it (links themselves, never followed) to this user; OSError."""
        os.lchown(path, self.uid, self.gid)
        for root, dirs, files in os.walk(path):
            for name in dirs + files:
                os.lchown(os.path.join(root, name), self.uid, self.gid)


def popen_kwargs(run_as: Optional[RunAs]) -> Dict[str, Any]:
    """``run_as.popen_kwargs()``; none (the caller's identity) for None."""
    return run_as.popen_kwargs() if run_as is not None else {}


def _user(spec: str) -> Optional[pwd.struct_passwd]:
    try:
        return pwd.getpwuid(int(spec)) if spec.isdigit() else pwd.getpwnam(spec)
    except (KeyError, ValueError, OverflowError):
        return None


def _group(spec: str) -> Optional[int]:
    try:
        return int(spec) if spec.isdigit() else grp.getgrnam(spec).gr_gid
    except (KeyError, ValueError):
        return None


def _owner(path: Optional[str]) -> Optional[int]:
    if not path:
        return None
    try:
        return os.stat(path).st_uid
    except OSError:
        return None


def probe_identity(uid_option: Optional[str], gid_option: Optional[str], files: List[Optional[str]],
                   euid: Optional[int] = None) -> Tuple[Optional[RunAs], str]:
    """``(RunAs, "")`` (None: the caller's own identity), or ``(None, reason)`` when the probe must not run:
    as root without ``--uid`` on a file another user owns, or with an unknown ``--uid``/``--gid``.

    ``files`` None or "": none (``--wrap``, ``-m``); ``euid`` None: ours.
    """
    euid = os.geteuid() if euid is None else euid
    if euid != 0:
        return None, ""
    if uid_option:
        pw = _user(uid_option.strip())
        if pw is None:
            return None, f"--uid={uid_option} names no user here: the probe does not run as root for it"
        gid = _group(gid_option.strip()) if gid_option else pw.pw_gid
        if gid is None:
            return None, f"--gid={gid_option} names no group here: the probe does not run as root for it"
        if pw.pw_uid == 0:
            return None, ""
        groups = tuple(g for g in os.getgrouplist(pw.pw_name, gid) if g != gid)
        return RunAs(pw.pw_uid, gid, groups, pw.pw_name, pw.pw_dir or "/"), ""
    for path in files:
        owner = _owner(path)
        if owner is not None and owner != 0:
            who = _user(str(owner))
            name = who.pw_name if who else str(owner)
            return None, (f"root submits {os.path.basename(str(path))}, owned by {name}, without --uid: the "
                          f"probe does not run another user's code as root (submit with --uid={name})")
    return None, ""


def private_dir(path: str, run_as: Optional[RunAs]) -> str:
    """Make directory ``path`` (mode 0700) for a child to write in, handed to ``run_as``; OSError."""
    os.makedirs(path, mode=0o700)
    if run_as is not None:
        os.chown(path, run_as.uid, run_as.gid)
    return path


def open_scratch(root: str, run_as: Optional[RunAs]) -> None:
    """Let ``run_as`` traverse (not list or write) root's scratch directory ``root``; OSError."""
    if run_as is not None:
        os.chmod(root, 0o711)


def read_child_file(path: str, run_as: Optional[RunAs], limit: int = 64 << 20) -> bytes:
    """The bytes of a file a child wrote; as ``run_as`` only a regular file that user owns, never through a
    link (root reads nothing the user points it at). OSError: missing, a link, not regular or not the user's.
    """
    if run_as is None:
        with open(path, "rb") as fh:
            return fh.read(limit)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != run_as.uid:
            raise OSError(f"{path} is not a regular file of uid {run_as.uid}")
        with os.fdopen(fd, "rb") as fh:
            fd = -1
            return fh.read(limit)
    finally:
        if fd >= 0:
            os.close(fd)


def _mirror(src: str, dst: str, budget: int = MAX_MIRROR_ENTRIES) -> int:
    """Mirror ``src`` at ``dst``; return the ``budget`` (entries) left.

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
    """Mirror ``workdir`` (absolute) under ``up``, entries of up to ``levels`` ancestors beside it; its path.

    ``up`` stands for the ``levels``-th ancestor (fewer below ``/``): ``up/<a1>/<workdir name>`` for 2 levels,
    each ancestor's stand-in holding links to its other entries, so ``../data`` and ``../../data``
    (pytorch/vision's references/classification) read as in the job. OSError: a directory cannot be made.
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
