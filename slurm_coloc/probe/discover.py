"""The job's Python and environment: the interpreter on the PATH the script's preamble leaves, and its torch.

:func:`discover_job` runs the batch script's lines before the training command (``preamble.py``, as the
submitting user) and :func:`job_python` looks the command's interpreter up on the PATH they leave.

The torch the interpreter imports (:func:`torch_version`) is read from ``torch/version.py`` on its
``sys.path``, without importing torch: the ``sys.path`` is asked of the interpreter once and kept in
``interpreters.json`` beside the probe cache, valid while the interpreter file, its ``pyvenv.cfg``, the path
variables and every ``sys.path`` directory's mtime are unchanged (``pip install`` changes site-packages').
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence

from slurm_coloc.atomic import write_atomic
from slurm_coloc.probe.command import ProbeCommand
from slurm_coloc.probe.preamble import run_preamble
from slurm_coloc.probe.runner import resolve_interpreter
from slurm_coloc.probe.sandbox import RunAs, popen_kwargs

SYSPATH_TIMEOUT_S = 10.0
_PATH_VARS = ("PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE", "PYTHONUSERBASE", "PYTHONSAFEPATH", "HOME")
_VERSION_RE = re.compile(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", re.M)


def shebang_python(exe: Optional[str], path: Optional[str]) -> Optional[str]:
    """The interpreter a console script (``torchrun``, ``accelerate``) runs under, from its ``#!`` line.

    ``#!/usr/bin/env python3`` is looked up on ``path`` (None: ours); pip's ``#!/bin/sh`` + ``'''exec' PY``
    form too. None: no script, unreadable, no Python ``#!``; never raises OSError.
    """
    if not exe:
        return None
    try:
        with open(exe, "rb") as fh:
            head = fh.read(600).decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    if not head or not head[0].startswith("#!"):
        return None
    words = head[0][2:].split()
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
        return shutil.which(words[0], path=path) if words else None
    if words and os.path.basename(words[0]) == "sh" and len(head) > 1:
        m = re.match(r"""'''exec' "?([^" ]+)"?""", head[1])
        if m and "python" in os.path.basename(m.group(1)) and os.access(m.group(1), os.X_OK):
            return m.group(1)
        return _python_beside(exe)  # a relocatable form ("$(dirname ...)"/'python'): the venv's own
    return words[0] if words and "python" in os.path.basename(words[0]) else None


def _python_beside(exe: str) -> Optional[str]:
    """``python3``/``python`` in the launcher's own ``bin`` directory (its venv's interpreter), or None."""
    for name in ("python3", "python"):
        cand = os.path.join(os.path.dirname(os.path.abspath(exe)), name)
        if os.access(cand, os.X_OK):
            return cand
    return None


def job_python(cmd: ProbeCommand, path: Optional[str]) -> Optional[str]:
    """The job's interpreter as an absolute path (links not resolved: a venv's ``bin/python`` stays), or None.

    ``#COLOC python=`` and a path the command names are taken as written; a bare name is looked up on ``path``
    (the preamble's; None: ours), then the venv a ``source .../activate`` line named; a launcher's own Python
    is its ``#!`` line's, ``python3`` when it has none.
    """
    if cmd.python_from in ("coloc", "path") and cmd.interpreter:
        return cmd.interpreter if os.access(cmd.interpreter, os.X_OK) else None
    word = cmd.python_word or ""
    launched = cmd.launcher in ("torchrun", "accelerate") and "python" not in os.path.basename(word)
    if cmd.python_from == "launcher" or launched:  # `torchrun` after `source .../activate` too
        word = cmd.python_word or cmd.launcher or ""
        exe = word if os.sep in word else shutil.which(word, path=path)
        found = shebang_python(exe, path)
        if not (found and "python" in os.path.basename(found) and os.access(found, os.X_OK)):
            found = (_python_beside(exe) if exe else None) or shutil.which("python3", path=path)
        return os.path.abspath(found) if found and os.access(found, os.X_OK) else None
    word = cmd.python_word or cmd.interpreter or "python3"
    found = shutil.which(word, path=path) if os.sep not in word else word
    if found is None and cmd.interpreter and os.sep in cmd.interpreter:
        found = cmd.interpreter  # the venv a `source .../activate` line named
    return os.path.abspath(found) if found and os.access(found, os.X_OK) else None


@dataclasses.dataclass
class JobPython:
    """:func:`discover_job`'s answer: ``python`` (absolute, links not resolved) or None and ``reason``;
    ``env`` after the preamble (else the submitting one); ``notes`` on a preamble that failed or hung.
    """

    python: Optional[str]
    env: Dict[str, str]
    notes: List[str]
    reason: str = ""


def discover_job(text: str, cmd: ProbeCommand, script_args: Sequence[str], submit_dir: str,
                 environ: Optional[Mapping[str, str]] = None, python: Optional[str] = None,
                 run_as: Optional[RunAs] = None) -> JobPython:
    """The job's Python and environment for ``cmd``: :func:`run_preamble`, then :func:`job_python` on its
    PATH. ``python`` (a path or a name) overrides the command's. Never raises.
    """
    pre = run_preamble(text, cmd, script_args, submit_dir, environ, run_as=run_as)
    env = dict(pre.env if pre.env is not None else os.environ if environ is None else environ)
    if python:
        found = resolve_interpreter(dataclasses.replace(cmd, interpreter=python), env.get("PATH"))
    else:
        found = job_python(cmd, env.get("PATH"))
    notes = [pre.note] if pre.note else []
    if found is None:
        word = python or cmd.python_word or cmd.interpreter or "python3"
        where = " the script's setup lines leave" if pre.env is not None else ""
        return JobPython(None, env, notes, f"the job's Python {word} was not found (on the PATH{where})")
    return JobPython(found, env, notes)


def _stat_id(path: str) -> List[Any]:
    try:
        st = os.stat(path)
        return [path, st.st_size, st.st_mtime_ns]
    except OSError:
        return [path]


def _syspath_key(python: str, env: Mapping[str, str]) -> str:
    d = os.path.dirname(python)
    blob = [_stat_id(python), _stat_id(os.path.realpath(python)), _stat_id(os.path.join(d, "pyvenv.cfg")),
            _stat_id(os.path.join(os.path.dirname(d), "pyvenv.cfg")), [env.get(v) for v in _PATH_VARS]]
    return hashlib.sha256(json.dumps(blob).encode()).hexdigest()


def _dir_times(paths: Sequence[str]) -> List[Optional[int]]:
    out: List[Optional[int]] = []
    for p in paths:
        try:
            out.append(os.stat(p).st_mtime_ns)
        except OSError:
            out.append(None)
    return out


def interpreter_path(python: str, env: Mapping[str, str], cache_dir: Optional[str],
                     run_as: Optional[RunAs] = None) -> Optional[List[str]]:
    """``python``'s ``sys.path`` under ``env`` (empty entries dropped); None when it does not answer within
    ``SYSPATH_TIMEOUT_S``. Cached in ``cache_dir/interpreters.json`` (None: no cache; at most 64 entries;
    module docstring). Never raises: an unwritable cache is skipped.
    """
    key = _syspath_key(python, env)
    path = os.path.join(cache_dir, "interpreters.json") if cache_dir else ""
    table: Dict[str, Any] = {}
    if path:
        try:
            with open(path, encoding="utf-8") as fh:
                loaded = json.load(fh)
            table = loaded if isinstance(loaded, dict) else {}
        except (OSError, ValueError):
            table = {}
        hit = table.get(key)
        if isinstance(hit, dict) and hit.get("times") == _dir_times(hit.get("sys_path") or []):
            return [str(p) for p in hit["sys_path"]]
    try:
        done = subprocess.run([python, "-c", "import sys, json; print(json.dumps(sys.path))"], env=dict(env),
                              cwd="/", stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=SYSPATH_TIMEOUT_S,
                              start_new_session=True, **popen_kwargs(run_as))
        sys_path = [p for p in json.loads(done.stdout.decode().strip().splitlines()[-1]) if p]
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None
    if path:
        table[key] = {"sys_path": sys_path, "times": _dir_times(sys_path), "stored_at": time.time()}
        if len(table) > 64:
            table = dict(sorted(table.items(), key=lambda kv: float(kv[1].get("stored_at", 0)))[-64:])
        try:
            os.makedirs(cache_dir or ".", mode=0o700, exist_ok=True)
            write_atomic(path, json.dumps(table).encode(), mode=0o600)
        except OSError:
            pass  # the table is a cache: the next submission asks the interpreter again
    return sys_path


def torch_version(python: str, env: Mapping[str, str], cache_dir: Optional[str] = None,
                  run_as: Optional[RunAs] = None) -> Optional[str]:
    """The torch ``python`` imports (``2.5.1+cu124``), read from ``torch/version.py`` without importing it;
    ``unknown (<dir>)`` when it gives none, ``"none"`` without torch, None if the interpreter does not answer.
    """
    sys_path = interpreter_path(python, env, cache_dir, run_as)
    if sys_path is None:
        return None
    for entry in sys_path:
        init = os.path.join(entry, "torch", "__init__.py")
        if not os.path.isfile(init):
            continue
        try:
            with open(os.path.join(entry, "torch", "version.py"), encoding="utf-8") as fh:
                m = _VERSION_RE.search(fh.read(4000))
        except OSError:
            m = None
        return m.group(1) if m else f"unknown ({entry})"
    return "none"
