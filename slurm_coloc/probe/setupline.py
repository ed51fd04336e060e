"""Which lines of a batch script are environment setup (pure): the filter of ``preamble.py``.

A logical line is setup when every simple command on it is one of ``SETUP_COMMANDS`` (with the
``SUBCOMMANDS`` allowed for environment managers), a shell keyword or ``VAR=value``, and:

- a ``$(...)`` is one of ``SAFE_SUBSTITUTIONS``: a path or name tool (``dirname``, ``basename``,
  ``realpath``, ``readlink``, ``pwd``, ``whoami``, ``hostname``, ``nproc``, ``id``) or a manager's shell hook
  (``conda shell.bash hook``, ``conda info --base``, ``pyenv init -``), with no operator, redirection or other
  substitution inside; ``$((...))`` without a substitution or subscript inside;
- no backticks, process substitution or here-string;
- ``eval``'s only argument is a hook substitution (``eval "$(conda shell.bash hook)"``);
- output goes only to ``/dev/null`` or another descriptor, input only from ``/dev/null``.

So no program of the user's (nor anything but the tools above) runs, and nothing is written (docs/user.md
"The job's Python").
"""
from __future__ import annotations

import os
import re
import shlex
from typing import List, Optional

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
