"""The job's GPU request as its user wrote it, and the GPU models it may run on (pure).

``script_options`` reads the ``#SBATCH`` options of a parsed script (and which lines carry a GPU option);
``gpu_request`` combines the GPU options of those lines and the command line (the last of each wins, the
command line over ``#SBATCH``) into a ``GpuRequest``; ``gpu_models`` gives the GPU models of the job's
partitions. ``submit/plan.py`` turns them into the sbatch argv.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from slurm_coloc.config import Config
from slurm_coloc.errors import ConfigError, DirectiveError, EstimateError
from slurm_coloc.estimate.gpus import gpu_model
from slurm_coloc.slurm.sbatch_options import BUILTIN, SbatchOptions
from slurm_coloc.submit.argv import Option, parse_option_tokens
from slurm_coloc.submit.directives import ParsedScript

GPU_OPTIONS = ("gres", "gpus", "gpus-per-node", "gpus-per-task", "gpus-per-socket")

@dataclass(frozen=True)
class GpuRequest:
    """The user's own GPU request, from the command line and ``#SBATCH`` lines (command line wins).

    ``gpus_per_node``: GPUs asked per node (None: none asked); ``shards``: an explicit shard count;
    ``multi``: more than one GPU per node or any per-task/per-socket GPU request; ``other_gres``: non-GPU
    GRES entries to keep; ``options``: the last occurrence of each GPU option, in the order sbatch reads them.
    """

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
    """Combine every GPU-related option, ``#SBATCH`` then the command line's (last occurrence of each wins).

    Raises:
        DirectiveError: a malformed GPU count.
    """
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
    """``(options in script order, 1-based numbers of lines with a GPU option)`` of the ``#SBATCH`` lines.

    Read by sbatch's option ``table``; ``script`` None (``--wrap``): none.

    Raises:
        DirectiveError: an ``#SBATCH`` option the table rejects (``submit.argv.parse_option_tokens``).
    """
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
        ConfigError: a model name ``estimate/gpus.py`` does not know (the message names the config key).
    """
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
