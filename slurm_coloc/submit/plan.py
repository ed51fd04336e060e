"""From a coloc-sbatch command line, a parsed script and an estimate to the sbatch argv (pure).

The GPU rule (docs/user.md, "How your GPU request is translated"), on a shard cluster:

1. ``--exclusive-gpu`` or ``#COLOC share=exclusive`` -> a whole GPU: all shards of one GPU
   (``--gres=shard:<gpu_mem_gib>``). Slurm 22.05 gives one job's shards from ONE GPU, so no other shard job
   fits beside it; ``--gres=gpu:1`` would not keep shard jobs off (facts §4).
2. An explicit ``--gres=shard:N`` is the user's own choice and is kept as is.
3. More than one GPU per node (``--gres=gpu:N``, ``--gpus[-per-node]=N`` with N > 1, any ``--gpus-per-task`` /
   ``--gpus-per-socket``) is kept as a GPU request and gets ``--exclusive`` (the whole node), because shards
   cannot span GPUs and ``gpu:N`` does not keep shard tenants off.
4. Otherwise (one GPU or none asked): ``--coloc-mem``/``#COLOC mem=`` if given, else the model's estimate,
   plus ``headroom_mib``, rounded up to GiB shards; at or above a whole GPU -> rule 1.
5. No model information and no override -> rule 1 (a whole GPU).
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from slurm_coloc.config import Config
from slurm_coloc.errors import ColocError, DirectiveError
from slurm_coloc.estimate.spec import Estimate
from slurm_coloc.submit.argv import CommandLine, Option, parse_option_tokens
from slurm_coloc.submit.directives import ParsedScript
from slurm_coloc.units import mib_to_shards, parse_size_mib

GPU_OPTIONS = ("gres", "gpus", "gpus-per-node", "gpus-per-task", "gpus-per-socket")
COMMENT_TAG = "coloc:"


@dataclass(frozen=True)
class GpuRequest:
    """The user's own GPU request, from the command line and ``#SBATCH`` lines (command line wins).

    ``gpus_per_node``: GPUs asked per node (None: none asked); ``shards``: an explicit shard count;
    ``multi``: per-task/per-socket GPU requests; ``other_gres``: non-GPU GRES entries to keep.
    """

    gpus_per_node: Optional[int] = None
    shards: Optional[int] = None
    gres_type: Optional[str] = None
    multi: bool = False
    other_gres: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Plan:
    """What coloc-sbatch will submit.

    Attributes:
        mode: ``shard`` | ``whole-gpu`` | ``gpu`` (see module rule).
        shards: shards requested (``shard``/``whole-gpu``); gpus: GPUs per node (``gpu``).
        sbatch_args: the argv after ``sbatch`` (script path last but its args); ``SCRIPT`` placeholder
            ``script_index`` marks where the (possibly rewritten) script goes.
        rewritten_script: script text with GPU ``#SBATCH`` lines commented out, or None to submit as is.
        comment: the JSON that travels in the job's comment (after ``coloc:``).
        reason: one line saying why this GPU request.
    """

    mode: str
    shards: Optional[int]
    gpus: Optional[int]
    sbatch_args: Tuple[str, ...]
    script_index: Optional[int]
    rewritten_script: Optional[str]
    comment: Dict[str, Any]
    reason: str

    def argv(self, script_path: Optional[str]) -> List[str]:
        """The sbatch argv with ``script_path`` at the script's place."""
        args = list(self.sbatch_args)
        if self.script_index is not None and script_path is not None:
            args[self.script_index] = script_path
        return args

    def command_line(self, script_path: Optional[str]) -> str:
        """The shell-quoted ``sbatch ...`` line (for ``--dry-run``)."""
        return shlex.join(["sbatch", *self.argv(script_path)])


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
    """Combine every GPU-related option (last occurrence of each wins).

    Raises:
        DirectiveError: a malformed GPU count.
    """
    last: Dict[str, Optional[str]] = {}
    for opt in options:
        if opt.name in GPU_OPTIONS:
            last[opt.name] = opt.value
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
    return GpuRequest(gpus, shards, typ, multi or bool(gpus and gpus > 1), tuple(other))


def needs_estimate(cmd: CommandLine, script: Optional[ParsedScript], req: GpuRequest) -> bool:
    """Whether the model estimate decides the request (rule 4 without an override)."""
    if script is None or script.spec is None:
        return False
    if cmd.exclusive_gpu or script.share == "exclusive" or req.shards is not None or req.multi:
        return False
    return cmd.coloc_mem is None and script.mem_override_mib is None


def script_options(script: Optional[ParsedScript]) -> Tuple[List[Option], List[int]]:
    """All ``#SBATCH`` options and the line numbers that carry a GPU option."""
    opts: List[Option] = []
    gpu_lines: List[int] = []
    for no, words in (script.sbatch_lines if script else ()):
        i, line_opts = 0, []
        while i < len(words):
            if not words[i].startswith("-"):
                break
            opt, i = parse_option_tokens(list(words), i)
            line_opts.append(opt)
        opts.extend(line_opts)
        if any(o.name in GPU_OPTIONS for o in line_opts):
            gpu_lines.append(no)
    return opts, gpu_lines


def _rewrite(script: ParsedScript, lines: List[int]) -> str:
    out = script.text.splitlines(keepends=True)
    for no in lines:
        out[no - 1] = "# coloc-sbatch moved this GPU request to the command line: " + out[no - 1].lstrip("#")
    return "".join(out)


def build_plan(cmd: CommandLine, script: Optional[ParsedScript], estimate: Optional[Estimate],
               cfg: Config, spank: bool = False) -> Plan:
    """Decide the GPU request and build the sbatch argv (see the module rule).

    With ``spank`` (the SPANK plugin is loaded, so sbatch knows ``--coloc-*``), the user's override and a
    whole-GPU choice are also passed as ``--coloc-mem=<MiB>M`` / ``--coloc-share=exclusive``, so the job is
    the same as one submitted with plain ``sbatch --coloc-mem=... --gres=shard:N`` (docs/spank.md).

    Raises:
        DirectiveError: bad ``--coloc-mem`` or GPU option values.
    """
    script_opts, gpu_lines = script_options(script)
    req = gpu_request(script_opts + list(cmd.options))
    whole = cfg.gpu_mem_gib
    override = script.mem_override_mib if script else None
    if cmd.coloc_mem is not None:
        try:
            override = parse_size_mib(cmd.coloc_mem)
        except ColocError as exc:
            raise DirectiveError(f"--coloc-mem: {exc.message}", hint=exc.hint) from None
    mem_mib: Optional[int] = None
    method: Optional[str] = None
    gpus = None
    if cmd.exclusive_gpu or (script is not None and script.share == "exclusive"):
        mode, shards, reason = "whole-gpu", whole, "whole GPU asked (--exclusive-gpu / share=exclusive)"
    elif req.shards is not None:
        mode, shards, reason = "shard", req.shards, "explicit --gres=shard request kept"
    elif req.multi:
        mode, shards, gpus = "gpu", None, req.gpus_per_node
        reason = "more than one GPU per node: whole GPUs on an exclusive node"
    elif override is not None or estimate is not None:
        # an override is the fence the user wants, exactly; an estimate gets headroom_mib on top
        mem_mib = override if override is not None else estimate.mem_mib  # type: ignore[union-attr]
        method = "override" if override is not None else estimate.method  # type: ignore[union-attr]
        headroom = 0 if override is not None else cfg.headroom_mib
        shards = max(cfg.min_shards, mib_to_shards(mem_mib + headroom))
        mode, reason = "shard", f"{method} {mem_mib} MiB + {headroom} MiB headroom"
        if shards >= whole:
            mode, shards, reason = "whole-gpu", whole, f"{method} {mem_mib} MiB does not fit a shared GPU"
    else:
        mode, shards, reason = "whole-gpu", whole, "no model information: a whole GPU"
    args: List[str] = []
    moved = _moved_options(script, gpu_lines)
    for opt in moved + [o for o in cmd.options if o.name not in GPU_OPTIONS and o.name != "comment"]:
        args.extend(opt.tokens)
    gres = list(req.other_gres)
    if mode == "gpu":
        gres.insert(0, f"gpu:{req.gres_type}:{gpus}" if req.gres_type else f"gpu:{gpus}")
        if not any(o.name == "exclusive" for o in cmd.options):
            args.append("--exclusive")
    else:
        gres.insert(0, f"shard:{req.gres_type}:{shards}" if req.gres_type else f"shard:{shards}")
    args.append("--gres=" + ",".join(gres))
    if spank and override is not None and mode == "shard":
        args.append(f"--coloc-mem={override}M")
    if spank and (cmd.exclusive_gpu or (script is not None and script.share == "exclusive")):
        args.append("--coloc-share=exclusive")
    comment: Dict[str, Any] = {"v": 1, "mode": mode, "shards": shards, "gpus": gpus, "mem_mib": mem_mib,
                               "method": method, "sha256": script.sha256 if script else None,
                               "spec": script.spec.to_json() if script and script.spec else None}
    if cmd.script_args and len(json.dumps(list(cmd.script_args))) <= 2048:
        comment["argv"] = list(cmd.script_args)  # exact script arguments, for an OOM rerun (hooks/oom.py)
    user_comment = cmd.last("comment")
    if user_comment is None:
        user_comment = next((o.value for o in reversed(script_opts) if o.name == "comment"), None)
    text = COMMENT_TAG + json.dumps(comment, separators=(",", ":"), sort_keys=True)
    args.append("--comment=" + (f"{user_comment} {text}" if user_comment else text))
    rewritten = _rewrite(script, gpu_lines) if script is not None and gpu_lines else None
    if rewritten is not None and cmd.last("job-name") is None and not any(o.name == "job-name" for o in script_opts):
        args.append("--job-name=" + Path(script.path).name)  # type: ignore[union-attr]
    index = None
    if cmd.script is not None:
        index = len(args)
        args.append(cmd.script)
    args.extend(cmd.script_args)
    return Plan(mode, shards, gpus, tuple(args), index, rewritten, comment, reason)


def _moved_options(script: Optional[ParsedScript], gpu_lines: List[int]) -> List[Option]:
    """Non-GPU options of the ``#SBATCH`` lines that are commented out (they move to the command line)."""
    out: List[Option] = []
    for no, words in (script.sbatch_lines if script else ()):
        if no not in gpu_lines:
            continue
        i = 0
        while i < len(words) and words[i].startswith("-"):
            opt, i = parse_option_tokens(list(words), i)
            if opt.name not in GPU_OPTIONS:
                out.append(opt)
    return out


def parse_comment(comment: str) -> Optional[Dict[str, Any]]:
    """The coloc JSON in a job comment (after the last ``coloc:``), or None. Never raises.

    Hooks run this as root on user-controlled text: JSON only, bounded size, dict only.
    """
    at = (comment or "").rfind(COMMENT_TAG + "{")
    if at < 0 or len(comment) - at > 16384:
        return None
    try:
        data = json.loads(comment[at + len(COMMENT_TAG):])
    except (json.JSONDecodeError, RecursionError):
        return None
    return data if isinstance(data, dict) else None
