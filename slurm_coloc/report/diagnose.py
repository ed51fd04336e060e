"""Why a job's GPU share sat idle, and what to change: named findings from the sampler's fine-grained metrics
(pure).

Inputs are a job's report view (``JobView``: SM activity/occupancy, tensor and DRAM activity, the idle share
of its samples, peak memory vs request, batch and precision of its recorded spec) and, for ``coloc-report
advise``, its per-sample series. Thresholds are the config's ``diag_*`` keys. Each finding has a name (also
its AdminComment code), its evidence in numbers and one concrete suggestion; the first is the top one.

Rules (docs/report.md, "Findings"; metric meanings from Yousefzadeh-Asl-Miandoab et al., EuroMLSys'23: SM
activity = share of time an SM had a warp resident, SM occupancy = resident warps / maximum, averaged over SMs
and time):
- ``input-bound``: mean SM activity below ``diag_input_bound_smact_pct`` and at least
  ``diag_input_bound_idle_pct`` of the samples with the job's process on the GPU idle (SM activity <
  ``diag_idle_smact_pct``): the GPU waited between bursts; AND the job's CPU use (node/cpu.py) says it waited
  for data: its loader workers saturated (at least ``diag_loader_busy_pct`` % of one core each, or the job's
  processes that share of its CPUs), or workers present while the training process used at most
  ``diag_train_waiting_cores`` (waiting for them: I/O), or no workers while the training process was busy (at
  least ``diag_train_busy_cores``) with a batch above ``diag_small_batch`` and the GPU idle in at least
  ``diag_input_bound_self_idle_pct`` of the samples (it loads the data itself; a launch-bound loop also keeps
  one core busy, but leaves the GPU idle less often: 18-54% of the samples on the H100 for ResNet-18/32 and
  ResNet-50 at batch 2, against 95% for a starved loader). Without CPU figures the rule does not judge (thin
  evidence): a launch-bound tiny batch idles the GPU between steps as a starved one does.
- ``no-tensor-cores``: mean SM activity at least ``diag_no_tensor_min_smact_pct`` while tensor activity stays
  below ``diag_no_tensor_max_tensor_pct`` and the spec's precision is fp32 (or unknown).
- ``low-occupancy``: mean SM occupancy below ``diag_low_occupancy_smocc_pct`` while SM activity is at least
  ``diag_low_occupancy_min_smact_pct`` and the spec's batch is at most ``diag_small_batch``; the CPU figures,
  when recorded, are given as evidence (a launch-bound training process: about one core busy, workers idle).
- ``over-request``: request at least ``diag_over_request_ratio`` x (peak + ``headroom_mib``) (not for OOM
  reruns or OOM deaths, whose request is the GPU or the fence).
Transfer-bound is not judged: the sampler records DRAM bandwidth, not PCIe throughput.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

from slurm_coloc.config import Config
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
    """Findings, top one first, and ``notes``: why a rule could not judge the job (thin or missing
    evidence)."""

    findings: List[Finding] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)


@dataclass(frozen=True)
class JobStats:
    """The figures the rules read (% unless named; None = not recorded).

    ``active_samples``: samples with a process of the job on its GPU; ``smact_idle_pct``: share of those with
    SM activity below the idle threshold.
    """

    smact_mean: Optional[float] = None
    smocc_mean: Optional[float] = None
    tensor_mean: Optional[float] = None
    dram_mean: Optional[float] = None
    smact_idle_pct: Optional[float] = None
    active_samples: Optional[int] = None


@dataclass(frozen=True)
class CpuStats:
    """The job's CPU use (node/cpu.py), in cores: ``train`` its CUDA process(es), ``workers`` the processes
    descending from them (``n_workers`` on average; None: not readable), ``cpus`` the job's CPUs on the node
    (None: unknown), ``samples`` rows behind the means."""

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


def cpu_of(job: Any) -> Optional[CpuStats]:
    """``CpuStats`` from a ``JobView``'s CPU fields; None when the job's CPU use was not recorded."""
    train = getattr(job, "train_cpu_cores", None)
    if train is None or not getattr(job, "cpu_samples", None):
        return None
    return CpuStats(float(train), job.workers_cpu_cores, job.cpu_workers, job.cpus, int(job.cpu_samples))


def _mean(xs: Sequence[float]) -> Optional[float]:
    return sum(xs) / len(xs) if xs else None


def stats_from_series(series: Sequence[Mapping[str, Any]], idle_smact_pct: float) -> JobStats:
    """``JobStats`` from a job's samples in time order (``smact_pct``, ``smocc_pct``, ``tensor_pct``,
    ``dram_bw_pct`` in %; ``job_mem_mib``: the job's memory then, MiB, None with no process on the GPU).

    Same definitions as the Epilog's summary (node/lifecycle.py): means over every sample of the span; the
    idle share (SM activity below ``idle_smact_pct`` %) over the samples with the job's process (None without
    one), ``active_samples`` their count.
    """
    def col(key: str) -> List[float]:
        return [float(s[key]) for s in series if s.get(key) is not None]

    active = [float(s["smact_pct"]) for s in series if s.get("job_mem_mib")
              and s.get("smact_pct") is not None]
    return JobStats(smact_mean=_mean(col("smact_pct")), smocc_mean=_mean(col("smocc_pct")),
                    tensor_mean=_mean(col("tensor_pct")), dram_mean=_mean(col("dram_bw_pct")),
                    smact_idle_pct=100.0 * sum(1 for x in active if x < idle_smact_pct) / len(active)
                    if active else None,
                    active_samples=sum(1 for s in series if s.get("job_mem_mib")))


def stats_of(job: Any) -> JobStats:
    """``JobStats`` from a ``JobView``'s fields (the Epilog summary's figures)."""
    return JobStats(smact_mean=job.smact_mean, smocc_mean=job.smocc_mean, tensor_mean=job.tensor_mean,
                    dram_mean=job.dram_mean, smact_idle_pct=job.smact_idle_pct,
                    active_samples=job.active_samples)


def _input_advice(cpu: CpuStats, cfg: Config) -> str:
    """The input-bound suggestion: a worker count where the job's CPUs are known and leave room for more; more
    CPUs where its processes already keep them busy."""
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


def _waiting_for_input(job: Any, cpu: Optional[CpuStats], cfg: Config, idle_pct: float) -> Optional[str]:
    """Why the CPU figures say the GPU waited for data (words), or None when they do not (module rules).

    ``idle_pct``: the share of the job's samples with the GPU idle (%); without loader workers a busy training
    process is as likely launching kernels, so that branch needs ``diag_input_bound_self_idle_pct``.
    """
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


def _over_request(job: Any, cfg: Config) -> Optional[Finding]:
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


def diagnose(job: Any, cfg: Config, series: Optional[Sequence[Mapping[str, Any]]] = None) -> Diagnosis:
    """The findings of ``job`` (a ``JobView`` with usage figures), top one first; ``series``
    (``stats_from_series``) fills what the view lacks. No GPU-metric finding when the job ran shorter than
    ``diag_min_runtime_s`` or had fewer than ``diag_min_samples`` active samples (``notes`` says so).
    """
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


def _gpu_findings(job: Any, st: JobStats, cfg: Config, notes: List[str]) -> List[Finding]:
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
