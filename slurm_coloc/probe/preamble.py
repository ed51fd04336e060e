"""The batch script's own preamble, run as the submitting user: the environment it ends with.

What a script does to its environment before the training command (``export PATH=<venv>/bin:$PATH``,
``conda activate ENV``, ``module load ...``, ``source .../activate``, a sourced setup file) is only known by
running it: :func:`run_preamble` runs the lines before the command in ``bash`` and reads the environment it
ends with; ``discover.py`` looks the interpreter up on that PATH.

The preamble (:func:`preamble`): a logical line before the command is kept only when every simple command on
it is environment setup (``setupline.is_setup``: ``SETUP_COMMANDS``, shell keywords, ``VAR=value``; no
command substitution but path tools and environment managers' hooks, no backticks, ``eval`` of a hook only,
no redirection but to ``/dev/null``); any other line is replaced by ``:`` so ``if``/``fi`` blocks stay
balanced. The command and everything after it never run; with no line kept, nothing runs.

The run: ``bash --noprofile --norc`` (``-l`` when the ``#!`` line asks for a login shell) as the caller
(``identity.py``), in the submission directory, with the submitting environment, ``SLURM_SUBMIT_DIR`` and
``COLOC_PROBE=1``, the script's arguments, stdin ``/dev/null``, output to a scratch file, at most
``PREAMBLE_TIMEOUT_S``, in a session of its own whose process group is killed when it ends (``reaper.py``
costs a Python start-up, too much for the cached answer's budget). An ``EXIT`` trap and a last line write
``env -0`` to the scratch directory; a preamble that fails, hangs or writes no environment leaves the
submitting environment in place, with a note saying why.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Dict, List, Mapping, Optional, Sequence

from slurm_coloc.probe.command import ProbeCommand
from slurm_coloc.probe.identity import RunAs, open_scratch, popen_kwargs, private_dir, read_child_file
from slurm_coloc.probe.setupline import is_setup
from slurm_coloc.probe.shellwords import logical_lines

PREAMBLE_TIMEOUT_S = 5.0
_HEREDOC = re.compile(r"<<-?\s*['\"]?([A-Za-z_][A-Za-z0-9_]*)['\"]?")
_DROPPED_ENV = ("_", "SHLVL", "OLDPWD")


@dataclasses.dataclass
class Preamble:
    """What running the preamble gave: its exported ``env`` or None (nothing ran, or it wrote none), whether
    it ``ran``, one ``note`` line on a failure ("" otherwise), ``wall_s``.
    """

    env: Optional[Dict[str, str]]
    ran: bool = False
    note: str = ""
    wall_s: float = 0.0


def preamble(text: str, line_index: int) -> Optional[str]:
    """The runnable preamble of ``text`` (module docstring), or None when no line is kept.

    Its setup lines before logical line ``line_index`` (0-based, ``shellwords.logical_lines``), others
    (heredoc bodies too) as ``:``, one line per logical line read.
    """
    out: List[str] = []
    kept = False
    heredoc: Optional[str] = None
    for line in logical_lines(text)[:max(0, line_index)]:
        s = line.strip()
        if heredoc is not None:
            if s == heredoc:
                heredoc = None
            out.append(":")
            continue
        m = _HEREDOC.search(s) if "<<<" not in s else None
        if m:
            heredoc = m.group(1)
            out.append(":")
            continue
        if not s or s.startswith("#"):
            continue
        if is_setup(s):
            out.append(line)
            kept = True
        else:
            out.append(":")
    return "\n".join(out) + "\n" if kept else None


def _login_shell(text: str) -> bool:
    first = text.split("\n", 1)[0]
    return first.startswith("#!") and bool(re.search(r"\s(-l|--login|-\w*l\w*)\b", first))


def run_preamble(text: str, cmd: ProbeCommand, script_args: Sequence[str], submit_dir: str,
                 environ: Optional[Mapping[str, str]] = None,
                 timeout_s: float = PREAMBLE_TIMEOUT_S, run_as: Optional[RunAs] = None) -> Preamble:
    """Run the preamble of ``text`` before ``cmd`` (module docstring) as ``run_as`` (None: the caller); never
    raises.

    The ``Preamble`` holds the exported environment (``PWD``, ``SLURM_SUBMIT_DIR``, ``COLOC_PROBE`` as
    submitted), or none and a note when it hung past ``timeout_s``, wrote none or could not run;
    ``Preamble(None)`` with no preamble or no bash.
    """
    base = dict(os.environ if environ is None else environ)
    body = preamble(text, cmd.line_index)
    bash, env_exe = shutil.which("bash"), shutil.which("env") or "/usr/bin/env"
    if body is None or bash is None:
        return Preamble(None)
    t0 = time.monotonic()
    scratch = tempfile.mkdtemp(prefix="coloc-preamble-")
    try:
        open_scratch(scratch, run_as)
        report = os.path.join(private_dir(os.path.join(scratch, "out"), run_as), "env")
        dump = f"{shlex.quote(env_exe)} -0 > {shlex.quote(report)} 2>/dev/null"
        script = os.path.join(scratch, "preamble.sh")
        with open(script, "w", encoding="utf-8") as fh:
            fh.write(f"__coloc_env() {{ {dump}; }}\ntrap __coloc_env EXIT\n{body}__coloc_env\n")
        os.chmod(script, 0o644)
        env = dict(base, SLURM_SUBMIT_DIR=submit_dir, COLOC_PROBE="1")
        argv = [bash, "-l" if _login_shell(text) else "--noprofile",
                *([] if _login_shell(text) else ["--norc"]),
                script, *script_args]
        log_path = os.path.join(scratch, "log")
        returncode = _run_in_session(argv, submit_dir, env, log_path, timeout_s, run_as)
        wall = time.monotonic() - t0
        if returncode == -signal.SIGKILL:
            return Preamble(None, True, f"the script's setup lines did not finish within {timeout_s:g} s: "
                            "the submitting environment is used", wall)
        try:
            raw = read_child_file(report, run_as)
        except OSError:
            return Preamble(None, True, f"the script's setup lines wrote no environment "
                            f"(exit {returncode}): {_last_line(log_path)}", wall)
        return Preamble(_exported_env(raw, base), True, "", wall)
    except OSError as exc:
        return Preamble(None, True, f"the script's setup lines could not run: {exc}", time.monotonic() - t0)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run_in_session(argv: List[str], cwd: str, env: Dict[str, str], log_path: str, timeout_s: float,
                    run_as: Optional[RunAs] = None) -> int:
    """Exit status of ``argv`` run in its own session (as ``run_as``), output to ``log_path``, for at most
    ``timeout_s``; then SIGKILL whatever is left in the session (``-SIGKILL`` when the limit ended it).

    Raises:
        OSError: ``argv`` could not start or the log could not be written.
    """
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True, **popen_kwargs(run_as))
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        finally:  # whatever it started in its session ends with it
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode


def _last_line(log_path: str) -> str:
    """The last line of the log's last 2,000 bytes, whitespace collapsed, at most 200 characters.

    Raises:
        OSError: the log cannot be read.
    """
    with open(log_path, "rb") as fh:
        last = (fh.read()[-2000:].decode("utf-8", "replace").strip().splitlines() or [""])[-1]
    return " ".join(last.split())[:200]


def _exported_env(raw: bytes, base: Mapping[str, str]) -> Dict[str, str]:
    """The environment in ``raw`` (``env -0`` output) without bash's own variables (``_DROPPED_ENV``), with
    ``PWD``, ``SLURM_SUBMIT_DIR`` and ``COLOC_PROBE`` as in ``base`` (absent where ``base`` has none)."""
    out: Dict[str, str] = {}
    for item in raw.decode("utf-8", "surrogateescape").split("\0"):
        name, sep, value = item.partition("=")
        if sep and name:
            out[name] = value
    for name in _DROPPED_ENV:
        out.pop(name, None)
    for name in ("PWD", "SLURM_SUBMIT_DIR", "COLOC_PROBE"):
        out.pop(name, None)
        if name in base:
            out[name] = base[name]
    return out
