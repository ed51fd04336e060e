"""Profiles alone learned from shared runs: each signature's SM activity alone, solved from the co-run mixes
of every GPU, and each run's time alone, replayed through the sharing model (``placement/share.py``). Pure.
coloc-placer's history and coloc-report's ``vs alone`` both come from here.

Why this and not per-process counters: on an H200 under MPS, ``nvmlDeviceGetProcessUtilization`` reports only
the MPS server, never its clients (``../shared/reference/placement-anchors.md``), so a job's own share of a
shared GPU is not sampled. What is sampled is the GPU's aggregate SM activity (GPM SMACT) and which jobs held
it. While the GPU's SMs are not all busy (``y < UNSATURATED``), co-running jobs' activities add (the
collocation paper's additivity, and the sharing model's premise), so each unsaturated sample is one linear
equation ``sum(a_k for k computing) = y``; a saturated sample says only ``sum >= y``. Solved together over
every sample of every GPU, with each signature's prior (its prediction) weighted as ``PRIOR_WEIGHT`` samples,
by coordinate descent: a least-squares fit with bounds, small enough (a few signatures, a few thousand
samples) for pure Python. A signature that ran in many mixes is pinned by the data; one seen only on saturated
GPUs stays near its prior, raised where the saturated samples need more.

A run's time alone: its start-up (Slurm start to its first sample at 90 % of its peak memory: the model and
the first batches are on the GPU) plus its computing time scaled by the model's rate, ``min(1, capacity /
L)`` per sample (``share.slowdown``), L = the summed fitted activities of the runs computing then.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Protocol, Sequence, Tuple

HistoryKey = Tuple[Optional[int], str]  # (uid, job signature), as placement/intensity.py keys history

GpuKey = Tuple[str, int]  # (node database name, GPU index)

UNSATURATED = 0.9
"""Aggregate SMACT below which a sample's activities add (fraction). GPM SMACT of one GPU reads at most 1.0,
and reads 0.95-1.0 whenever co-running jobs keep every SM busy (2x H200 blind passes, docs/benchmarks.md)."""
PRIOR_WEIGHT = 3.0
"""A signature's prior counts as this many samples (a 0.5-s sampler: 1.5 s of data)."""
SMACT_BOUNDS = (0.02, 1.0)
DEFAULT_STARTUP_S = 10.0
"""Start-up counted for a run without process samples (s): the median start-up of the 2x H200 pile's runs
alone was 10 s (``h200x2-placement-throughput/pile-exclusive.json``)."""
EDGE_S = 2.0
"""Seconds after a run begins computing and before it ends in which its activity is not typical (warm-up,
the last steps, saving, process exit): a sample there does not enter the fit. On the 2x H200 project pile the
readings of a ResNet-50 in its last 4 s were 0.33-0.73 against 0.72 alone."""
MIN_CLEAN_S = 5.0
"""Seconds of unsaturated samples a signature needs in the fit to be learned below its prior: with fewer, the
data do not pin it (a GPU kept saturated only says the sum is at least the reading), and a signature learned
too light is the one that breaks the slowdown bound, so it keeps at least its prior."""


@dataclass(frozen=True)
class SharedRun:
    """One finished run on one GPU: its history key, when it started, began computing and ended (Unix s),
    and its prior SM activity alone (fraction: its prediction, or the signature's history)."""

    job_id: int
    key: HistoryKey
    gpu: GpuKey
    start_ts: float
    compute_ts: float
    end_ts: float
    prior_smact: float

    def computing(self, ts: float) -> bool:
        return self.compute_ts <= ts < self.end_ts

    def steady(self, t0: float, t1: float) -> Optional[bool]:
        """Whether it computed steadily over ``[t0, t1]`` (True), not at all (False), or for part of it or
        near an edge (None: the interval says nothing clean of it)."""
        if t1 <= self.compute_ts or t0 >= self.end_ts:
            return False
        if t0 >= self.compute_ts + EDGE_S and t1 <= self.end_ts - EDGE_S:
            return True
        return None


@dataclass(frozen=True)
class Sample:
    """One GPU sample: Unix s, aggregate SM activity (fraction), and the seconds it stands for."""

    ts: float
    smact: float
    res_s: float


@dataclass(frozen=True)
class LearnedRun:
    """A run's profile alone as learned: SM activity alone (fraction, the signature's fitted value), run and
    start-up time alone (s), the samples that saw it compute, and whether another run shared its GPU."""

    job_id: int
    key: HistoryKey
    smact: float
    run_s: float
    startup_s: float
    n_samples: int
    shared: bool


Row = Tuple[Dict[int, int], float, bool]  # (key column -> runs computing, aggregate SMACT, saturated)


def _rows(runs: Sequence[SharedRun], samples: Mapping[GpuKey, Sequence[Sample]],
          col: Mapping[HistoryKey, int]) -> List[Row]:
    """One row per sample whose interval ``(ts - res_s, ts]`` every run on its GPU either computed through
    steadily or not at all (``SharedRun.steady``), with at least one computing: GPM activity is a mean over
    the interval, so a run that began, ended or was near an edge within it would be credited with a reading it
    only partly made."""
    by_gpu: Dict[GpuKey, List[SharedRun]] = {}
    for r in runs:
        by_gpu.setdefault(r.gpu, []).append(r)
    rows: List[Row] = []
    for gpu, here in by_gpu.items():
        for s in samples.get(gpu, ()):
            states = [(r, r.steady(s.ts - s.res_s, s.ts)) for r in here]
            if any(st is None for _, st in states):
                continue
            x: Dict[int, int] = {}
            for r, _ in (rs for rs in states if rs[1]):
                x[col[r.key]] = x.get(col[r.key], 0) + 1
            if x:
                rows.append((x, s.smact, s.smact >= UNSATURATED))
    return rows


def _sweep(a: List[float], prior: Sequence[float], rows: Sequence[Row], pred: List[float],
           where: Sequence[Sequence[int]]) -> None:
    """One coordinate-descent sweep: each key's exact bounded minimiser with the others held (in place)."""
    lo, hi = SMACT_BOUNDS
    for i in range(len(a)):
        num, den = PRIOR_WEIGHT * prior[i], PRIOR_WEIGHT
        for t in where[i]:
            x, y, sat = rows[t]
            if sat and pred[t] >= y:
                continue  # saturated and already explained: no pull
            num += x[i] * (y - (pred[t] - a[i] * x[i]))
            den += x[i] * x[i]
        new = min(hi, max(lo, num / den))
        for t in where[i]:
            pred[t] += (new - a[i]) * rows[t][0][i]
        a[i] = new


def fit_activity(runs: Sequence[SharedRun], samples: Mapping[GpuKey, Sequence[Sample]],
                 sweeps: int = 60) -> Dict[HistoryKey, float]:
    """Each key's SM activity alone (fraction in ``SMACT_BOUNDS``) that best explains the GPUs' samples
    (module docstring); a key with no sample keeps its prior (the mean of its runs' priors)."""
    keys = sorted({r.key for r in runs}, key=repr)
    col = {k: i for i, k in enumerate(keys)}
    total = [0.0] * len(keys)
    count = [0] * len(keys)
    for r in runs:
        total[col[r.key]] += r.prior_smact
        count[col[r.key]] += 1
    prior = [p / max(1, c) for p, c in zip(total, count)]
    rows = _rows(runs, samples, col)
    a = list(prior)
    pred = [sum(a[i] * n for i, n in x.items()) for x, _, _ in rows]
    where: List[List[int]] = [[] for _ in keys]
    for t, (x, _, _) in enumerate(rows):
        for i in x:
            where[i].append(t)
    for _ in range(sweeps):
        _sweep(a, prior, rows, pred, where)
    clean_s = [0.0] * len(keys)  # seconds of unsaturated rows each key computed in
    res = [s.res_s for gpu in samples.values() for s in gpu]
    step = sorted(res)[len(res) // 2] if res else 0.0
    for x, _, sat in rows:
        if not sat:
            for i in x:
                clean_s[i] += step
    return {k: a[col[k]] if clean_s[col[k]] >= MIN_CLEAN_S else max(a[col[k]], prior[col[k]]) for k in keys}


def learn(runs: Sequence[SharedRun], samples: Mapping[GpuKey, Sequence[Sample]],
          capacity: Callable[[GpuKey], float]) -> List[LearnedRun]:
    """One ``LearnedRun`` per run with at least one sample while computing, in ``runs`` order (module
    docstring); never raises on empty input.

    ``runs``: finished runs that ended normally, several GPUs and nodes at once (the caller leaves out killed,
    cancelled, preempted and OOM'd runs: their time says nothing of their work); ``samples``: per GPU, any
    order; ``capacity``: a GPU model's sharing capacity (summed SMACT alone, ``Calibration.capacity_for``).
    """
    fitted = fit_activity(runs, samples)
    by_gpu: Dict[GpuKey, List[SharedRun]] = {}
    for r in runs:
        by_gpu.setdefault(r.gpu, []).append(r)
    out: List[LearnedRun] = []
    for r in runs:
        here = by_gpu[r.gpu]
        shared = any(o.job_id != r.job_id and o.start_ts < r.end_ts and o.end_ts > r.start_ts for o in here)
        cap = capacity(r.gpu)
        work, n = 0.0, 0
        for s in samples.get(r.gpu, ()):
            if not r.computing(s.ts):
                continue
            load = sum(fitted[o.key] for o in here if o.computing(s.ts))
            work += s.res_s * (min(1.0, cap / load) if load > 0 and cap > 0 else 1.0)
            n += 1
        if n:
            startup = max(0.0, r.compute_ts - r.start_ts)
            out.append(LearnedRun(r.job_id, r.key, fitted[r.key], startup + work, startup, n, shared))
    return out


DEFAULT_CALIBRATION = Path(__file__).with_name("placement") / "calibration.json"


def capacity_reader(path: Optional[str] = None) -> Callable[[str], float]:
    """A GPU model's sharing capacity (summed SMACT alone, fraction) from the placement calibration JSON
    (``share_capacity``, ``share_capacity_by_gpu``: the longest key the model name contains), for readers that
    do not load the placer (coloc-report); 1.0 when the file cannot be read (``placement.intensity`` is the
    placer's checked loader)."""
    try:
        d = json.loads(Path(path or DEFAULT_CALIBRATION).read_text(encoding="utf-8"))
        default = float(d.get("share_capacity", 1.0))
        by_gpu = {str(k): float(v) for k, v in d.get("share_capacity_by_gpu", {}).items()}
    except (OSError, ValueError, TypeError, AttributeError):
        default, by_gpu = 1.0, {}

    def capacity(model: str) -> float:
        keys = sorted((k for k in by_gpu if k and k in (model or "")), key=len, reverse=True)
        return by_gpu[keys[0]] if keys else default
    return capacity


class GpuRecord(Protocol):
    """One GPU's runs and samples as a node database gives them (``store.placement.GpuCoRuns``)."""

    @property
    def gpu_index(self) -> int: ...

    @property
    def name(self) -> str: ...

    @property
    def runs(self) -> List[Tuple[int, float, float, Optional[float]]]:
        """job id, start, end, compute start (Unix s)."""

    @property
    def samples(self) -> List[Tuple[float, float, float]]:
        """ts (Unix s), SMACT (fraction), res_s."""


@dataclass(frozen=True)
class Mixes:
    """The learner's input from one node's GPUs: the runs, each GPU's samples, and each GPU's model name."""

    runs: List[SharedRun]
    samples: Dict[GpuKey, List[Sample]]
    models: Dict[GpuKey, str]

    def learn(self, capacity: Callable[[str], float]) -> List[LearnedRun]:
        """``learn`` over these mixes, ``capacity`` of a GPU's model name."""
        return learn(self.runs, self.samples, lambda k: capacity(self.models.get(k, "")))


def mixes(node: str, gpus: Iterable[GpuRecord],
          key_prior: Callable[[int], Tuple[HistoryKey, float]]) -> Mixes:
    """``Mixes`` of one node's GPU records; ``key_prior(job_id)`` gives each run's history key and prior SM
    activity; a run without a compute start begins computing ``DEFAULT_STARTUP_S`` after its start."""
    out = Mixes([], {}, {})
    for g in gpus:
        key = (node, g.gpu_index)
        out.models[key] = g.name
        out.samples[key] = [Sample(ts, v, res) for ts, v, res in g.samples]
        for job_id, start, end, compute in g.runs:
            hkey, prior = key_prior(job_id)
            begin = compute if compute is not None else min(end, start + DEFAULT_STARTUP_S)
            out.runs.append(SharedRun(job_id, hkey, key, start, begin, end, prior))
    return out
