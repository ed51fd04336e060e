"""Splitting a ``coloc-sbatch`` command line: our options, sbatch's options, the script and its args.

Pure functions. Option names come from ``sbatch --help`` of Slurm 22.05.8.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from slurm_coloc.errors import DirectiveError

# sbatch 22.05 short options that take a value (``-J name`` or ``-Jname``)
SHORT_WITH_VALUE = set("aAbcdDeiJLMmnNopqStwxCFG")
# long options that take a required value (``--opt=v`` or ``--opt v``)
LONG_WITH_VALUE = {
    "array", "account", "bb", "bbf", "begin", "comment", "cpu-freq", "cpus-per-task", "dependency", "deadline",
    "delay-boot", "chdir", "error", "export-file", "gid", "gres", "gres-flags", "input", "job-name", "licenses",
    "clusters", "cluster", "distribution", "mail-type", "mail-user", "mcs-label", "ntasks", "ntasks-per-node",
    "nodes", "output", "partition", "power", "priority", "profile", "qos", "core-spec", "signal", "switches",
    "thread-spec", "time", "time-min", "uid", "wckey", "cluster-constraint", "constraint", "nodefile", "mem",
    "mincpus", "reservation", "tmp", "nodelist", "exclude", "mem-per-cpu", "sockets-per-node",
    "cores-per-socket", "threads-per-core", "ntasks-per-core", "ntasks-per-socket", "cpus-per-gpu", "gpus",
    "gpu-bind", "gpu-freq", "gpus-per-node", "gpus-per-socket", "gpus-per-task", "mem-per-gpu", "container",
    "extra-node-info", "hint", "batch", "acctg-freq", "open-mode", "kill-on-invalid-dep", "wrap",
}
SHORT_TO_LONG = {"G": "gpus", "J": "job-name", "o": "output", "e": "error", "D": "chdir", "N": "nodes",
                 "n": "ntasks", "p": "partition", "t": "time", "A": "account", "c": "cpus-per-task"}


@dataclass(frozen=True)
class Option:
    """One sbatch option as given: ``tokens`` are the exact argv words (1 or 2), ``name`` is the long name
    (``gpus`` for ``-G``), ``value`` None for flags."""

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

    def last(self, name: str) -> Optional[str]:
        """Value of the last occurrence of option ``name`` (sbatch's rule: the last one wins)."""
        vals = [o.value for o in self.options if o.name == name]
        return vals[-1] if vals else None

    def has(self, name: str) -> bool:
        """Whether option ``name`` was given at all."""
        return any(o.name == name for o in self.options)


def parse_option_tokens(words: List[str], i: int) -> Tuple[Option, int]:
    """Parse the option starting at ``words[i]``; return it and the index after it.

    Raises:
        DirectiveError: an option that needs a value is last on the line.
    """
    w = words[i]
    if w.startswith("--"):
        name, sep, value = w[2:].partition("=")
        if sep:
            return Option(name, value, (w,)), i + 1
        if name in LONG_WITH_VALUE:
            if i + 1 >= len(words):
                raise DirectiveError(f"option --{name} needs a value")
            return Option(name, words[i + 1], (w, words[i + 1])), i + 2
        return Option(name, None, (w,)), i + 1
    letter = w[1:2]
    name = SHORT_TO_LONG.get(letter, letter)
    if letter in SHORT_WITH_VALUE:
        if len(w) > 2:
            return Option(name, w[2:].lstrip("="), (w,)), i + 1
        if i + 1 >= len(words):
            raise DirectiveError(f"option -{letter} needs a value")
        return Option(name, words[i + 1], (w, words[i + 1])), i + 2
    return Option(name, None, (w,)), i + 1


def split_command_line(argv: List[str]) -> CommandLine:
    """Split ``[options] script [args]`` into our options, sbatch options, script and script args.

    Our options: ``--dry-run``, ``--coloc-mem SIZE`` (or ``=SIZE``), ``--exclusive-gpu``, ``--explain``. With ``--wrap``
    there is no script. A lone ``--`` ends the options.

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
        opt, i = parse_option_tokens(argv, i)
        options.append(opt)
    rest = argv[i:]
    has_wrap = any(o.name == "wrap" for o in options)
    if not rest and not has_wrap:
        raise DirectiveError("no job script given", hint="usage: coloc-sbatch [sbatch options] script [args]")
    script = None if has_wrap else rest[0]
    script_args = tuple(rest if has_wrap else rest[1:])
    return CommandLine(tuple(options), script, script_args, dry_run, coloc_mem, exclusive, explain=explain)
