"""Splitting a ``coloc-sbatch`` command line: our options, sbatch's options, the script and its args.

Pure functions (the file test of an unknown option aside). Which options take a value comes from the installed
sbatch (``slurm/sbatch_options.py``: its ``--help`` and ``--usage``, cached per binary); the caller passes
that table, else Slurm 22.05's built-in one is used.

An option the table does not know (26.05's ``--segment``, ``--prefer``, ``--extra`` are missing from its help)
is passed on as written and never takes the script's place: given as ``--opt=v`` it is one word; given as
``--opt WORD``, WORD is its value unless WORD is an existing file (then WORD is the job script and the option
a flag, as sbatch needs the script to exist). In ``#SBATCH`` lines, where no script can follow, WORD is its
value.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from slurm_coloc.errors import DirectiveError
from slurm_coloc.slurm.sbatch_options import BUILTIN, SbatchOptions


@dataclass(frozen=True)
class Option:
    """One sbatch option: ``tokens`` (its 1 or 2 argv words), long ``name``, ``value`` (None: a flag)."""

    name: str
    value: Optional[str]
    tokens: Tuple[str, ...]


@dataclass(frozen=True)
class CommandLine:
    """A split ``coloc-sbatch`` command line."""

    options: Tuple[Option, ...]
    script: Optional[str]
    script_args: Tuple[str, ...]
    dry_run: bool = False
    coloc_mem: Optional[str] = None
    exclusive_gpu: bool = False
    extra: Tuple[str, ...] = field(default=())
    explain: bool = False
    table: SbatchOptions = BUILTIN

    def last(self, name: str) -> Optional[str]:
        """The value of option ``name``'s last occurrence (sbatch: the last wins); None: absent or a flag.

        ``name``: the long name without dashes (``-p`` is stored as ``partition``).
        """
        vals = [o.value for o in self.options if o.name == name]
        return vals[-1] if vals else None

    def has(self, name: str) -> bool:
        """Whether option ``name`` (long name, no dashes) was given at all."""
        return any(o.name == name for o in self.options)


def _unknown_takes_value(words: List[str], i: int, in_directive: bool) -> bool:
    """Whether the word after unknown option ``words[i]`` is its value (module docstring)."""
    if i + 1 >= len(words) or words[i + 1].startswith("-"):
        return False
    return in_directive or not os.path.isfile(os.path.expanduser(words[i + 1]))


def parse_option_tokens(words: List[str], i: int, table: SbatchOptions = BUILTIN,
                        in_directive: bool = False) -> Tuple[Option, int]:
    """``(Option, index after it)`` of the option at ``words[i]`` (1 or 2 words), read by ``table``.

    ``in_directive``: the words come from an ``#SBATCH`` line, so an unknown option's next word is its value.

    Raises:
        DirectiveError: an option that needs a value is last on the line.
    """
    w = words[i]
    if w.startswith("--"):
        name, sep, value = w[2:].partition("=")
        if sep:
            return Option(name, value, (w,)), i + 1
        if name in table.long_value or (not table.knows(name)
                                        and _unknown_takes_value(words, i, in_directive)):
            if i + 1 >= len(words):
                raise DirectiveError(f"option --{name} needs a value")
            return Option(name, words[i + 1], (w, words[i + 1])), i + 2
        return Option(name, None, (w,)), i + 1
    letter = w[1:2]
    name = table.short_to_long.get(letter, letter)
    if letter in table.short_value:
        if len(w) > 2:
            return Option(name, w[2:].lstrip("="), (w,)), i + 1
        if i + 1 >= len(words):
            raise DirectiveError(f"option -{letter} needs a value")
        return Option(name, words[i + 1], (w, words[i + 1])), i + 2
    return Option(name, None, (w,)), i + 1


def split_command_line(argv: List[str], table: SbatchOptions = BUILTIN) -> CommandLine:
    """Split ``[options] script [args]`` into our options, sbatch options, script and script args.

    Ours: ``--dry-run``, ``--coloc-mem SIZE`` (or ``=SIZE``; kept as written, parsed to MiB later),
    ``--exclusive-gpu``, ``--explain``. With ``--wrap`` there is no script; a lone ``--`` ends the options.

    Raises:
        DirectiveError: no script (and no ``--wrap``), or an option missing its value.
    """
    options: List[Option] = []
    dry_run = exclusive = explain = False
    coloc_mem: Optional[str] = None
    i = 0
    while i < len(argv):
        w = argv[i]
        if w == "--":
            i += 1
            break
        if not w.startswith("-") or w == "-":
            break
        if w == "--dry-run":
            dry_run, i = True, i + 1
            continue
        if w == "--exclusive-gpu":
            exclusive, i = True, i + 1
            continue
        if w == "--explain":
            explain, i = True, i + 1
            continue
        if w == "--coloc-mem" or w.startswith("--coloc-mem="):
            if "=" in w:
                coloc_mem, i = w.split("=", 1)[1], i + 1
            elif i + 1 < len(argv):
                coloc_mem, i = argv[i + 1], i + 2
            else:
                raise DirectiveError("option --coloc-mem needs a value (e.g. --coloc-mem 6G)")
            continue
        opt, i = parse_option_tokens(argv, i, table)
        options.append(opt)
    rest = argv[i:]
    has_wrap = any(o.name == "wrap" for o in options)
    if not rest and not has_wrap:
        raise DirectiveError("no job script given", hint="usage: coloc-sbatch [sbatch options] script [args]")
    script = None if has_wrap else rest[0]
    script_args = tuple(rest if has_wrap else rest[1:])
    return CommandLine(tuple(options), script, script_args, dry_run, coloc_mem, exclusive, explain=explain,
                       table=table)
