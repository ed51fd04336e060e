"""The GPU memory figure of a one-GPU job: one decision over ordered sources, with its reasons (pure).

Sources, in order (docs/user.md, "How your GPU request is translated"):

1. ``override``: ``--coloc-mem``, else ``#COLOC mem=``: the fence the user asked for, exactly; nothing else
   runs.
2. ``probe``: the batch script's own training program run under the script probe (``probe/``), when the
   config's ``probe`` is on and the job has a script.
3. ``directives``: the estimate of the ``#COLOC model=`` spec (``estimate_fn``).
4. ``history``: measured peaks and OOM fences of earlier runs of the same script
   (``estimate.combine.history_bound``: ``max * 1.05 + 64`` MiB). With a figure from 2 or 3 it takes that
   figure's place as ``estimate.combine`` applies it to a trace: it may raise the figure, and lower it only
   down to the figure's ``trace_floor_mib`` (its replayed allocations plus context and libraries). Alone, it
   is the figure.
5. ``whole-gpu``: no figure; the caller asks for a whole GPU.

The probe ranks above the directives: the directives repeat the command line by hand and nothing checks
them, while the probe runs the program as submitted. When both give a figure and they differ by more than
``DISAGREE_FRACTION`` of the probe's, a warning says so (the probe's figure is used either way).

Each source is asked once per GPU model of the job's partitions; the largest figure of a source counts.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, Tuple

from slurm_coloc.estimate.spec import Estimate, ModelSpec

DISAGREE_FRACTION = 0.20  # directives vs probe: more than this apart (of the probe's figure) -> a warning

EstimateFn = Callable[[ModelSpec, str], Optional[Estimate]]
"""``(spec, GPU model) -> Estimate`` of the ``#COLOC`` model without history, or None when it did not finish
in time; may raise ``EstimateError``."""
ProbeFn = Callable[[str], "ProbeAnswer"]
"""``GPU model -> ProbeAnswer``: the script probe's answer for that GPU model (never raises for a program that
cannot be probed)."""
HistoryFn = Callable[[], Sequence[int]]
"""``() -> MiB`` that earlier runs of this script were shown to need (empty: none)."""


@dataclass(frozen=True)
class ProbeAnswer:
    """What the probe said, as the decision needs it (``cli/sbatch.py`` builds it from ``probe.ProbeResult``).

    Attributes:
        estimate: the figure (method ``probe``), or None when the probe fell back.
        ran: one line: what the probe ran and saw; reason: why there is no figure ("" with one).
        outside_writes: paths the program opened for writing outside the probe's scratch directory.
        scratch_files: files the program wrote in the probe's scratch copy of the working directory (removed).
    """

    estimate: Optional[Estimate]
    ran: str
    reason: str = ""
    log_tail: Tuple[str, ...] = ()
    outside_writes: Tuple[str, ...] = ()
    cached: bool = False
    wall_s: float = 0.0
    scratch_files: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Source:
    """One source's figure (MiB), or why none; ``note``: what the figure is (``analytic on H100``)."""

    name: str
    mem_mib: Optional[int]
    note: str


@dataclass(frozen=True)
class Decision:
    """The chosen figure and the reasons.

    Attributes:
        mem_mib: the figure (MiB; headroom not included), or None: a whole GPU.
        method: ``override`` | ``probe`` | the estimator's method (``analytic``) | ``history`` | None.
        gpu_model: the GPU model the figure is for (None for an override or no figure).
        warnings: one-line warnings for stderr (the directives/probe disagreement).
        timed_out: the directives' estimate did not finish within ``estimate_timeout_s``.
        flops_per_step: FLOPs of one training step: the probe's count, else the directives' trace's; None
            when neither counted (the placer's intensity feature, ``placement/``).
    """

    mem_mib: Optional[int]
    method: Optional[str]
    gpu_model: Optional[str]
    why: str
    sources: Tuple[Source, ...]
    warnings: Tuple[str, ...] = ()
    timed_out: bool = False
    probe: Optional[ProbeAnswer] = field(default=None)
    flops_per_step: Optional[int] = None


def _largest(found: List[Tuple[Optional[Estimate], str]]) -> Tuple[Estimate, str]:
    est, name = max(found, key=lambda pair: pair[0].mem_mib)  # type: ignore[union-attr]
    assert est is not None
    return est, est.gpu_model or name


def decide(override_mib: Optional[int], spec: Optional[ModelSpec], gpu_names: Sequence[str], *,
           estimate_fn: Optional[EstimateFn] = None, probe_fn: Optional[ProbeFn] = None,
           history_fn: Optional[HistoryFn] = None, probe_off_reason: str = "",
           estimate_timeout_s: float = 60.0) -> Decision:
    """Choose the figure (module rule) and say why.

    ``override_mib`` in MiB; ``gpu_names``: the job's partitions' GPU models (at least one). A None
    ``estimate_fn``/``probe_fn``/``history_fn`` asks no such source (``probe_off_reason`` says why for the
    probe).

    Raises:
        EstimateError: raised by ``estimate_fn`` (a bad ``#COLOC`` model).
    """
    if override_mib is not None:
        return _override_decision(override_mib)
    dir_src, directive, timed_out = _ask_directives(spec, gpu_names, estimate_fn, estimate_timeout_s)
    probe_src, answer, probed = _ask_probe(gpu_names, probe_fn, probe_off_reason)
    base, base_name, why, warnings = _base_figure(probed, directive, probe_src)

    from slurm_coloc.estimate.combine import history_bound

    values = [int(h) for h in (history_fn() if history_fn is not None else []) if h and int(h) > 0]
    hist = history_bound(values)
    hist_src = Source("history", hist, f"max {max(values)} MiB of {len(values)} earlier run(s) x 1.05 + 64"
                      if hist is not None else "no earlier run of this script recorded")
    mem, method, gpu, why = _with_history(base, base_name, hist, why)
    whole_src = Source("whole-gpu", None, "not needed" if mem is not None else "the fallback: a whole GPU")
    sources = (Source("override", None, "no --coloc-mem / #COLOC mem="), probe_src, dir_src, hist_src,
               whole_src)
    flops = next((e.flops_per_step
                  for e in (probed[0] if probed else None, directive[0] if directive else None)
                  if e is not None and e.flops_per_step is not None), None)
    return Decision(mem, method, gpu, why, sources, tuple(warnings), timed_out and mem is None, answer, flops)


def _override_decision(override_mib: int) -> Decision:
    """Source 1: the user's override (MiB) is the figure; no other source is asked."""
    skipped = "not consulted: the override wins"
    sources = (Source("override", override_mib, "--coloc-mem / #COLOC mem= (exact, no headroom)"),
               Source("probe", None, skipped), Source("directives", None, skipped),
               Source("history", None, skipped), Source("whole-gpu", None, skipped))
    return Decision(override_mib, "override", None, "an override is the fence you asked for, exactly",
                    sources)


def _ask_directives(spec: Optional[ModelSpec], gpu_names: Sequence[str], estimate_fn: Optional[EstimateFn],
                    estimate_timeout_s: float) -> Tuple[Source, Optional[Tuple[Estimate, str]], bool]:
    """Source 3 per GPU model: its ``Source``, the largest estimate and its GPU model, whether one timed out.

    Raises ``EstimateError`` from ``estimate_fn``.
    """
    if spec is None:
        return Source("directives", None, "no #COLOC model= line"), None, False
    if estimate_fn is None:
        return Source("directives", None, "no estimator here"), None, False
    found = [(estimate_fn(spec, name), name) for name in gpu_names]
    if any(e is None for e, _ in found):
        return Source("directives", None, f"the estimate of {spec.model} did not finish within "
                                          f"estimate_timeout_s ({estimate_timeout_s:g} s)"), None, True
    directive = _largest(found)
    src = Source("directives", directive[0].mem_mib,
                 f"{directive[0].method} of {spec.model} on {directive[1]}")
    return src, directive, False


def _ask_probe(gpu_names: Sequence[str], probe_fn: Optional[ProbeFn], probe_off_reason: str
               ) -> Tuple[Source, Optional[ProbeAnswer], Optional[Tuple[Estimate, str]]]:
    """Source 2 per GPU model: its ``Source``, the first model's answer (None: not run), the largest figure.

    The largest figure with its GPU model is None unless every GPU model got one.
    """
    if probe_fn is None:
        return Source("probe", None, probe_off_reason or "off"), None, None
    answers = [(probe_fn(name), name) for name in gpu_names]
    answer = answers[0][0]
    if not all(a.estimate is not None for a, _ in answers):
        failed = next(a for a, _ in answers if a.estimate is None)
        return Source("probe", None, failed.reason or "no figure"), answer, None
    probed = _largest([(a.estimate, name) for a, name in answers])
    precision = probed[0].detail.get("precision")
    src = Source("probe", probed[0].mem_mib, f"probe on {probed[1]}{f' ({precision})' if precision else ''}"
                                             f"{', cached' if answer.cached else ''}")
    return src, answer, probed


def _base_figure(probed: Optional[Tuple[Estimate, str]], directive: Optional[Tuple[Estimate, str]],
                 probe_src: Source) -> Tuple[Optional[Tuple[Estimate, str]], str, str, List[str]]:
    """The figure history applies to: the probe's over the directives' (module rule).

    Returns it (None: neither has one), its source's name, why it won, and the disagreement warning (more
    than ``DISAGREE_FRACTION``).
    """
    if probed is None:
        if directive is None:
            return None, "", "", []
        return directive, "directives", f"the directives' estimate (the probe has none: {probe_src.note})", []
    why = "the probe ran the script's own program: it ranks first after an override"
    warnings: List[str] = []
    if directive is not None:
        p, d = probed[0].mem_mib, directive[0].mem_mib
        off = (d - p) / max(p, 1)
        if abs(off) > DISAGREE_FRACTION:
            warnings.append(f"the #COLOC model estimate ({d} MiB) is {off:+.0%} off the probe of the "
                            "script's "
                            f"program ({p} MiB): using the probe's figure (check the #COLOC lines against "
                            f"the command line; --explain shows both)")
            why = (f"the probe and the directives differ by {off:+.0%} (> {DISAGREE_FRACTION:.0%}): "
                   "the probe wins")
        else:
            why = (f"the probe ranks above the directives (within {DISAGREE_FRACTION:.0%} of each other: "
                   f"{off:+.0%})")
    return probed, "probe", why, warnings


def _with_history(base: Optional[Tuple[Estimate, str]], base_name: str, hist: Optional[int], why: str
                  ) -> Tuple[Optional[int], Optional[str], Optional[str], str]:
    """Source 4 on the base figure (module rule): ``(mem_mib, method, GPU model, why)``; None: a whole GPU."""
    if base is not None and hist is not None:
        est, gpu = base
        floor = int(est.detail.get("trace_floor_mib") or est.mem_mib)  # a figure without a floor: only raised
        mem = max(hist, floor)
        verb = "raised" if mem > est.mem_mib else "lowered" if mem < est.mem_mib else "kept"
        why = (f"history {verb} the {base_name} figure ({est.mem_mib} MiB) to {mem} MiB"
               f"{' (its trace floor)' if mem == floor and hist < floor else ''}")
        return mem, "history", gpu, why
    if base is not None:
        est, gpu = base
        return est.mem_mib, est.method, gpu, why
    if hist is not None:
        return hist, "history", None, "only history: no probe or directive figure"
    return None, None, None, "no source gave a figure: a whole GPU"


def explain_lines(decision: Decision) -> List[str]:
    """``coloc-sbatch --explain`` lines (no newline): each source's figure or why none, the winner and why.

    Also the probe's "what it ran", its log tail and its writes outside the scratch directory;
    ``flops_per_step`` printed as GFLOP.
    """
    out = ["GPU memory sources, in order (docs/user.md, \"How your GPU request is translated\"):"]
    for i, src in enumerate(decision.sources, start=1):
        fig = f"{src.mem_mib:,} MiB" if src.mem_mib is not None else "-"
        out.append(f"  {i}. {src.name:<10} {fig:>11}  {src.note}")
    chosen = f"{decision.method} {decision.mem_mib:,} MiB" if decision.mem_mib is not None else "a whole GPU"
    out.append(f"chosen: {chosen}: {decision.why}")
    if decision.flops_per_step is not None:
        out.append(f"compute: {decision.flops_per_step / 1e9:,.1f} GFLOP per training step (job comment "
                   "flops_per_step, the placer's SM activity feature)")
    probe = decision.probe
    if probe is not None:
        out.append(f"probe: {probe.ran}{' (cached)' if probe.cached else f' in {probe.wall_s:.1f} s'}")
        if probe.reason:
            out.append(f"probe: no figure: {probe.reason}")
        writes = ", ".join(probe.outside_writes[:10]) + (" ..." if len(probe.outside_writes) > 10 else "")
        out.append(f"probe: writes outside its scratch directory: {writes or 'none'}")
        if probe.scratch_files:
            kept = ", ".join(probe.scratch_files[:10]) + (" ..." if len(probe.scratch_files) > 10 else "")
            out.append("probe: files it wrote in its scratch copy of the working directory (removed): "
                       f"{kept}")
        if probe.log_tail:
            out.append(f"probe: the program's output (last {len(probe.log_tail)} lines):")
            out.extend(f"  | {line}" for line in probe.log_tail)
        elif not probe.cached:
            out.append("probe: the program printed nothing")
    return out
