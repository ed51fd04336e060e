"""Why a job's GPU share sat idle, and what to change: named findings from the sampler's fine-grained metrics
(pure; ``add_findings`` puts them on a ``JobView``), and the reasons it wasted its share (``flag_waste``).

Inputs: a job's ``JobView`` (SM activity/occupancy, tensor and DRAM activity, the idle share of its samples,
peak memory vs request, batch and precision of its spec) and, for ``coloc-report advise``, its sample series.
Thresholds are the config's ``diag_*`` keys. Each finding has a name (also its AdminComment code), evidence in
numbers and one suggestion; the first is the top one. Rules (docs/report.md, "Findings"; metrics as in
Yousefzadeh-Asl-Miandoab et al., EuroMLSys'23: SM activity = share of time an SM had a warp resident, SM
occupancy = resident warps / maximum, averaged over SMs and time):
- ``input-bound``: mean SM activity below ``diag_input_bound_smact_pct`` and at least
  ``diag_input_bound_idle_pct`` of the samples with the job's process on the GPU idle (SM activity <
  ``diag_idle_smact_pct``), AND the job's CPU use (node/cpu.py) says it waited for data: loader workers
  saturated (``diag_loader_busy_pct`` % of one core each, or the job's processes that share of its CPUs), or
  workers present while the training process used at most ``diag_train_waiting_cores`` (I/O), or no workers
  while the training process was busy (``diag_train_busy_cores``) with a batch above ``diag_small_batch`` and
  the GPU idle in ``diag_input_bound_self_idle_pct`` of the samples (a launch-bound loop also keeps one core
  busy but idles the GPU less: 18-54% of the samples on the H100 for ResNet-18/32 and ResNet-50 at batch 2,
  against 95% for a starved loader). Without CPU figures the rule does not judge.
- ``no-tensor-cores``: mean SM activity at least ``diag_no_tensor_min_smact_pct``, tensor activity below
  ``diag_no_tensor_max_tensor_pct``, and the spec's precision fp32 (or unknown).
- ``low-occupancy``: mean SM occupancy below ``diag_low_occupancy_smocc_pct`` with SM activity at least
  ``diag_low_occupancy_min_smact_pct`` and a batch of at most ``diag_small_batch``; CPU figures as evidence.
- ``over-request``: request at least ``diag_over_request_ratio`` x (peak + ``headroom_mib``) (not for OOM
  reruns or deaths, whose request is the GPU or the fence).
Transfer-bound is not judged: the sampler records DRAM bandwidth, not PCIe throughput.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Mapping, Optional, Sequence

from slurm_coloc.config import Config
from slurm_coloc.report.summarize import JobView
from slurm_coloc.units import format_mib

NOT_JUDGED = "transfer-bound not judged (the sampler records DRAM bandwidth, not PCIe throughput)"


@dataclass(frozen=True)
class Finding:
    """One named problem: ``name`` (a short code without spaces), ``evidence`` and ``suggestion`` in words."""

    name: str
    evidence: str
    suggestion: str

    def to_json(self) -> Dict[str, str]:
        """``{"name", "evidence", "suggestion"}``."""
        return {"name": self.name, "evidence": self.evidence, "suggestion": self.suggestion}


@dataclass(frozen=True)
class Diagnosis:
    """Findings, top one first, and ``notes``: why a rule could not judge the job (thin evidence)."""

    findings: List[Finding] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)


@dataclass(frozen=True)
class JobStats:
    """The figures the rules read (% unless named; None: not recorded); ``active_samples``: samples with the
    job's process on its GPU, ``smact_idle_pct``: share of those with SM activity below the idle threshold."""

    smact_mean: Optional[float] = None
    smocc_mean: Optional[float] = None
    tensor_mean: Optional[float] = None
    dram_mean: Optional[float] = None
    smact_idle_pct: Optional[float] = None
    active_samples: Optional[int] = None


@dataclass(frozen=True)
class CpuStats:
    """The job's CPU use (node/cpu.py) in cores: ``train`` its CUDA process(es), ``workers`` their
    descendants (``n_workers`` on average), ``cpus`` the job's CPUs, ``samples`` rows behind the means."""

    train: float
    workers: Optional[float]
    n_workers: Optional[float]
    cpus: Optional[int]
    samples: int

    def words(self) -> str:
        """``training process 0.2 cores, 1 loader worker at 1.0 cores (4 CPUs)``."""
        w = ("loader workers not readable" if self.n_workers is None or self.workers is None else
             "no loader worker" if self.n_workers < 0.5 else
             f"{self.n_workers:.0f} loader worker{'s' if round(self.n_workers) != 1 else ''} at "
             f"{self.workers:.1f} cores")
        return f"training process {self.train:.1f} cores, {w}" + (f" ({self.cpus} CPUs)" if self.cpus else "")


def cpu_of(job: JobView) -> Optional[CpuStats]:
    """None when the job's CPU use was not recorded."""
    if job.train_cpu_cores is None or not job.cpu_samples:
        return None
    return CpuStats(float(job.train_cpu_cores), job.workers_cpu_cores, job.cpu_workers, job.cpus,
                    int(job.cpu_samples))


def _mean(xs: Sequence[float]) -> Optional[float]:
    return sum(xs) / len(xs) if xs else None


def stats_from_series(series: Sequence[Mapping[str, Any]], idle_smact_pct: float) -> JobStats:
    """``JobStats`` from a job's samples in time order (% rates; ``job_mem_mib`` None without its process),
    as the Epilog's summary defines them (node/lifecycle.py): means over the span, the idle share (SM activity
    below ``idle_smact_pct`` %) and ``active_samples`` over the samples with the job's process."""
    def col(key: str) -> List[float]:
        return [float(s[key]) for s in series if s.get(key) is not None]

    active = [float(s["smact_pct"]) for s in series if s.get("job_mem_mib")
              and s.get("smact_pct") is not None]
    return JobStats(smact_mean=_mean(col("smact_pct")), smocc_mean=_mean(col("smocc_pct")),
                    tensor_mean=_mean(col("tensor_pct")), dram_mean=_mean(col("dram_bw_pct")),
                    smact_idle_pct=100.0 * sum(1 for x in active if x < idle_smact_pct) / len(active)
                    if active else None,
                    active_samples=sum(1 for s in series if s.get("job_mem_mib")))


def stats_of(job: JobView) -> JobStats:
    """``JobStats`` from the Epilog summary's figures."""
    return JobStats(smact_mean=job.smact_mean, smocc_mean=job.smocc_mean, tensor_mean=job.tensor_mean,
                    dram_mean=job.dram_mean, smact_idle_pct=job.smact_idle_pct,
                    active_samples=job.active_samples)


def _input_advice(cpu: CpuStats, cfg: Config) -> str:
    """The input-bound suggestion: more workers where the job's CPUs leave room, else more CPUs."""
    workers = round(cpu.n_workers or 0.0)
    more = ("<CPUs of the job - 1>" if not cpu.cpus or cpu.cpus - 1 <= workers else
            f"{cpu.cpus - 1} (the job has {cpu.cpus} CPUs)")
    full = cpu.cpus and cpu.train + (cpu.workers or 0.0) >= cfg.diag_loader_busy_pct / 100.0 * cpu.cpus
    room = "" if not full else (
        f"its {cpu.cpus} CPUs are taken: ask for more with `#SBATCH --cpus-per-task` and raise num_workers, "
        "or ")
    return (f"feed the GPU faster: {room}DataLoader(num_workers={more}, pin_memory=True, "
            "persistent_workers=True) "
            "with `#SBATCH --cpus-per-task` to match, or pre-process the data once (decode/augment offline)")


def _waiting_for_input(job: JobView, cpu: Optional[CpuStats], cfg: Config, idle_pct: float) -> Optional[str]:
    """Why the CPU figures say the GPU waited for data (words), or None (module rules); ``idle_pct``: samples
    with the GPU idle (%), needed at ``diag_input_bound_self_idle_pct`` without workers (kernel launches)."""
    if cpu is None:
        return None
    busy = cfg.diag_loader_busy_pct / 100.0
    has_workers = cpu.n_workers is not None and cpu.n_workers >= 0.5
    if has_workers and cpu.workers is not None \
            and cpu.workers >= busy * cpu.n_workers:  # type: ignore[operator]
        return "the loader workers were saturated"
    if has_workers and cpu.cpus and cpu.train + (cpu.workers or 0.0) >= busy * cpu.cpus:
        return "the job's CPUs were saturated"
    if has_workers and cpu.train <= cfg.diag_train_waiting_cores:
        return "the training process waited for its loader workers (reading data?)"
    batch = getattr(job, "batch_size", None)
    if (cpu.n_workers is not None and not has_workers and cpu.train >= cfg.diag_train_busy_cores
            and batch is not None and batch > cfg.diag_small_batch
            and idle_pct >= cfg.diag_input_bound_self_idle_pct):
        return "the training process loads the data itself (no loader worker)"
    return None


def _over_request(job: JobView, cfg: Config) -> Optional[Finding]:
    req, peak = job.requested_mib, job.peak_mem_mib
    if req is None or peak is None or peak <= 0 or job.retry_of or job.oom:
        return None
    need_gib = max(1, math.ceil((peak + cfg.headroom_mib) / 1024))
    if req < cfg.diag_over_request_ratio * need_gib * 1024:
        return None
    return Finding(
        "over-request",
        f"peak {format_mib(peak)} of {format_mib(req)} requested ({100 * (1 - peak / req):.0f}% never used)",
        f"request `#COLOC mem={need_gib}G` (peak + {cfg.headroom_mib} MiB headroom), or drop the memory "
        "override "
        f"and let coloc-sbatch estimate it: the rest of the GPU can then run other jobs")


def diagnose(job: JobView, cfg: Config, series: Optional[Sequence[Mapping[str, Any]]] = None) -> Diagnosis:
    """The findings of ``job`` (usage filled in), top first; ``series`` fills what it lacks. No GPU-metric
    finding below ``diag_min_runtime_s`` or ``diag_min_samples`` active samples (``notes`` says so)."""
    notes: List[str] = []
    found: List[Finding] = []
    st = stats_of(job)
    if series is not None and (st.smact_idle_pct is None or st.tensor_mean is None):
        st = stats_from_series(series, cfg.diag_idle_smact_pct)
    runtime = job.runtime_s
    thin = None
    if runtime is None or runtime < cfg.diag_min_runtime_s:
        thin = f"ran {0 if runtime is None else runtime:.0f} s (< {cfg.diag_min_runtime_s:g} s)"
    elif st.smact_mean is None:
        thin = "SM activity not recorded (GPM needs Hopper or newer)"
    elif st.active_samples is not None and st.active_samples < cfg.diag_min_samples:
        thin = f"{st.active_samples} samples with the job on the GPU (< {cfg.diag_min_samples})"
    if thin:
        notes.append(f"GPU activity not judged: {thin}")
    else:
        found.extend(_gpu_findings(job, st, cfg, notes))
        notes.append(NOT_JUDGED)
    over = _over_request(job, cfg)
    if over is not None:
        found.append(over)
    return Diagnosis(found, notes)


def _gpu_findings(job: JobView, st: JobStats, cfg: Config, notes: List[str]) -> List[Finding]:
    out: List[Finding] = []
    sm = float(st.smact_mean or 0.0)
    cpu = cpu_of(job)
    if st.smact_idle_pct is None:
        notes.append("input-bound not judged: the idle share of the samples was not recorded")
    elif sm < cfg.diag_input_bound_smact_pct and st.smact_idle_pct >= cfg.diag_input_bound_idle_pct:
        gpu_side = (f"SM activity {sm:.1f}% mean; the GPU was idle (< {cfg.diag_idle_smact_pct:g}% SM "
                    "activity) in "
                    f"{st.smact_idle_pct:.0f}% of the samples while the job's process held it")
        why = _waiting_for_input(job, cpu, cfg, st.smact_idle_pct)
        if cpu is None or cpu.samples < cfg.diag_min_samples:
            notes.append(f"input-bound not judged (thin evidence): {gpu_side}, but the job's CPU use was "
                         f"{'not recorded' if cpu is None else f'recorded in {cpu.samples} samples only'}, "
                         "so "
                         f"waiting for input cannot be told from a launch-bound loop")
        elif why is None:
            notes.append(f"not input-bound: {gpu_side}, but {cpu.words()}: no loader starved it")
        else:
            out.append(Finding("input-bound", f"{gpu_side}; {cpu.words()}: {why}", _input_advice(cpu, cfg)))
    precision = (job.precision or "").lower()
    if st.tensor_mean is None:
        notes.append("tensor-core use not judged: tensor activity not recorded")
    elif (sm >= cfg.diag_no_tensor_min_smact_pct and st.tensor_mean < cfg.diag_no_tensor_max_tensor_pct
          and precision in ("", "fp32")):
        out.append(Finding(
            "no-tensor-cores",
            f"SM activity {sm:.0f}% mean but tensor-core activity {st.tensor_mean:.1f}% "
            f"(precision {precision or 'unknown, no spec'}): the math runs on the FP32 units",
            "train in mixed precision: torch.autocast('cuda', dtype=torch.bfloat16) around forward and loss "
            "(or "
            "fp16 with torch.amp.GradScaler); at least torch.backends.cuda.matmul.allow_tf32 = True"))
    if st.smocc_mean is not None and job.batch_size is not None:
        if (st.smocc_mean < cfg.diag_low_occupancy_smocc_pct and sm >= cfg.diag_low_occupancy_min_smact_pct
                and job.batch_size <= cfg.diag_small_batch):
            launch = ""
            if cpu is not None and cpu.samples >= cfg.diag_min_samples \
                    and cpu.train >= cfg.diag_train_busy_cores:
                launch = f"; {cpu.words()}: the training loop is busy launching small kernels"
            out.append(Finding(
                "low-occupancy",
                f"SM occupancy {st.smocc_mean:.1f}% mean at {sm:.0f}% SM activity with batch "
                f"{job.batch_size}: "
                f"each kernel keeps few warps busy{launch}",
                f"raise the batch size (e.g. to {max(32, 4 * job.batch_size)}, scaling the learning rate; "
                "the "
                f"request grows with it: coloc-sbatch re-estimates it from `#COLOC batch=`)"))
    elif st.smocc_mean is not None:
        notes.append("batch size not judged: the job has no recorded spec (#COLOC batch=)")
    return out


def add_findings(job: JobView, cfg: Config, series: Optional[Sequence[Dict[str, object]]] = None) -> JobView:
    """``job`` with its diagnosis as ``findings`` dicts, top first; ``series`` as for ``diagnose``."""
    d = diagnose(job, cfg, series)
    return replace(job, findings=[f.to_json() for f in d.findings])


def flag_waste(job: JobView, cfg: Config) -> JobView:
    """``job`` with ``waste`` set to the reasons (in words) it wasted its GPU share; ``job`` itself when none.
    Rules: SM activity mean (%) below ``report_waste_smact_pct``; more than ``report_waste_unused_pct`` % of
    the requested memory never used; jobs shorter than ``report_waste_min_runtime_s`` (s) are not judged."""
    if job.runtime_s is None or job.runtime_s < cfg.report_waste_min_runtime_s:
        return job
    reasons: List[str] = []
    if job.smact_mean is not None and job.smact_mean < cfg.report_waste_smact_pct:
        reasons.append(f"low SM activity: {job.smact_mean:.1f}% mean (< {cfg.report_waste_smact_pct:g}%), "
                       f"the GPU mostly waited")
    if job.unused_mib is not None and job.requested_mib:
        unused_pct = 100.0 * job.unused_mib / job.requested_mib
        if unused_pct > cfg.report_waste_unused_pct:
            reasons.append(f"memory far below request: peak {format_mib(job.peak_mem_mib)} of "
                           f"{format_mib(job.requested_mib)} requested ({unused_pct:.0f}% unused)")
    return replace(job, waste=reasons) if reasons else job
