"""What the user asked sbatch for: the split ``coloc-sbatch`` command line, the ``#SBATCH`` options, the job's
GPU request as written (the last of each GPU option wins, the command line over ``#SBATCH``), and the GPU
models it may run on. Pure; ``submit/plan.py`` turns them into the sbatch argv.

Which options take a value comes from the installed sbatch's table (``slurm/sbatch_options.py``), else Slurm
22.05's built-in one. An option the table does not know (26.05's ``--segment``, ``--prefer``, ``--extra``) is
passed on as written and never takes the script's place: ``--opt=v`` is one word; in ``--opt WORD``, WORD is
its value unless it is an existing file (then it is the job script and the option a flag, as sbatch needs the
script to exist). In ``#SBATCH`` lines, where no script can follow, WORD is its value.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from slurm_coloc.config import Config
from slurm_coloc.errors import ConfigError, DirectiveError, EstimateError
from slurm_coloc.estimate.spec import gpu_model
from slurm_coloc.slurm.sbatch_options import BUILTIN, SbatchOptions
from slurm_coloc.submit.directives import ParsedScript

GPU_OPTIONS = ("gres", "gpus", "gpus-per-node", "gpus-per-task", "gpus-per-socket")


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
        """Option ``name``'s last value (long name without dashes; sbatch: the last wins); None: absent or a
        flag."""
        vals = [o.value for o in self.options if o.name == name]
        return vals[-1] if vals else None

    def has(self, name: str) -> bool:
        return any(o.name == name for o in self.options)


def _unknown_takes_value(words: List[str], i: int, in_directive: bool) -> bool:
    """Whether the word after unknown option ``words[i]`` is its value (module docstring)."""
    if i + 1 >= len(words) or words[i + 1].startswith("-"):
        return False
    return in_directive or not os.path.isfile(os.path.expanduser(words[i + 1]))


def parse_option_tokens(words: List[str], i: int, table: SbatchOptions = BUILTIN,
                        in_directive: bool = False) -> Tuple[Option, int]:
    """``(Option, index after it)`` of the option at ``words[i]`` (1 or 2 words), read by ``table``;
    ``in_directive``: the words are an ``#SBATCH`` line's. DirectiveError: a value-taking option is last."""
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
    """Split ``[options] script [args]``. Ours: ``--dry-run``, ``--coloc-mem SIZE`` (or ``=SIZE``; kept as
    written, parsed to MiB later), ``--exclusive-gpu``, ``--explain``. With ``--wrap`` there is no script; a
    lone ``--`` ends the options.

    Raises:
        DirectiveError: no script (and no ``--wrap``), or an option missing its value."""
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


@dataclass(frozen=True)
class GpuRequest:
    """The user's own GPU request. ``gpus_per_node``: GPUs asked per node (None: none asked); ``shards``: an
    explicit shard count; ``multi``: more than one GPU per node or any per-task/per-socket GPU request;
    ``other_gres``: non-GPU GRES entries to keep; ``options``: the last occurrence of each GPU option, in the
    order sbatch reads them."""

    gpus_per_node: Optional[int] = None
    shards: Optional[int] = None
    gres_type: Optional[str] = None
    multi: bool = False
    other_gres: Tuple[str, ...] = ()
    options: Tuple[Option, ...] = ()


def _gres_entries(value: str) -> List[Tuple[str, Optional[str], int]]:
    out = []
    for entry in value.split(","):
        bits = entry.strip().split(":")
        if not bits or not bits[0]:
            continue
        count = int(bits[-1]) if len(bits) > 1 and bits[-1].isdigit() else 1
        typ = bits[1] if len(bits) == 3 else (bits[1] if len(bits) == 2 and not bits[1].isdigit() else None)
        out.append((bits[0], typ, count))
    return out


def _count(name: str, value: Optional[str]) -> Tuple[Optional[str], int]:
    bits = (value or "").split(":")
    if not bits[-1].isdigit():
        raise DirectiveError(f"--{name}={value!r}: expected [type:]count")
    return (bits[0] if len(bits) == 2 else None), int(bits[-1])


def gpu_request(options: List[Option]) -> GpuRequest:
    """Combine every GPU option, ``#SBATCH`` then the command line's. DirectiveError: a malformed GPU
    count."""
    last_opt: Dict[str, Option] = {}
    for opt in options:
        if opt.name in GPU_OPTIONS:
            last_opt.pop(opt.name, None)  # re-inserted: dict order = order of each option's last occurrence
            last_opt[opt.name] = opt
    last = {name: opt.value for name, opt in last_opt.items()}
    gpus = shards = None
    typ = None
    multi = False
    other: List[str] = []
    if last.get("gres"):
        for name, t, n in _gres_entries(last["gres"] or ""):
            if name == "gpu":
                gpus, typ = n, t
            elif name == "shard":
                shards, typ = n, t
            elif name != "none":
                other.append(f"{name}:{t}:{n}" if t else f"{name}:{n}")
    for name in ("gpus", "gpus-per-node"):
        if name in last:
            t, n = _count(name, last[name])
            gpus, typ = n, t or typ
    for name in ("gpus-per-task", "gpus-per-socket"):
        if name in last:
            _count(name, last[name])
            multi = True
    return GpuRequest(gpus, shards, typ, multi or bool(gpus and gpus > 1), tuple(other),
                      tuple(last_opt.values()))


def script_options(script: Optional[ParsedScript],
                   table: SbatchOptions = BUILTIN) -> Tuple[List[Option], List[int]]:
    """``(options in script order, 1-based numbers of lines with a GPU option)`` of the ``#SBATCH`` lines read
    by ``table`` (``script`` None, ``--wrap``: none). DirectiveError: an option the table rejects."""
    opts: List[Option] = []
    gpu_lines: List[int] = []
    for no, words in (script.sbatch_lines if script else ()):
        i, line_opts = 0, []
        while i < len(words):
            if not words[i].startswith("-"):
                break
            opt, i = parse_option_tokens(list(words), i, table, in_directive=True)
            line_opts.append(opt)
        opts.extend(line_opts)
        if any(o.name in GPU_OPTIONS for o in line_opts):
            gpu_lines.append(no)
    return opts, gpu_lines


def gpu_models(cfg: Config, options: Sequence[Option]) -> Tuple[str, ...]:
    """The GPU models a job with ``options`` may run on, canonical names (``H100``), distinct, in order.

    The partition is the last ``-p``/``--partition`` value (a comma-separated list, as sbatch takes it); each
    partition's model is ``cfg.gpu_model_by_partition[partition]``, else ``cfg.gpu_model``, also the model of
    a job that names no partition. ``options``: command line and ``#SBATCH`` lines together.

    Raises:
        ConfigError: a model name ``estimate/spec.py`` does not know (the message names the config key)."""
    value = next((o.value for o in reversed(options) if o.name == "partition"), None)
    partitions: List[Optional[str]] = [p.strip() for p in (value or "").split(",") if p.strip()] or [None]
    out: List[str] = []
    for part in partitions:
        name = cfg.gpu_model_for(part)
        try:
            canonical = gpu_model(name).name
        except EstimateError as exc:
            key = "gpu_model_by_partition" if part in cfg.gpu_model_by_partition else "gpu_model"
            raise ConfigError(f"config key {key!r}: {exc.message}") from None
        if canonical not in out:
            out.append(canonical)
    return tuple(out)
