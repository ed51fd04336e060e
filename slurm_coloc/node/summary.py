"""Per-job summary from a node's samples (pure), written by the Epilog.

Attribution rule on a shared GPU (docs/node.md): between two consecutive GPU samples of GPU g, the energy used
(difference of the energy counter, else mean power x dt) and the interval itself are split among the processes
seen on g at the later sample in proportion to their NVML SM utilization; when not all report it (MPS clients
never do: NVML gives it to the MPS server, which is left out), in proportion to their GPU memory; a job gets
the sum of its processes' shares (processes of no job, e.g. the MPS server, keep theirs unattributed).
``gpu_s`` is the job's share of the intervals: a job alone and busy on a GPU for 10 s gets 10 GPU-seconds. SM
activity/occupancy are the GPU's (GPM), over the samples while the job ran. CPU figures are means over the
job's ``cpu_samples`` rows (node/cpu.py), weighted by each row's resolution.
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Dict, List, Optional, Sequence, Tuple

from slurm_coloc.store.summaries import JobSummary


def percentile(values: Sequence[float], q: float) -> Optional[float]:
    """Nearest-rank percentile (``q`` in 0..100: 95 for p95) of ``values``, in their unit; None if empty."""
    xs = sorted(values)
    if not xs:
        return None
    k = max(0, min(len(xs) - 1, math.ceil(q / 100 * len(xs)) - 1))
    return float(xs[k])


def _mean(xs: List[float]) -> Optional[float]:
    return sum(xs) / len(xs) if xs else None


def _energy_and_gpu_s(job_id: int, gpu_rows: Sequence[Dict[str, Any]],
                      procs_at: Dict[tuple, List[Dict[str, Any]]]) -> Tuple[Optional[float], float]:
    """The job's share of each GPU's energy (J; None when no interval had an energy or power reading) and of
    its time (GPU-seconds), interval by interval between consecutive samples of a GPU, by the job's share of
    the processes there (``procs_at``: (GPU index, ts) -> process rows). Energy is the counter's growth, else
    the mean power x the interval; a counter that went back (driver reload) uses the power."""
    energy = gpu_s = 0.0
    have_energy = False
    by_gpu: Dict[int, List[Dict[str, Any]]] = defaultdict(list)
    for r in gpu_rows:
        by_gpu[r["gpu_index"]].append(r)
    for g, rows in by_gpu.items():
        rows = sorted(rows, key=lambda r: r["ts"])
        for prev, cur in zip(rows, rows[1:]):
            dt = float(cur["ts"]) - float(prev["ts"])
            if dt <= 0:
                continue
            share = attribution_share(job_id, procs_at.get((g, cur["ts"]), []))
            if share <= 0:
                continue
            gpu_s += share * dt
            de = None
            if cur.get("energy_j") is not None and prev.get("energy_j") is not None:
                de = float(cur["energy_j"]) - float(prev["energy_j"])
                de = de if de >= 0 else None  # counter reset (driver reload)
            if de is None and cur.get("power_w") is not None and prev.get("power_w") is not None:
                de = (float(cur["power_w"]) + float(prev["power_w"])) / 2 * dt
            if de is not None:
                energy += share * de
                have_energy = True
    return (energy if have_energy else None), gpu_s


def summarize(job_id: int, node: str, gpus: Sequence[int], start_ts: Optional[float], end_ts: Optional[float],
              gpu_rows: Sequence[Dict[str, Any]], proc_rows: Sequence[Dict[str, Any]],
              idle_smact_pct: float = 1.0, cpu_rows: Sequence[Dict[str, Any]] = ()) -> JobSummary:
    """Summarize ``job_id`` from its GPUs' sample rows within [start_ts, end_ts] (Unix s; None: not known).

    ``proc_rows`` hold all jobs' processes on those GPUs. ``smact_idle_pct`` counts samples below
    ``idle_smact_pct`` % SM activity, over the samples with a process of the job on that GPU (start-up before
    the CUDA context and the exit left out). Metrics without samples are None.
    """
    procs_at: Dict[tuple, List[Dict[str, Any]]] = defaultdict(list)
    for p in proc_rows:
        procs_at[(p["gpu_index"], p["ts"])].append(p)
    mem_at: Dict[float, float] = defaultdict(float)
    for p in proc_rows:
        if p.get("job_id") == job_id and p.get("used_mem_mib") is not None:
            mem_at[p["ts"]] += float(p["used_mem_mib"])
    smact = [float(r["smact_pct"]) for r in gpu_rows if r.get("smact_pct") is not None]
    smocc = [float(r["smocc_pct"]) for r in gpu_rows if r.get("smocc_pct") is not None]
    tensor = [float(r["tensor_pct"]) for r in gpu_rows if r.get("tensor_pct") is not None]
    dram = [float(r["dram_bw_pct"]) for r in gpu_rows if r.get("dram_bw_pct") is not None]
    mine = {(p["gpu_index"], p["ts"]) for p in proc_rows if p.get("job_id") == job_id}
    active = [float(r["smact_pct"]) for r in gpu_rows if (r["gpu_index"], r["ts"]) in mine
              and r.get("smact_pct") is not None]
    energy, gpu_s = _energy_and_gpu_s(job_id, gpu_rows, procs_at)
    cpu = cpu_means(cpu_rows)
    return JobSummary(job_id=job_id, node=node, gpus=",".join(str(g) for g in gpus), start_ts=start_ts,
                      end_ts=end_ts, peak_mem_mib=max(mem_at.values()) if mem_at else None,
                      smact_mean=_mean(smact), smact_p95=percentile(smact, 95), smocc_mean=_mean(smocc),
                      smocc_p95=percentile(smocc, 95), energy_j=round(energy, 3) if energy is not None
                      else None,
                      gpu_s=round(gpu_s, 3) if gpu_rows else None, n_samples=len(gpu_rows),
                      tensor_mean=_mean(tensor), dram_mean=_mean(dram),
                      smact_idle_pct=(100.0 * sum(1 for x in active if x < idle_smact_pct) / len(active)
                                      if active else None),
                      active_samples=sum(1 for r in gpu_rows if (r["gpu_index"], r["ts"]) in mine), **cpu)


def cpu_means(rows: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """``JobSummary``'s CPU fields from one job's ``cpu_samples`` rows; all None without rows.

    Means weighted by ``res_s`` (missing: 1), rounded to 0.01: ``train_cpu_cores``, ``workers_cpu_cores``,
    ``cpu_workers``, ``job_cpu_cores``; ``cpus`` is the max, ``cpu_samples`` the row count.
    """
    if not rows:
        return {k: None
                for k in ("train_cpu_cores", "workers_cpu_cores", "cpu_workers", "job_cpu_cores", "cpus",
                                  "cpu_samples")}

    def wmean(key: str) -> Optional[float]:
        pairs = [(float(r[key]), float(r.get("res_s") or 1.0)) for r in rows if r.get(key) is not None]
        w = sum(p[1] for p in pairs)
        return round(sum(v * x for v, x in pairs) / w, 2) if w > 0 else None
    cpus = [int(r["cpus"]) for r in rows if r.get("cpus") is not None]
    return {"train_cpu_cores": wmean("train_cores"), "workers_cpu_cores": wmean("workers_cores"),
            "cpu_workers": wmean("workers"), "job_cpu_cores": wmean("job_cores"),
            "cpus": max(cpus) if cpus else None, "cpu_samples": len(rows)}


def attribution_share(job_id: int, procs: List[Dict[str, Any]]) -> float:
    """The job's fraction (0..1) of the GPU at one sample instant (module rule); 0 without processes or
    weights.

    Under MPS, NVML gives SM utilization only for the MPS server, not its clients (measured on H100,
    docs/benchmarks.md): a process of no job beside MPS clients is taken as the server and left out, and SM
    utilization is used only when every remaining process reports it; otherwise memory decides.
    """
    has_clients = any(p.get("mps_client") for p in procs)
    procs = [p for p in procs if not (has_clients and p.get("job_id") is None and not p.get("mps_client"))]
    if not procs:
        return 0.0
    keys = ("sm_util_pct", "used_mem_mib") if all(p.get("sm_util_pct") is not None for p in procs) \
        else ("used_mem_mib",)
    for key in keys:
        weights = [(p.get("job_id"), float(p[key])) for p in procs if p.get(key) is not None
                   and float(p[key]) > 0]
        total = sum(w for _, w in weights)
        if total > 0:
            return sum(w for j, w in weights if j == job_id) / total
    return 0.0
