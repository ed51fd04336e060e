"""The batch script's own preamble, run as the submitting user: the environment it ends with.

What a script does to its environment before the training command (``export PATH=<venv>/bin:$PATH``,
``conda activate ENV``, ``module load ...``, a sourced setup file) is only known by running it:
:func:`run_preamble` runs the lines before the command in ``bash`` and reads the environment it ends with;
``discover.py`` looks the interpreter up on that PATH.

The preamble (:func:`preamble`) keeps a logical line before the command only when :func:`is_setup`: every
simple command on it is one of ``SETUP_COMMANDS`` (environment managers: their ``SUBCOMMANDS`` only), a shell
keyword or ``VAR=value``; a ``$(...)`` only of ``SAFE_SUBSTITUTIONS`` (path and name tools, a manager's
shell hook) with no operator, redirection or other substitution inside, ``$((...))`` without one; no
backticks, process substitution or here-string; ``eval`` of a hook only; output only to ``/dev/null`` or a
descriptor, input only from ``/dev/null``. So no program of the user's runs and nothing is written
(docs/user.md "The job's Python"). Other lines become ``:`` (``if``/``fi`` stay balanced); the command and
what follows never run; with no line kept, nothing runs.

The run: ``bash --noprofile --norc`` (``-l`` when the ``#!`` line asks for a login shell) as the caller
(``sandbox.py``), in the submission directory, with the submitting environment, ``SLURM_SUBMIT_DIR`` and
``COLOC_PROBE=1``, stdin ``/dev/null``, at most ``PREAMBLE_TIMEOUT_S``, in a session of its own whose process
group is killed when it ends (``reaper.py`` costs a Python start-up, too much for the cached answer's
budget). An ``EXIT`` trap writes ``env -0`` to the scratch directory; a preamble that fails, hangs or writes
no environment leaves the submitting environment in place, with a note saying why.
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
from slurm_coloc.probe.sandbox import RunAs, open_scratch, popen_kwargs, private_dir, read_child_file
from slurm_coloc.probe.words import logical_lines

PREAMBLE_TIMEOUT_S = 5.0
_HEREDOC = re.compile(r"<<-?\s*['\"]?([A-Za-z_][A-Za-z0-9_]*)['\"]?")
_DROPPED_ENV = ("_", "SHLVL", "OLDPWD")
SETUP_COMMANDS = frozenset({
    "export", "unset", "set", "source", ".", "cd", "pushd", "popd", "shopt", "umask", "alias", "unalias",
    "declare", "typeset", "readonly", "local", "eval", "hash", ":", "true", "false", "test", "[", "[[",
    "echo", "printf", "conda", "mamba", "micromamba", "module", "ml", "spack", "pyenv", "activate",
    "deactivate", "enable_lmod", "setpkgs", "use",
})
# the environment managers' sub-commands that only change the environment (``conda run``, ``pyenv exec``,
# ``spack python`` would run a program; ``conda install``/``pyenv local`` would write)
SUBCOMMANDS = {
    "conda": frozenset({"activate", "deactivate", "info", "shell.bash", "shell.posix", "--version", "-V"}),
    "pyenv": frozenset({"activate", "deactivate", "shell", "version", "versions", "which", "root", "prefix"}),
    "spack": frozenset({"load", "unload", "env", "find", "location"}),
}
SUBCOMMANDS["mamba"] = SUBCOMMANDS["micromamba"] = SUBCOMMANDS["conda"] | frozenset({"shell"})
_HOOK_TOOLS = frozenset({"conda", "mamba", "micromamba", "pyenv"})
SAFE_SUBSTITUTIONS = frozenset({"dirname", "basename", "realpath", "readlink", "pwd", "whoami", "hostname",
                                "nproc", "id"}) | _HOOK_TOOLS
_HOOK_WORDS = frozenset({"shell.bash", "shell.posix", "shell", "hook", "info", "--base", "--shell", "bash",
                         "init", "-", "--path", "virtualenv-init", "-s", "--root-prefix", "root"})
_HOOK_OUTPUT = frozenset({"hook", "init", "virtualenv-init", "shell.bash", "shell.posix"})
_KEYWORDS = frozenset({"if", "then", "else", "elif", "fi", "for", "while", "until", "do", "done", "case",
                       "esac", "{", "}", "!", "function", "in", "]]", "time"})
_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?=")
_SEPARATORS = frozenset({";", "&&", "||", "|", "&", ";;", "|&"})
_INNER_SUB = re.compile(r"\$\(([^()`$]*(?:\$\{?[A-Za-z_0-9@*#]+\}?[^()`$]*)*)\)")
_ARITH = re.compile(r"\$\(\(([A-Za-z0-9_+\-*/%<>=!&|^~?:, ]*)\)\)")
HOOK = "__coloc_setup_hook__"
SAFE = "__coloc_setup_value__"


def _substitution(inner: str) -> Optional[str]:
    """What a ``$(inner)`` stands for: ``HOOK`` (an environment manager's shell hook), ``SAFE`` (a path or
    name tool), or None (anything else: it would run a program)."""
    if re.search(r"[;&|<>`\\\n]", inner):
        return None
    try:
        words = shlex.split(inner)
    except ValueError:
        return None
    if not words or os.path.basename(words[0]) not in SAFE_SUBSTITUTIONS or os.sep in words[0]:
        return None
    if words[0] in _HOOK_TOOLS:
        if len(words) < 2 or not all(w in _HOOK_WORDS for w in words[1:]):
            return None
        return HOOK if _HOOK_OUTPUT & set(words[1:]) else SAFE  # shell code to eval, or a path
    return SAFE


def _replace_substitutions(line: str) -> Optional[str]:
    """``line`` with every allowed ``$(...)`` (innermost first) and ``$((...))`` replaced by a marker word;
    None when one is not allowed or a backtick or process substitution is left."""
    prev = None
    while prev != line:
        prev = line
        line = _ARITH.sub(SAFE, line)
        bad = False

        def rep(m: "re.Match[str]") -> str:
            nonlocal bad
            kind = _substitution(m.group(1))
            if kind is None:
                bad = True
                return m.group(0)
            return kind

        line = _INNER_SUB.sub(rep, line)
        if bad:
            return None
    if "$(" in line or "`" in line or "<(" in line or ">(" in line or "<<<" in line:
        return None
    return line


def _redirection_ok(op: str, target: Optional[str]) -> bool:
    """Whether redirection ``op`` to ``target`` (the next word) writes and reads nothing."""
    if op in (">&", "<&"):
        return target is not None and (target.isdigit() or target in ("-", "/dev/null"))
    if op in (">", ">>", "&>", "&>>", ">|", "<"):
        return target == "/dev/null"
    return False


def is_setup(line: str) -> bool:
    """Whether logical ``line`` runs no program but setup commands and writes nothing (module docstring)."""
    text = _replace_substitutions(line)
    if text is None:
        return False
    try:
        lex = shlex.shlex(text, posix=True, punctuation_chars="|&;<>")
        lex.whitespace_split = True
        lex.commenters = "#"
        toks: List[str] = list(lex)
    except ValueError:
        return False
    head, cmd, i = True, "", 0
    args: List[str] = []
    while i < len(toks):
        t = toks[i]
        if t in _SEPARATORS:
            if not _command_ok(cmd, args):
                return False
            head, cmd, args = True, "", []
        elif set(t) <= set("<>&|;"):
            if not _redirection_ok(t, toks[i + 1] if i + 1 < len(toks) else None):
                return False
            i += 1
        elif head:
            if t in _KEYWORDS or _ASSIGN.match(t):
                if HOOK in t:
                    return False
            elif os.path.basename(t) in SETUP_COMMANDS and not t.startswith("$"):
                head, cmd = False, os.path.basename(t)
            else:
                return False
        else:
            args.append(t)
        i += 1
    return _command_ok(cmd, args)


def _command_ok(cmd: str, args: List[str]) -> bool:
    """Whether setup command ``cmd`` with ``args`` stays setup: ``eval`` of a hook only; the environment
    managers' ``SUBCOMMANDS`` only; a hook's output nowhere but ``eval``."""
    if cmd == "eval":
        return bool(args) and all(a == HOOK for a in args)
    if any(HOOK in a for a in args):
        return False
    allowed = SUBCOMMANDS.get(cmd)
    if allowed is not None:
        sub = next((a for a in args if not a.startswith("-") or a in allowed), None)
        if sub is not None and sub not in allowed:
            return False
        if cmd == "spack" and sub == "env":
            rest = args[args.index("env") + 1:]
            return bool(rest) and rest[0] in ("activate", "deactivate", "status", "st")
    return True


@dataclasses.dataclass
class Preamble:
    """What running the preamble gave: its exported ``env`` or None (nothing ran, or it wrote none); ``note``:
    one line on a failure."""

    env: Optional[Dict[str, str]]
    ran: bool = False
    note: str = ""
    wall_s: float = 0.0


def preamble(text: str, line_index: int) -> Optional[str]:
    """The runnable preamble of ``text`` (module docstring), or None when no line is kept.

    Its setup lines before logical line ``line_index`` (0-based, ``words.logical_lines``), others
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
    """The last line of the log's last 2,000 bytes, whitespace collapsed, at most 200 characters; OSError."""
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
