"""A batch script's text as shell words (pure): logical lines, variables substituted, simple commands.

Logical lines join ``\\`` continuations; substitution replaces ``$X``/``${X}`` (``${X:-default}`` with the
default substituted in turn), ``$1``..``$9``, ``$@``, ``$*`` and ``$#`` from given variables and script
arguments; a line is split into its simple commands (``simple_commands``) or read up to its first
operator (``words_to_operator``), pipes and redirections cut off. Used by ``command.py`` to find the training
command and by ``preamble.py`` for the lines before it.
"""
from __future__ import annotations

import re
import shlex
from typing import List, Mapping, Optional, Sequence

_STOP_TOKENS = {"|", "||", "&&", ";", "&", ">", ">>", "2>", "2>>", "&>", "<", "2>&1", "1>&2"}
_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*|[0-9@*#])(?::?-([^}]*))?\}"
                     r"|\$([A-Za-z_][A-Za-z0-9_]*|[0-9@*#])")


def logical_lines(text: str) -> List[str]:
    """The script's logical lines: a line ending in ``\\`` joins the next (the backslash becomes a space)."""
    out: List[str] = []
    buf = ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        out.append(buf + line)
        buf = ""
    if buf:
        out.append(buf)
    return out


def _subst(s: str, vars_: Mapping[str, str], args: Sequence[str]) -> str:
    def rep(m: "re.Match[str]") -> str:
        name = m.group(1) or m.group(3)
        default = m.group(2)
        if name in ("@", "*"):
            return " ".join(shlex.quote(a) for a in args)
        if name == "#":
            return str(len(args))
        if name.isdigit():
            i = int(name)
            val = args[i - 1] if 0 < i <= len(args) else ""
        else:
            val = vars_.get(name, "")
        return val if val or default is None else _subst(default, vars_, args)

    return _VAR_RE.sub(rep, s)


def _tokens(line: str, vars_: Mapping[str, str], args: Sequence[str]) -> Optional[List[str]]:
    """Shell words and operators of ``line`` after variable substitution; None when its quoting is broken.

    ``"$@"`` keeps each argument a word: it is substituted before splitting.
    """
    quoted_all = " ".join(shlex.quote(a) for a in args)
    line = line.replace('"$@"', quoted_all).replace('"${@}"', quoted_all)
    try:
        lex = shlex.shlex(_subst(line, vars_, args), posix=True, punctuation_chars="|&;<>")
        lex.whitespace_split = True
        lex.commenters = "#"
        return list(lex)
    except ValueError:
        return None


def simple_commands(line: str, vars_: Mapping[str, str], args: Sequence[str]) -> List[List[str]]:
    """The simple commands of a line (split at ``&&``, ``||``, ``;``), each cut at a pipe or redirection.

    Each as its words, variables substituted; [] for a line the reader cannot split.
    """
    toks = _tokens(line, vars_, args)
    if toks is None:
        return []
    segs: List[List[str]] = [[]]
    cut = False
    for t in toks:
        if t in ("&&", "||", ";", "&"):
            segs.append([])
            cut = False
        elif cut or t in _STOP_TOKENS or t.startswith((">", "2>", "&>", "|", "<")):
            cut = True
        else:
            segs[-1].append(t)
    return [seg for seg in segs if seg]


def words_to_operator(line: str, vars_: Mapping[str, str], args: Sequence[str]) -> Optional[List[str]]:
    """A line's words up to its first operator, pipe or redirection, substituted; None if unsplittable."""
    toks = _tokens(line, vars_, args)
    if toks is None:
        return None
    out = []
    for t in toks:
        if t in _STOP_TOKENS or t.startswith((">", "2>", "&>", "|", ";", "&")):
            break
        out.append(t)
    return out
