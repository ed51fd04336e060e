"""The GPU memory figure of a one-GPU job (MiB, headroom not included): ``decide``, pure, from what the
sources said (``EstimateEvidence``, gathered by ``submit/plan.py`` and ``combine.combined_estimate``) to the
figure and why (``EstimateVerdict``). Sources, in order (docs/user.md, "How your GPU request is translated"):

1. ``override`` (``--coloc-mem``, else ``#COLOC mem=``): the fence the user asked for, exactly; no other runs.
2. ``probe``: the script's own training program run under the script probe (``probe/``).
3. ``directives``: the estimate of the ``#COLOC model=`` spec. With both, 2 wins (the directives repeat the
   command line by hand, unchecked); more than ``DISAGREE_FRACTION`` of 2's figure apart: a warning.
4. ``history``: ``history_bound`` of earlier runs' peaks and OOM fences. It replaces a figure of 2 or 3, never
   below that figure's ``trace_floor_mib`` (its replayed allocations plus context and libraries,
   uncalibrated); alone, it is the figure.
5. ``whole-gpu``: no figure; the caller asks for a whole GPU.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from slurm_coloc.estimate.spec import Estimate

HISTORY_MARGIN = 0.05
HISTORY_PAD_MIB = 64
DISAGREE_FRACTION = 0.20  # directives vs probe: more than this apart (of the probe's figure) -> a warning


def history_bound(history_mib: Sequence[int]) -> Optional[int]:
    """``max(history) * (1 + HISTORY_MARGIN) + HISTORY_PAD_MIB`` MiB rounded up; None entries and values <= 0
    skipped; None without usable history."""
    good = [int(h) for h in history_mib if h is not None and int(h) > 0]
    if not good:
        return None
    return int(math.ceil(max(good) * (1 + HISTORY_MARGIN) + HISTORY_PAD_MIB))


@dataclass(frozen=True)
class ProbeAnswer:
    """What the probe said for one GPU model (from ``probe.ProbeResult``): the figure (method ``probe``) or
    None and why; ``outside_writes``: paths opened for writing outside its scratch directory;
    ``scratch_files``: files written in its scratch copy of the working directory (removed)."""

    estimate: Optional[Estimate]
    ran: str
    reason: str = ""
    log_tail: Tuple[str, ...] = ()
    outside_writes: Tuple[str, ...] = ()
    cached: bool = False
    wall_s: float = 0.0
    scratch_files: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Candidate:
    """The probe's or the directives' figure (the largest over the job's GPU models) or None; ``note``: what
    it is or why none; ``trace_floor_mib``: the lowest history may bring it to (None: history only raises)."""

    note: str
    estimate: Optional[Estimate] = None
    gpu_model: str = ""
    trace_floor_mib: Optional[int] = None

    @classmethod
    def of(cls, estimate: Estimate, gpu_model: str, note: str) -> "Candidate":
        """``estimate`` for ``gpu_model``, its floor from its detail (``combine.bound_from_trace`` writes it
        there, so it survives the estimate cache and the estimate child's JSON)."""
        floor = estimate.detail.get("trace_floor_mib")
        return cls(note, estimate, estimate.gpu_model or gpu_model, int(floor) if floor else None)


@dataclass(frozen=True)
class EstimateEvidence:
    """What the sources said; ``timed_out``: the directives' estimate did not finish; ``history_mib``: earlier
    runs' peaks (module rule 4); ``probe_answer``: the first GPU model's (None: not run)."""

    override_mib: Optional[int] = None
    probe: Candidate = Candidate("off")
    directives: Candidate = Candidate("no #COLOC model= line")
    history_mib: Tuple[int, ...] = ()
    timed_out: bool = False
    probe_answer: Optional[ProbeAnswer] = None


@dataclass(frozen=True)
class Source:
    """One source's figure (MiB), or why none; ``note``: what the figure is (``analytic on H100``)."""

    name: str
    mem_mib: Optional[int]
    note: str


@dataclass(frozen=True)
class EstimateVerdict:
    """The figure (None: a whole GPU) and why. ``method``: ``override`` | ``probe`` | the estimator's
    (``analytic``) | ``history`` | None; ``timed_out``: no figure and the directives' estimate did not finish;
    ``flops_per_step``: the probe's count, else the directives'; ``history_below_floor_mib``: history's figure
    where the trace floor overruled it."""

    mem_mib: Optional[int]
    method: Optional[str]
    gpu_model: Optional[str]
    why: str
    sources: Tuple[Source, ...]
    warnings: Tuple[str, ...] = ()
    timed_out: bool = False
    probe: Optional[ProbeAnswer] = None
    flops_per_step: Optional[int] = None
    history_peak_mib: Optional[int] = None
    history_below_floor_mib: Optional[int] = None


def decide(ev: EstimateEvidence) -> EstimateVerdict:
    """The figure and why (module rule)."""
    if ev.override_mib is not None:
        skip = "not consulted: the override wins"
        asked = Source("override", ev.override_mib, "--coloc-mem / #COLOC mem= (exact, no headroom)")
        why = "an override is the fence you asked for, exactly"
        return EstimateVerdict(ev.override_mib, "override", None, why, (asked, *(
            Source(n, None, skip) for n in ("probe", "directives", "history", "whole-gpu"))))
    probe, directives = ev.probe, ev.directives
    base, base_name = (probe, "probe") if probe.estimate is not None else (directives, "directives")
    why, warnings = _ranking(probe, directives)
    peaks = [int(h) for h in ev.history_mib if h and int(h) > 0]
    hist = history_bound(peaks)
    mem, method, gpu, below = None, None, None, None
    if base.estimate is not None:
        est = base.estimate
        mem, method, gpu = est.mem_mib, est.method, base.gpu_model
        if hist is not None:  # the history rule, the one place it is written
            floor = base.trace_floor_mib or est.mem_mib  # a figure without a floor: only raised
            mem, method, below = max(hist, floor), "history", hist if hist < floor else None
            verb = "raised" if mem > est.mem_mib else "lowered" if mem < est.mem_mib else "kept"
            why = (f"history {verb} the {base_name} figure ({est.mem_mib} MiB) to {mem} MiB"
                   f"{' (its trace floor)' if below is not None else ''}")
    elif hist is not None:
        mem, method, why = hist, "history", "only history: no probe or directive figure"
    else:
        why = "no source gave a figure: a whole GPU"
    sources = (Source("override", None, "no --coloc-mem / #COLOC mem="),
               Source("probe", probe.estimate.mem_mib if probe.estimate else None, probe.note),
               Source("directives", directives.estimate.mem_mib if directives.estimate else None,
                      directives.note),
               Source("history", hist, f"max {max(peaks)} MiB of {len(peaks)} earlier run(s) x "
                      f"{1 + HISTORY_MARGIN:g} + {HISTORY_PAD_MIB}" if hist is not None
                      else "no earlier run of this script recorded"),
               Source("whole-gpu", None, "not needed" if mem is not None else "the fallback: a whole GPU"))
    flops = next((e.flops_per_step for e in (probe.estimate, directives.estimate)
                  if e is not None and e.flops_per_step is not None), None)
    return EstimateVerdict(mem, method, gpu, why, sources, tuple(warnings), ev.timed_out and mem is None,
                           ev.probe_answer, flops, max(peaks) if peaks else None, below)


def _ranking(probe: Candidate, directives: Candidate) -> Tuple[str, List[str]]:
    """Why the probe's figure wins over the directives' (or the directives' stands), and the disagreement
    warning (more than ``DISAGREE_FRACTION`` apart); ``""`` when neither has a figure."""
    if probe.estimate is None:
        if directives.estimate is None:
            return "", []
        return f"the directives' estimate (the probe has none: {probe.note})", []
    if directives.estimate is None:
        return "the probe ran the script's own program: it ranks first after an override", []
    p, d = probe.estimate.mem_mib, directives.estimate.mem_mib
    off = (d - p) / max(p, 1)
    if abs(off) <= DISAGREE_FRACTION:
        return (f"the probe ranks above the directives (within {DISAGREE_FRACTION:.0%} of each other: "
                f"{off:+.0%})"), []
    return (f"the probe and the directives differ by {off:+.0%} (> {DISAGREE_FRACTION:.0%}): the probe wins",
            [f"the #COLOC model estimate ({d} MiB) is {off:+.0%} off the probe of the script's program "
             f"({p} MiB): using the probe's figure (check the #COLOC lines against the command line; "
             "--explain shows both)"])


def explain_lines(verdict: EstimateVerdict) -> List[str]:
    """``coloc-sbatch --explain`` lines (no newline): each source's figure or why none, the winner and why,
    the GFLOP count, and what the probe ran, printed and wrote."""
    out = ["GPU memory sources, in order (docs/user.md, \"How your GPU request is translated\"):"]
    for i, src in enumerate(verdict.sources, start=1):
        fig = f"{src.mem_mib:,} MiB" if src.mem_mib is not None else "-"
        out.append(f"  {i}. {src.name:<10} {fig:>11}  {src.note}")
    chosen = f"{verdict.method} {verdict.mem_mib:,} MiB" if verdict.mem_mib is not None else "a whole GPU"
    out.append(f"chosen: {chosen}: {verdict.why}")
    if verdict.flops_per_step is not None:
        out.append(f"compute: {verdict.flops_per_step / 1e9:,.1f} GFLOP per training step (job comment "
                   "flops_per_step, the placer's SM activity feature)")
    probe = verdict.probe
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
