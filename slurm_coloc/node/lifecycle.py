"""What the node Prolog/Epilog (root) do for a job's sharing: MPS per shared GPU, the job's env file, the
sampler, the usage summary. Called from hooks/node.py after the job row is recorded; every step returns a
detail dict and records node events; nothing here raises for an MPS or sampler problem (the job then runs
without MPS: time-slicing).

**Env file** ``<run_dir>/jobs/<job_id>.env`` (root-owned, 0644, ``KEY=VALUE`` lines; the SPANK plugin reads
the same path): one writer (``write_env``: the Prolog, for shard and placer-guarded jobs), one reader
(``read_env``, checking owner, mode and keys: the TaskProlog and the root watchdog), removed by the Epilog.
Whole-GPU jobs get none. It carries the task's variables only; the grant is the recorded ``job_runs.shards``.

**Summary** (pure). Attribution on a shared GPU (docs/node.md): between two consecutive samples of GPU g, the
energy used (energy counter difference, else mean power x dt) and the interval are split among the processes
on g at the later sample in proportion to their NVML SM utilization; when not all report it (MPS clients never
do: NVML gives it to the MPS server, left out), to their GPU memory; a job gets its processes' shares
(processes of no job keep theirs unattributed). ``gpu_s``: the job's share of the intervals (alone and busy 10
s: 10 GPU-seconds). SM activity/occupancy are the GPU's (GPM) while the job ran; CPU figures are means over
its ``cpu_samples`` rows (node/cpu.py), weighted by each row's resolution.
"""
from __future__ import annotations

import logging
import math
import os
import re
import stat
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Tuple

from sqlite_utils import Database

from slurm_coloc.atomic import write_atomic
from slurm_coloc.config import Config
from slurm_coloc.node import mps, sampler_daemon
from slurm_coloc.node.mps_daemon import MpsDaemon, root_dir
from slurm_coloc.slurm.parse import parse_stepd_title
from slurm_coloc.store import samples as store_samples
from slurm_coloc.store import summaries as store_summaries
from slurm_coloc.store.summaries import JobSummary
from slurm_coloc.units import shards_to_mib

log = logging.getLogger("slurm_coloc.node")

_VALUE_OK = re.compile(r"^[A-Za-z0-9_./=:,+-]*$")
ENV_KEY_RE = re.compile(r"^(CUDA_MPS_[A-Z_]+|COLOC_[A-Z_]+|CUDA_VISIBLE_DEVICES)$")  # CVD: MPS remaps to 0
MAX_ENV_LINE = 4096
MAX_ENV_BYTES = 64 * 1024
MAX_ANCESTORS = 12


def env_path(cfg: Config, job_id: int) -> Path:
    """``<run_dir>/jobs/<job_id>.env``."""
    return Path(cfg.run_dir) / "jobs" / f"{int(job_id)}.env"


def mps_env(d: MpsDaemon, shards: int) -> List[Tuple[str, str]]:
    """Task variables of a shard job with ``shards`` (GiB) under MPS daemon ``d``: the daemon sees only its
    GPU, so device 0 (also overriding Slurm's index under task/none); fence ``0=<shards>G``, context in it."""
    return [("COLOC_SHARE", "mps"), ("CUDA_MPS_PIPE_DIRECTORY", str(d.pipe_dir)),
            ("CUDA_MPS_LOG_DIRECTORY", str(d.log_dir)), ("CUDA_VISIBLE_DEVICES", "0"),
            ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", f"0={int(shards)}G")]


def write_env(cfg: Config, job_id: int, pairs: List[Tuple[str, str]]) -> Path:
    """Atomically write ``(KEY, VALUE)`` pairs, in order, to the job's env file (root-owned 0644, no symlink
    followed). Raises ValueError (a value outside ``[A-Za-z0-9_./=:,+-]``), OSError (unsafe jobs dir)."""
    for k, v in pairs:
        if not _VALUE_OK.match(v) or not re.match(r"^[A-Z_]+$", k):
            raise ValueError(f"refusing env pair {k}={v!r}")
    jobs = Path(cfg.run_dir) / "jobs"
    root_dir(Path(cfg.run_dir))
    root_dir(jobs)
    final = env_path(cfg, job_id)
    write_atomic(final, "".join(f"{k}={v}\n" for k, v in pairs).encode("utf-8"), 0o644)
    return final


def env_job_ids(cfg: Config) -> FrozenSet[int]:
    """The job ids with an env file (not temporary ``.``-files); empty when the directory is unreadable."""
    try:
        names = os.listdir(Path(cfg.run_dir) / "jobs")
    except OSError:
        return frozenset()
    return frozenset(int(n[:-4]) for n in names if n.endswith(".env") and n[:-4].isdigit())


def remove_env(cfg: Config, job_id: int) -> bool:
    """Delete the job's env file; True when there was one. Raises OSError: it exists but cannot be removed."""
    try:
        env_path(cfg, job_id).unlink()
        return True
    except FileNotFoundError:
        return False


def read_env(cfg: Config, job_id: int) -> List[Tuple[str, str]]:
    """The job's env file as ``(KEY, VALUE)`` pairs in file order; ``[]`` when absent or unsafe. Trusted only
    as a regular root-owned file, not group/other-writable, opened without following symlinks or blocking; at
    most ``MAX_ENV_BYTES``, lines under ``MAX_ENV_LINE`` bytes whose key matches ``ENV_KEY_RE``."""
    try:
        fd = os.open(str(env_path(cfg, job_id)), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
            return []
        data = fh.read(MAX_ENV_BYTES)
    out = []
    for raw in data.split(b"\n"):
        if not raw or len(raw) > MAX_ENV_LINE:
            continue
        key, sep, value = raw.decode("utf-8", "replace").partition("=")
        if sep and ENV_KEY_RE.match(key) and "\n" not in value:
            out.append((key, value))
    return out


def stepd_job_id(start_pid: Optional[int] = None, proc: str = "/proc") -> Optional[int]:
    """The job id of the slurmstepd this process runs under (``start_pid`` None: from our parent), or None.

    The first root-owned ancestor (at most ``MAX_ANCESTORS`` up) must be titled ``slurmstepd: [<job>.<step>]``
    (the TaskProlog runs as the user under a user-owned fork of slurmstepd, whose root-owned parent's title no
    user process can change). In a heterogeneous job: the component's own id. Never raises.
    """
    pid = os.getppid() if start_pid is None else int(start_pid)
    for _ in range(MAX_ANCESTORS):
        if pid <= 1:
            return None
        try:
            owner = os.stat(f"{proc}/{pid}").st_uid
            with open(f"{proc}/{pid}/cmdline", "rb") as fh:
                title = fh.read(256)
            with open(f"{proc}/{pid}/stat", "rb") as fh:
                ppid = int(fh.read(4096).rpartition(b")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            return None
        if owner == 0:
            return parse_stepd_title(title)
        pid = ppid
    return None


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
    """The job's energy (J; None without any energy or power reading) and GPU-seconds (module rule);
    ``procs_at``: (GPU index, ts) -> process rows. A counter that went back (driver reload) uses the power."""
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
    ``proc_rows``: all jobs' processes there. ``smact_idle_pct``: samples below ``idle_smact_pct`` % SM
    activity among those with a process of the job on that GPU. Metrics without samples are None."""
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
    """``JobSummary``'s CPU fields from one job's ``cpu_samples`` rows (all None without rows): means weighted
    by ``res_s`` (missing: 1), rounded to 0.01; ``cpus`` the max, ``cpu_samples`` the row count."""
    if not rows:
        return {k: None for k in ("train_cpu_cores", "workers_cpu_cores", "cpu_workers", "job_cpu_cores",
                                  "cpus", "cpu_samples")}

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
    weights. Under MPS only the server has SM utilization (measured on H100, docs/benchmarks.md): a process of
    no job beside MPS clients is taken as the server and left out."""
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


def _uuid_of(index: int) -> Optional[str]:
    """The GPU UUID through NVML, or None where NVML is unavailable (fake-GPU cluster: keyed by index)."""
    try:
        from slurm_coloc.nvml import gpu_uuids
        return gpu_uuids().get(index)
    except Exception as exc:  # no NVML: key by index
        log.info("no NVML (%s): MPS directories keyed by GPU index", exc)
        return None


def share_mode(shards: Optional[int], cfg: Config) -> str:
    """``shard`` (fewer shards than a GPU has), ``whole-gpu`` (all of them) or ``none`` (None or 0 shards)."""
    if not shards:
        return "none"
    return "whole-gpu" if shards >= cfg.gpu_mem_gib else "shard"


def prolog_sharing(cfg: Config, db: Database, job_id: int, node: str, gpus: Sequence[int],
                   shards: Optional[int],
                   spank_share: Optional[str] = None, env: Optional[Dict[str, str]] = None,
                   uid: Optional[int] = None) -> Dict[str, Any]:
    """Set up a job's GPU sharing here; return what was done (the hook_runs detail). Shard job on one GPU:
    MPS daemon (unless ``mps_mode`` off or ``--coloc-share=timeslice``) and the env file; any GPU job: the
    sampler (``sampler_autostart``). ``shards``: GiB; ``uid``: ``mps_mode: per-user``. An MPS problem is a
    value of ``mps`` (the job runs time-sliced). Raises ValueError, OSError (``write_env``), sqlite3.Error.
    """
    out: Dict[str, Any] = {"share": share_mode(shards, cfg)}
    if gpus and cfg.sampler_autostart:
        out["sampler_pid"] = sampler_daemon.ensure_running(cfg, node)
    if out["share"] != "shard":
        return out
    pairs = [("COLOC_SHARE", "timeslice")]
    if cfg.mps_mode == "off" or spank_share == "timeslice":
        out["mps"] = "off"
    elif len(gpus) != 1:
        out["mps"] = "shards-on-several-gpus"
        store_samples.record_node_event(db, job_id, "mps-skipped", {"gpus": list(gpus), "why": out["mps"]})
    else:
        res = mps.acquire(cfg, job_id, gpus[0], _uuid_of(gpus[0]), env, uid,
                          shards_to_mib(shards or 0) or None)
        store_samples.record_node_event(db, job_id, res.event, {"gpu": gpus[0], **res.detail})
        out["mps"] = res.event
        if res.ok and res.daemon is not None:
            pairs = mps_env(res.daemon, int(shards or 0))
            out["mps_key"] = res.daemon.key
        else:
            log.warning("job %s: running without MPS (%s: %s)", job_id, res.event, res.detail)
    path = write_env(cfg, job_id, pairs)
    out["env_file"] = str(path)
    out["coloc_share"] = pairs[0][1]
    return out


def epilog_sharing(cfg: Config, db: Database, job_id: int, node: str, gpus: Sequence[int],
                   start_ts: Optional[float], env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Remove the env file, release MPS (stopping an unused daemon), flush the sampler, write the summary
    (no ``gpus``: neither; ``start_ts`` (Unix s) None: the last 24 h); the detail. Raises OSError,
    sqlite3.Error."""
    out: Dict[str, Any] = {"env_file_removed": remove_env(cfg, job_id)}
    for res in mps.release(cfg, job_id, env):
        store_samples.record_node_event(db, job_id, res.event, res.detail)
        out.setdefault("mps", []).append(res.event)
    if gpus:
        out["sampler_flush"] = sampler_daemon.request_flush(cfg, node, sampler_daemon.running_pid(cfg, node))
        end = time.time()
        t0 = start_ts if start_ts else end - 86400
        summary = summarize(job_id, node, list(gpus), start_ts, end,
                            store_samples.load_gpu_samples(db, t0, end, list(gpus)),
                            store_samples.load_proc_samples(db, t0, end, list(gpus)),
                            idle_smact_pct=cfg.diag_idle_smact_pct,
                            cpu_rows=store_samples.load_job_cpu_samples(db, job_id, t0, end))
        store_summaries.record_summary(db, summary)
        out["summary"] = {"peak_mem_mib": summary.peak_mem_mib, "n_samples": summary.n_samples}
    return out
