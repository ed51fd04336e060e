"""From a coloc-sbatch command line and a parsed script to the sbatch argv: ``build_plan`` (pure).

The GPU rule (docs/user.md, "How your GPU request is translated"), on a shard cluster:

1. ``--exclusive-gpu`` or ``#COLOC share=exclusive`` -> a whole GPU: all shards of one GPU
   (``--gres=shard:<gpu_mem_gib>``). Slurm 22.05 gives one job's shards from ONE GPU, so no other shard job
   fits beside it; ``--gres=gpu:1`` would not keep shard jobs off (docs/facts.md §4).
2. An explicit ``--gres=shard:N`` is the user's own choice and is kept as is.
3. More than one GPU per node (``--gres=gpu:N``, ``--gpus[-per-node]=N`` with N > 1, any ``--gpus-per-task`` /
   ``--gpus-per-socket``): the user's GPU options are passed on as given (the last of each option, the
   command line over ``#SBATCH`` lines) with ``--exclusive`` (the whole node), because shards cannot span
   GPUs and ``gpu:N`` does not keep shard tenants off.
4. Otherwise (one GPU or none asked): the sources' figures, asked here, for the GPU models of the job's
   partitions (``gpu_request.gpu_models``), and one decision over them (``estimate/decision.py``); a figure
   other than the override gets ``headroom_mib``; rounded up to GiB shards; at or above a whole GPU -> rule 1.
5. No source gave a figure -> rule 1, with ``NO_INFORMATION`` (the next steps) as the reason, or the
   timeout when the ``#COLOC model=`` estimate did not finish within ``estimate_timeout_s``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from slurm_coloc.comment import JobComment, Shrink, without, without_kwargs
from slurm_coloc.comment.values import BOUNDS, CommentSpec
from slurm_coloc.config import Config
from slurm_coloc.errors import ColocError, DirectiveError
from slurm_coloc.estimate.decision import Candidate, EstimateEvidence, EstimateVerdict, ProbeAnswer, decide
from slurm_coloc.estimate.spec import Estimate, ModelSpec
from slurm_coloc.slurm.sbatch_options import BUILTIN, SbatchOptions
from slurm_coloc.submit.directives import ParsedScript
from slurm_coloc.submit.request import (
    GPU_OPTIONS,
    CommandLine,
    GpuRequest,
    Option,
    gpu_models,
    gpu_request,
    parse_option_tokens,
    script_options,
)
from slurm_coloc.units import mib_to_shards, parse_size_mib

EstimateFn = Callable[[ModelSpec, str], Optional[Estimate]]  # without history; None: not in time
ProbeFn = Callable[[str], ProbeAnswer]  # GPU model -> answer; never raises for an unprobeable program
HistoryFn = Callable[[], Sequence[int]]  # MiB earlier runs of this script were shown to need

NO_INFORMATION = ("no memory figure (no probe figure, no #COLOC model=, no history): a whole GPU. To share a "
                  "GPU, give your job's peak with '#COLOC mem=6G' (or --coloc-mem 6G); 'coloc-sbatch "
                  "--explain --dry-run SCRIPT' shows why each source has none; docs/user.md, \"The script "
                  "probe\"")


@dataclass(frozen=True)
class Plan:
    """What coloc-sbatch will submit: ``mode`` (module rule) ``shard`` | ``whole-gpu`` | ``gpu``;
    ``sbatch_args``: the argv after ``sbatch``, the script at ``script_index``; ``rewritten_script``: the
    script with its GPU ``#SBATCH`` lines commented out (None: as is); ``coloc``: the job comment before it is
    shrunk to fit; ``comment_dropped``: what was left out; ``decision``: rule 4's (None under rules 1-3).
    """

    mode: str
    shards: Optional[int]
    gpus: Optional[int]
    sbatch_args: Tuple[str, ...]
    script_index: Optional[int]
    rewritten_script: Optional[str]
    coloc: JobComment
    reason: str
    gpu_args: Tuple[str, ...] = ()
    comment_dropped: Tuple[str, ...] = ()
    decision: Optional[EstimateVerdict] = None

    @property
    def comment(self) -> Dict[str, Any]:
        """The coloc JSON object as planned (``JobComment.comment_json``: fixed keys null when unknown)."""
        return self.coloc.comment_json()

    def argv(self, script_path: Optional[str]) -> List[str]:
        """The sbatch argv with ``script_path`` at the script's place (None: ``sbatch_args`` as is)."""
        args = list(self.sbatch_args)
        if self.script_index is not None and script_path is not None:
            args[self.script_index] = script_path
        return args


def _rewrite(script: ParsedScript, lines: List[int]) -> str:
    out = script.text.splitlines(keepends=True)
    for no in lines:
        out[no - 1] = "# coloc-sbatch moved this GPU request to the command line: " + out[no - 1].lstrip("#")
    return "".join(out)


def _override_mib(cmd: CommandLine, script: Optional[ParsedScript]) -> Optional[int]:
    """The user's memory override in MiB (``--coloc-mem`` wins over ``#COLOC mem=``), or None."""
    if cmd.coloc_mem is None:
        return script.mem_override_mib if script else None
    try:
        return parse_size_mib(cmd.coloc_mem)
    except ColocError as exc:
        raise DirectiveError(f"--coloc-mem: {exc.message}", hint=exc.hint) from None


def _evidence(override_mib: Optional[int], spec: Optional[ModelSpec], gpu_names: Sequence[str],
              estimate_fn: Optional[EstimateFn], probe_fn: Optional[ProbeFn], history_fn: Optional[HistoryFn],
              probe_off_reason: str, estimate_timeout_s: float) -> EstimateEvidence:
    """Rule 4's sources: none with an override; else the directives, the probe and history, in that order,
    each once per GPU model (the largest figure counts); a None ``*_fn`` is not asked. Raises
    ``EstimateError`` from ``estimate_fn``."""
    if override_mib is not None:
        return EstimateEvidence(override_mib)
    directives, timed_out = Candidate("no #COLOC model= line"), False
    if spec is not None and estimate_fn is None:
        directives = Candidate("no estimator here")
    elif spec is not None and estimate_fn is not None:
        est, gpu = _largest([(estimate_fn(spec, name), name) for name in gpu_names])
        timed_out = est is None
        directives = Candidate.of(est, gpu, f"{est.method} of {spec.model} on {gpu}") if est is not None \
            else Candidate(f"the estimate of {spec.model} did not finish within estimate_timeout_s "
                           f"({estimate_timeout_s:g} s)")
    probe, answer = Candidate(probe_off_reason or "off"), None
    if probe_fn is not None:
        answers = [(probe_fn(name), name) for name in gpu_names]
        answer = answers[0][0]
        est, gpu = _largest([(a.estimate, name) for a, name in answers])
        if est is None:
            probe = Candidate(next(a.reason for a, _ in answers if a.estimate is None) or "no figure")
        else:
            precision = est.detail.get("precision")
            probe = Candidate.of(est, gpu, f"probe on {gpu}{f' ({precision})' if precision else ''}"
                                           f"{', cached' if answer.cached else ''}")
    history = tuple(history_fn()) if history_fn is not None else ()
    return EstimateEvidence(None, probe, directives, history, timed_out, answer)


def _largest(found: Sequence[Tuple[Optional[Estimate], str]]) -> Tuple[Optional[Estimate], str]:
    """The largest estimate and its GPU model (the estimate's, else the one asked); None if any is None."""
    if any(e is None for e, _ in found):
        return None, ""
    est, name = max(found, key=lambda pair: pair[0].mem_mib if pair[0] is not None else 0)
    return est, (est.gpu_model if est is not None else None) or name


def build_plan(cmd: CommandLine, script: Optional[ParsedScript], cfg: Config,
               estimate_fn: Optional[EstimateFn] = None, *, spank: bool = False,
               probe_fn: Optional[ProbeFn] = None, history_fn: Optional[HistoryFn] = None,
               probe_off_reason: str = "") -> Plan:
    """Decide the GPU request (the module rule) and build the sbatch argv; nothing is run but the sources'
    functions (rule 4; None: no such source, ``probe_off_reason`` says why for the probe).

    With ``spank`` (sbatch knows ``--coloc-*``), the override and a whole-GPU choice are also passed as
    ``--coloc-mem=<MiB>M`` / ``--coloc-share=exclusive``, as plain ``sbatch`` would get them (docs/spank.md).

    Raises:
        DirectiveError: bad ``--coloc-mem`` or GPU option values.
        ConfigError: a partition's GPU model is unknown to the estimator.
        EstimateError: raised by ``estimate_fn``.
    """
    script_opts, gpu_lines = script_options(script, cmd.table)
    all_opts = script_opts + list(cmd.options)
    req = gpu_request(all_opts)
    exclusive_gpu = cmd.exclusive_gpu or (script is not None and script.share == "exclusive")
    override = _override_mib(cmd, script)
    if exclusive_gpu or req.shards is not None or req.multi:
        choice = _user_choice(exclusive_gpu, req, cfg)
    else:
        spec = script.spec if script is not None else None
        asks = override is None and (probe_fn is not None or (spec is not None and estimate_fn is not None))
        decision = decide(_evidence(override, spec, gpu_models(cfg, all_opts) if asks else (), estimate_fn,
                                    probe_fn, history_fn, probe_off_reason, cfg.estimate_timeout_s))
        choice = _shards_of_decision(decision, override, cfg)
    kept = [o for o in cmd.options if o.name not in GPU_OPTIONS and o.name != "comment"]
    args = [token for opt in _moved_options(script, gpu_lines, cmd.table) + kept for token in opt.tokens]
    gpu_args = _gpu_args(choice, req, all_opts)
    args.extend(gpu_args)
    if spank:
        args.extend(_spank_args(choice, override, exclusive_gpu))
    coloc = _coloc_comment(choice, cmd, script, _user_comment(cmd, script_opts))
    comment_arg, dropped = coloc.fitted_arg(comment_steps(cmd.script_args))
    if comment_arg is not None:
        args.append(comment_arg)
    rewritten = _rewrite(script, gpu_lines) if script is not None and gpu_lines else None
    index = _append_script(args, cmd, script if rewritten is not None else None, script_opts)
    return Plan(choice.mode, choice.shards, choice.gpus, tuple(args), index, rewritten, coloc, choice.reason,
                tuple(gpu_args), tuple(dropped), choice.decision)


def _spank_args(choice: _Choice, override: Optional[int], exclusive_gpu: bool) -> List[str]:
    """The SPANK options that make the job the same as plain ``sbatch``'s: the override (MiB), a whole GPU."""
    out = []
    if override is not None and choice.mode == "shard":
        out.append(f"--coloc-mem={override}M")
    if exclusive_gpu:
        out.append("--coloc-share=exclusive")
    return out


def _user_comment(cmd: CommandLine, script_opts: Sequence[Option]) -> Optional[str]:
    """The user's own ``--comment`` (the command line over the last ``#SBATCH --comment``), or None."""
    user_comment = cmd.last("comment")
    if user_comment is None:
        user_comment = next((o.value for o in reversed(script_opts) if o.name == "comment"), None)
    return user_comment


def _append_script(args: List[str], cmd: CommandLine, rewritten_from: Optional[ParsedScript],
                   script_opts: Sequence[Option]) -> Optional[int]:
    """Append the script and its arguments to ``args``; the script's index (None with ``--wrap``). A
    rewritten script (a temporary file) keeps its own name as the job name unless the user gave one."""
    if rewritten_from is not None and cmd.last("job-name") is None \
            and not any(o.name == "job-name" for o in script_opts):
        args.append("--job-name=" + Path(rewritten_from.path).name)
    index = None
    if cmd.script is not None:
        index = len(args)
        args.append(cmd.script)
    args.extend(cmd.script_args)
    return index


@dataclass(frozen=True)
class _Choice:
    """The GPU request chosen by the module rule; under rule 4, with the decision it came from."""

    mode: str
    shards: Optional[int]
    reason: str
    gpus: Optional[int] = None
    decision: Optional[EstimateVerdict] = None


def _user_choice(exclusive_gpu: bool, req: GpuRequest, cfg: Config) -> _Choice:
    """Rules 1-3: a whole GPU (``cfg.gpu_mem_gib`` shards) if asked, else explicit shards, else multi-GPU."""
    if exclusive_gpu:
        return _Choice("whole-gpu", cfg.gpu_mem_gib, "whole GPU asked (--exclusive-gpu / share=exclusive)")
    if req.shards is not None:
        return _Choice("shard", req.shards, "explicit --gres=shard request kept")
    gpus = req.gpus_per_node
    why = "more than one GPU per node" if gpus and gpus > 1 else "a per-task/per-socket GPU request"
    return _Choice("gpu", None, f"{why}: whole GPUs on an exclusive node", gpus=gpus)


def _shards_of_decision(decision: EstimateVerdict, override: Optional[int], cfg: Config) -> _Choice:
    """Rules 4 and 5: the shards for the decided figure (MiB, + ``headroom_mib`` unless the override), at
    least ``min_shards``; a whole GPU when it does not fit a shared one or there is no figure."""
    whole = cfg.gpu_mem_gib
    mem_mib, method, model_name = decision.mem_mib, decision.method, decision.gpu_model
    if mem_mib is None:
        if decision.timed_out:
            reason = f"no estimate within estimate_timeout_s ({cfg.estimate_timeout_s:g} s): a whole GPU"
            return _Choice("whole-gpu", whole, reason, decision=decision)
        return _Choice("whole-gpu", whole, NO_INFORMATION, decision=decision)
    # an override is the fence the user wants, exactly; an estimate gets headroom_mib on top
    headroom = 0 if override is not None else cfg.headroom_mib
    on_gpu = f" on {model_name}" if model_name else ""
    shards = max(cfg.min_shards, mib_to_shards(mem_mib + headroom))
    if shards >= whole:
        return _Choice("whole-gpu", whole, f"{method} {mem_mib} MiB{on_gpu} does not fit a shared GPU",
                       decision=decision)
    return _Choice("shard", shards, f"{method} {mem_mib} MiB{on_gpu} + {headroom} MiB headroom",
                   decision=decision)


def _gpu_args(choice: _Choice, req: GpuRequest, all_opts: Sequence[Option]) -> List[str]:
    """The GPU part of the sbatch argv: ``--gres=shard[:type]:N`` (with the user's other GRES); under rule 3
    the user's own GPU options with ``--exclusive``."""
    if choice.mode == "gpu":
        gpu_args = [token for opt in req.options for token in opt.tokens]
        if not any(o.name == "exclusive" for o in all_opts):
            gpu_args.append("--exclusive")
        return gpu_args
    shard = f"shard:{req.gres_type}:{choice.shards}" if req.gres_type else f"shard:{choice.shards}"
    return ["--gres=" + ",".join([shard, *req.other_gres])]


def _coloc_comment(choice: _Choice, cmd: CommandLine, script: Optional[ParsedScript],
                   user_text: Optional[str]) -> JobComment:
    """The job's coloc comment after the user's own ``user_text``, before it is shrunk to fit."""
    decision = choice.decision
    flops = decision.flops_per_step if decision is not None else None
    # a count outside the comment's bounds is left out (readers would drop it)
    in_bounds = flops is not None and 0 <= flops <= BOUNDS["flops_per_step"][1]
    return JobComment.submission(
        mode=choice.mode, shards=choice.shards, gpus=choice.gpus,
        mem_mib=decision.mem_mib if decision else None, method=decision.method if decision else None,
        gpu_model=decision.gpu_model if decision else None, sha256=script.sha256 if script else None,
        spec=_comment_spec(script.spec) if script and script.spec else None,
        flops_per_step=int(flops) if flops is not None and in_bounds else None,  # placement/intensity.py
        argv=cmd.script_args,  # exact script arguments, for an OOM rerun (hooks/oom.py)
        user_text=user_text)


def _comment_spec(spec: ModelSpec) -> CommentSpec:
    """The comment's form of the script's model spec (every field of ``ModelSpec.to_json``)."""
    return CommentSpec(model=spec.model, kwargs=dict(spec.kwargs), input_shape=tuple(spec.input_shape),
                       input_dtype=spec.input_dtype, batch_size=spec.batch_size, optimizer=spec.optimizer,
                       precision=spec.precision)


def comment_steps(script_args: Sequence[str]) -> List[Shrink]:
    """``(what is dropped in words, shrink function)`` pairs, first tried first, to fit Slurm's comment limit;
    script arguments first only if Slurm's ``command`` (joined by single spaces, read back by the OOM rerun)
    gives them back exactly: none empty, none holding whitespace."""
    exact = all(a and not any(c.isspace() for c in a) for a in script_args)
    steps: List[Shrink] = [("the script arguments (Slurm's command line keeps them)", without("argv"))] \
        if exact else []
    steps += [("the model's kwargs (they stay in the script's #COLOC lines)", without_kwargs),
              ("the model spec", without("spec"))]
    if not exact:
        steps.append(("the script arguments", without("argv")))
    steps.append(("the GPU model and method", without("gpu_model", "method")))
    steps.append(("the FLOP count", without("flops_per_step")))
    return steps


def _moved_options(script: Optional[ParsedScript], gpu_lines: List[int],
                   table: SbatchOptions = BUILTIN) -> List[Option]:
    """Non-GPU options of the ``#SBATCH`` lines that are commented out (they move to the command line)."""
    out: List[Option] = []
    for no, words in (script.sbatch_lines if script else ()):
        if no not in gpu_lines:
            continue
        i = 0
        while i < len(words) and words[i].startswith("-"):
            opt, i = parse_option_tokens(list(words), i, table, in_directive=True)
            if opt.name not in GPU_OPTIONS:
                out.append(opt)
    return out
