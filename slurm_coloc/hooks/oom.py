"""Recognising a GPU out-of-memory death in EpilogSlurmctld, and rerunning the job once on a whole GPU.
Detection (pure, ``decide_oom``): only a FAILED job (``hooks/context.py`` final state) can be an OOM death:
when the bounded tail of its expanded stderr (else stdout) carries one of ``OOM_PATTERNS`` (the user's text,
only matched), or when the sampler saw its memory at its fence. Recovery (``handle_job_end``): the rerun is a
NEW job on all shards of one GPU, built by root from Slurm's record of the job only (``hooks/rerun.py``). It
carries ``oom-retry-of-<id>`` in its comment and an ``oom_events`` row; it is never retried itself. Who gets a
rerun (``rerun_gate``, the evidence rule of docs/oom.md): a printed OOM line alone never earns a whole GPU
where the sampler's records speak against it. A shard job not stopped by the watchdog, within
``oom_rerun_per_user_max`` reruns per user per ``oom_rerun_window_s``, whose failed allocation fits a whole
GPU, and: whose memory the sampler saw reach its grant (peak plus the failed allocation, within
``oom_rerun_tolerance_pct``); or of which the sampler saw no memory while its message names one failed
allocation as large as its grant; or which no sampler watched while it ran."""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from sqlite_utils import Database

from slurm_coloc.comment import JobComment, retry_tag_of
from slurm_coloc.config import Config
from slurm_coloc.errors import ColocError
from slurm_coloc.hooks.context import HookContext
from slurm_coloc.hooks.rerun import rerun_refusal, submit_retry
from slurm_coloc.slurm.jobinfo import JobInfo
from slurm_coloc.store import jobs as store_jobs
from slurm_coloc.store import oom as store_oom
from slurm_coloc.units import shards_to_mib
from slurm_coloc.userfiles import append_line_as_user, read_tail_as_user

# (name, regex): the messages frameworks print when a GPU allocation fails. Sources (see
# tests/data/oom/README.md):
OOM_PATTERNS: Tuple[Tuple[str, "re.Pattern[str]"], ...] = tuple((n, re.compile(p)) for n, p in (
    # c10/cuda/CUDACachingAllocator.cpp; Python class torch.OutOfMemoryError (torch.cuda.OutOfMemoryError <=
    # 2.4)
    ("torch.OutOfMemoryError", r"\btorch\.(?:cuda\.)?OutOfMemoryError\b"),
    ("CUDA out of memory", r"\bCUDA out of memory\b"),
    # cudaGetErrorString(cudaErrorMemoryAllocation) through C10_CUDA_CHECK / TF / NCCL / CuPy
    ("CUDA error: out of memory", r"\bCUDA error: out of memory\b"),
    ("cudaErrorMemoryAllocation", r"\bcudaErrorMemoryAllocation\b"),
    ("CUDA_ERROR_OUT_OF_MEMORY", r"\bCUDA_ERROR_OUT_OF_MEMORY\b"),
    ("CUBLAS_STATUS_ALLOC_FAILED", r"\bCUBLAS_STATUS_ALLOC_FAILED\b"),
    ("CUDNN_STATUS_ALLOC_FAILED", r"\bCUDNN_STATUS_ALLOC_FAILED\b"),
    ("CUSOLVER_STATUS_ALLOC_FAILED", r"\bCUSOLVER_STATUS_ALLOC_FAILED\b"),
    ("CUFFT_ALLOC_FAILED", r"\bCUFFT_ALLOC_FAILED\b"),
    # NCCL (src/include/checks.h): "NCCL WARN Cuda failure 'out of memory'" / "Cuda failure 2 'out of memory'"
    ("NCCL Cuda failure 'out of memory'", r"\bCuda failure (?:\d+ )?'out of memory'"),
    # XLA/JAX and TensorFlow (BFC allocator): RESOURCE_EXHAUSTED only counts with a memory phrase
    ("RESOURCE_EXHAUSTED: Out of memory", r"\bRESOURCE_EXHAUSTED\b.{0,80}\b(?:[Oo]ut of memory|OOM|hbm)\b"),
    ("TF OOM when allocating tensor", r"\bOOM when allocating tensor\b"),
    ("ResourceExhaustedError", r"\bResourceExhaustedError\b.{0,40}\bOOM\b"),
))
MAX_MESSAGES = 5
# PyTorch's CUDACachingAllocator message: "Tried to allocate 2.00 GiB" (c10/cuda/CUDACachingAllocator.cpp)
_TRIED_RE = re.compile(r"Tried to allocate (\d+(?:\.\d+)?) ?(GiB|MiB|KiB|B)\b")
_UNIT_MIB = {"GiB": 1024.0, "MiB": 1.0, "KiB": 1 / 1024, "B": 1 / 2**20}


def find_oom_messages(text: str) -> List[Tuple[str, str]]:
    """Up to ``MAX_MESSAGES`` ``(pattern name, line trimmed to 300 chars)`` of ``text``, the last line first.
    ``text``: the job's output tail (user-written: only matched, never interpreted); None or empty has none.
    Never raises."""
    found: List[Tuple[str, str]] = []
    for line in reversed((text or "").splitlines()):
        for name, rx in OOM_PATTERNS:
            if rx.search(line):
                found.append((name, line.strip()[:300]))
                break
        if len(found) >= MAX_MESSAGES:
            break
    return found


def tried_to_allocate_mib(messages: Sequence[Tuple[str, str]]) -> int:
    """The largest ``Tried to allocate X`` in the lines, MiB rounded up; 0 without one. GiB, MiB, KiB and B
    are read in binary units. Pure, never raises."""
    best = 0.0
    for _, line in messages:
        for num, unit in _TRIED_RE.findall(line):
            best = max(best, float(num) * _UNIT_MIB[unit])
    return int(-(-best // 1))


_NOT_OOM_REASONS = ("NodeDown", "NodeFail", "launch_failed", "Prolog", "PartitionDown", "BurstBuffer")

MIN_TOLERANCE_MIB = 256


@dataclass(frozen=True)
class OomDecision:
    """Whether a job died of GPU out-of-memory (``decide_oom``), and the one-line reason."""

    oom: bool
    reason: str


@dataclass(frozen=True)
class RerunDecision:
    """Whether an OOM death gets its one rerun on a whole GPU, and why (the row's ``retry_reason``)."""

    rerun: bool
    reason: str


def decide_oom(state: str, reason: str, messages: Sequence[Tuple[str, str]],
               peak_mib: Optional[int] = None, fence_mib: Optional[int] = None) -> OomDecision:
    """Whether a job died of GPU out-of-memory, from all the evidence. ``state``: the final state
    (``hooks/context.py::infer_final_state``): only ``FAILED`` can be OOM; ``reason``: the job's state reason
    (``NodeDown``, ``launch_failed_requeued_held``... are never OOM); ``messages``: ``find_oom_messages`` of
    the output tail; ``peak_mib, fence_mib``: the sampler's peak of the job's GPU memory and its fence (MiB),
    if known; a peak within 2% (at least 64 MiB) of the fence counts as evidence."""
    if state != "FAILED":
        return OomDecision(False, f"state {state or 'unknown'}: never treated as OOM")
    if any(reason.startswith(r) for r in _NOT_OOM_REASONS):
        return OomDecision(False, f"reason {reason}: never treated as OOM")
    if messages:
        return OomDecision(True, f"OOM message in the job's output: {messages[0][0]}")
    if peak_mib is not None and fence_mib:
        if peak_mib >= fence_mib - max(64, fence_mib // 50):
            return OomDecision(True, f"GPU memory at its fence ({peak_mib} of {fence_mib} MiB)")
    return OomDecision(False, "failed without OOM evidence")


def rerun_gate(grant_mib: int, peak_mib: Optional[int], tried_mib: int, sampler_watched: bool,
               watchdog_stopped: bool, recent_reruns: int, per_user_max: int, window_s: float,
               tolerance_pct: float, gpu_mib: int) -> RerunDecision:
    """Whether an OOM death of a shard job earns its rerun on a whole GPU (pure; the rule of docs/oom.md).
    ``grant_mib``: the job's grant (shards * 1024 MiB); ``peak_mib``: the sampler's peak of the job's GPU
    memory (MiB), None without process samples of the job; ``tried_mib``: the failed allocation its OOM
    message names (``tried_to_allocate_mib``), 0 if none; ``sampler_watched``: a sampler recorded GPU samples
    on its nodes while it ran; ``recent_reruns``: reruns this user got in the last ``window_s`` seconds;
    ``per_user_max, window_s, tolerance_pct``: the config's ``oom_rerun_*`` keys; ``gpu_mib``: a whole GPU's
    memory (``gpu_mem_gib`` * 1024), what the rerun gets."""
    if watchdog_stopped:
        return RerunDecision(False, "stopped by the watchdog for leaving its grant: not rerun")
    evidence = _evidence(grant_mib, peak_mib, tried_mib, sampler_watched, tolerance_pct, gpu_mib)
    if evidence.rerun and recent_reruns >= per_user_max:  # the budget bounds what the evidence would grant
        return RerunDecision(False, f"{recent_reruns} OOM reruns for this user in the last {window_s:.0f} s "
                                    f"(limit {per_user_max}): not rerun")
    return evidence


def _evidence(grant_mib: int, peak_mib: Optional[int], tried_mib: int, sampler_watched: bool,
              tolerance_pct: float, gpu_mib: int) -> RerunDecision:
    """The evidence part of :func:`rerun_gate` (same arguments): whether the grant was the job's limit."""
    if tried_mib > gpu_mib:
        return RerunDecision(False, f"its failed allocation ({tried_mib} MiB) is larger than a whole GPU "
                                    f"({gpu_mib} MiB): a rerun on a whole GPU cannot hold it; not rerun")
    tol = max(MIN_TOLERANCE_MIB, int(grant_mib * tolerance_pct / 100))
    if peak_mib is not None:
        if peak_mib + tried_mib >= grant_mib - tol:
            return RerunDecision(True, f"GPU memory reached its grant ({peak_mib} + {tried_mib} MiB asked, "
                                       f"grant {grant_mib} MiB): rerun once on a whole GPU")
        return RerunDecision(False, f"the sampler saw at most {peak_mib} MiB (+{tried_mib} MiB asked) of its "
                                    f"{grant_mib} MiB grant: an OOM there is not the grant's fault; "
                                    "not rerun")
    if tried_mib >= grant_mib - tol:
        return RerunDecision(True, f"one allocation of {tried_mib} MiB failed against its {grant_mib} MiB "
                                   "grant before the sampler saw its memory: rerun once on a whole GPU")
    if sampler_watched:
        return RerunDecision(False, f"the sampler watched its GPU and saw no memory of this job, and no "
                                    f"failed allocation near its {grant_mib} MiB grant ({tried_mib} MiB "
                                    "asked): not rerun")
    return RerunDecision(True, "no sampler watched its GPU (no evidence against its grant): "
                               "rerun once on a whole GPU")


def retry_of_comment(comment: str) -> Optional[int]:
    """The job id of an ``oom-retry-of-<id>`` comment, or None (pure, never raises). The comment is user text:
    a claim, never recorded as a link."""
    return retry_tag_of(comment)


def retry_decision(share_mode: str, shards: Optional[int], gpu_mem_gib: int,
                   retry_of: Optional[int]) -> RerunDecision:
    """Whether an OOM'd job gets its one rerun: only a job that shared a GPU (fewer shards than a GPU holds).
    ``shards`` and ``gpu_mem_gib`` in GiB (1 shard = 1 GiB); ``retry_of``: the job this one reruns, or None.
    """
    if retry_of is not None:
        return RerunDecision(False, f"already the OOM rerun of job {retry_of}: not rerun again")
    if share_mode == "shard" and shards and shards < gpu_mem_gib:
        return RerunDecision(True, f"shared GPU ({shards} of {gpu_mem_gib} GiB): rerun once on a whole GPU")
    if share_mode in ("whole-gpu", "gpu") or (shards or 0) >= gpu_mem_gib:
        return RerunDecision(False, "asked for a whole GPU already: not rerun")
    return RerunDecision(False, f"no GPU share (mode {share_mode or 'none'}): not rerun")


def _read_output(job: JobInfo, uid: int, gid: int) -> Tuple[List[Tuple[str, str]], Dict[str, Any]]:
    """OOM messages from the tail of the job's stderr, then stdout if different; plus what was read."""
    seen: Dict[str, Any] = {}
    for path in (job.stderr_path, job.stdout_path):
        if not path or path == "/dev/null" or path in seen:
            continue
        tail = read_tail_as_user(path, uid, gid)
        seen[path] = (tail.error
                      or f"read {min(len(tail.text), tail.size_bytes or 0)} of {tail.size_bytes} bytes")
        messages = find_oom_messages(tail.text)
        if messages:
            return messages, seen
    return [], seen


def _tell_user(job: JobInfo, uid: int, gid: int, line: str) -> Optional[str]:
    path = job.stderr_path or job.stdout_path
    if path in ("", "/dev/null"):
        return "no output file"
    return append_line_as_user(path, uid, gid, f"slurm-coloc: {line}")


def _gate(cfg: Config, job: JobInfo, db: Database, uid: int, messages: Sequence[Tuple[str, str]],
          peak_mib: Optional[int]) -> RerunDecision:
    """``rerun_gate`` with its evidence read: watchdog events, sampler coverage, the user's recent reruns."""
    from slurm_coloc.store.summaries import sampler_watched, stopped_by_watchdog

    grant = shards_to_mib(job.shards or 0)
    return rerun_gate(
        grant, peak_mib, tried_to_allocate_mib(messages),
        sampler_watched(cfg, job.nodes, job.start_ts, job.end_ts or time.time()),
        stopped_by_watchdog(cfg, job.job_id, job.nodes),
        store_oom.reruns_since(db, uid, time.time() - cfg.oom_rerun_window_s),
        cfg.oom_rerun_per_user_max, cfg.oom_rerun_window_s, cfg.oom_rerun_tolerance_pct,
        shards_to_mib(cfg.gpu_mem_gib))


def record_rerun_ends(db: Database, jobs: Sequence[JobInfo]) -> List[int]:
    """Record how every submitted rerun without a recorded end ended; the rerun job ids recorded. From
    slurmctld's job list (``squeue --json``): a final state as Slurm gives it (a rerun cancelled while pending
    never gets an EpilogSlurmctld, so this is what records it); a rerun no longer listed (gone after
    ``MinJobAge``) as ``UNKNOWN``. Raises sqlite3.Error (the database cannot be read or written
    (``hooks/ctld.py::settle`` logs it))."""
    by_id = {j.job_id: j for j in jobs}
    done: List[int] = []
    for rerun_id in store_oom.unsettled_reruns(db):
        info = by_id.get(rerun_id)
        if info is None:
            store_oom.record_retry_outcome(db, rerun_id, "UNKNOWN", None, None)
        elif info.final:
            store_oom.record_retry_outcome(db, rerun_id, info.state, info.start_ts, info.end_ts)
        else:
            continue
        done.append(rerun_id)
    return done


@dataclass(frozen=True)
class _Death:
    """What the OOM step read of a FAILED job: its OOM messages, the output files read, the sampler's peak."""
    messages: List[Tuple[str, str]]
    read: Dict[str, Any]
    peak_mib: Optional[int]
    decision: OomDecision


def _detect(cfg: Config, job: JobInfo, state: str, uid: int, gid: int) -> _Death:
    """Step 1: read the job's output tail (as the user) and the sampler's peak memory, and decide OOM."""
    messages, read = _read_output(job, uid, gid)
    peak_mib = None
    if job.shards:  # the sampler's evidence: the job's memory at its fence
        from slurm_coloc.store.summaries import job_peak_mem_mib

        peak_mib = job_peak_mem_mib(cfg, job.job_id, job.nodes)
    decision = decide_oom(state, job.reason, messages, peak_mib=peak_mib,
                          fence_mib=shards_to_mib(job.shards) if job.shards else None)
    return _Death(messages, read, peak_mib, decision)


def _oom_record(ctx: HookContext, job: JobInfo, state: str, share_mode: str, uid: int, sha: Optional[str],
                death: _Death, recorded_retry_of: Optional[int], plan: RerunDecision) -> store_oom.OomRecord:
    """Step 2: the ``oom_events`` row of this death (evidence, grant, whether a rerun is being submitted)."""
    shards = job.shards
    evidence = {"state": state, "reason": job.reason, "exit": f"{job.exit_code}:{job.signal}",
                "messages": death.messages, "read": death.read, "decision": death.decision.reason,
                "node_list": job.nodes, "sampler_peak_mib": death.peak_mib}
    return store_oom.OomRecord(job_id=job.job_id, ts=time.time(), user_name=ctx.user_name, uid=uid,
                               script_sha256=sha, share_mode=share_mode, shards=shards,
                               fence_mib=shards_to_mib(shards) if shards else None,
                               end_ts=job.end_ts, evidence=evidence, retry_of=recorded_retry_of,
                               retry_status="submitting" if plan.rerun else "not-retried",
                               retry_reason=plan.reason)


def _submit_rerun(cfg: Config, env: Mapping[str, str], job: JobInfo, db: Database, uid: int, gid: int,
                  argv: Optional[Sequence[str]], what: str) -> Dict[str, Any]:
    """Step 3: submit the one rerun on a whole GPU, record it, and tell the user (either way)."""
    job_id = job.job_id
    try:
        new_id, exact = submit_retry(job, cfg, env, uid, gid, argv)
    except ColocError as exc:
        error = exc.one_line()
        store_oom.record_retry_failed(db, job_id, error)
        told = _tell_user(job, uid, gid, f"{what}; the automatic rerun on a whole GPU could NOT be "
                                         f"submitted: {error}. Resubmit it yourself with coloc-sbatch "
                                         "--exclusive-gpu.")
        store_jobs.record_event(db, job_id, "oom-retry-failed", {"error": error, "user_told": told or "yes"})
        return {"oom": True, "retry": False, "error": error}
    store_oom.record_retry_submitted(db, job_id, new_id)
    args_note = "" if exact else (" Slurm did not keep the script's arguments exactly, so the rerun may not "
                                  "get the same ones: submit with coloc-sbatch to keep them.")
    told = _tell_user(job, uid, gid, f"{what} with {job.shards} GiB of a shared GPU; rerunning it once on a "
                                     f"whole GPU as job {new_id} (its output is appended here).{args_note}")
    store_jobs.record_event(db, job_id, "oom-retry-submitted", {
        "retry_job_id": new_id, "gres": f"shard:{cfg.gpu_mem_gib}", "args_exact": exact,
        "user_told": told or "yes",
        "why_whole_gpu": "all shards of one GPU: 22.05 gives one job's shards from one GPU, so no shard job "
                         "fits beside it; --gres=gpu:1 would not keep shard tenants off (docs/facts.md §4)"})
    return {"oom": True, "retry": True, "retry_job_id": new_id}


def handle_job_end(ctx: HookContext, cfg: Config, env: Mapping[str, str], job: JobInfo, state: str,
                   share_mode: str, db: Database) -> Dict[str, Any]:
    """EpilogSlurmctld's OOM step: record a retry's outcome, detect an OOM death, rerun once, tell the user.
    The rerun's ``sbatch`` runs with ``env``. Returns the hook log's detail (``oom``, ``retry_job_id``, ...).
    Slurm errors are recorded, not raised; any other error reaches ``hooks/runner.py``, which logs it and
    exits 0 (never fails the node)."""
    job_id = job.job_id
    recorded_retry_of = store_oom.original_of(db, job_id)  # only root's own record links a rerun to a job
    if recorded_retry_of is not None:
        store_oom.record_retry_outcome(db, job_id, state, job.start_ts, job.end_ts)
    # a comment that claims to be a rerun only costs its own job its rerun; it is never recorded as a link
    retry_of = recorded_retry_of if recorded_retry_of is not None else retry_of_comment(job.comment)
    uid = job.uid if job.uid is not None else ctx.uid
    gid = job.gid if job.gid is not None else ctx.gid
    if state != "FAILED" or uid is None or gid is None:
        return {"oom": False, "why": decide_oom(state, job.reason, []).reason}
    death = _detect(cfg, job, state, uid, gid)
    if not death.decision.oom:
        return {"oom": False, "why": death.decision.reason, "read": death.read, "peak_mib": death.peak_mib}
    argv = JobComment.read(job.comment, job_id).argv
    sha = store_oom.script_sha256_of(db, job_id)
    plan = retry_decision(share_mode, job.shards, cfg.gpu_mem_gib, retry_of)
    refused = rerun_refusal(job) if plan.rerun else None  # a confinement the rerun cannot carry
    if refused:
        plan = RerunDecision(False, refused)
    elif plan.rerun:
        plan = _gate(cfg, job, db, uid, death.messages, death.peak_mib)
    oom = _oom_record(ctx, job, state, share_mode, uid, sha, death, recorded_retry_of, plan)
    if not store_oom.claim_retry(db, oom):
        return {"oom": True, "why": "already handled (oom_events row exists)"}
    store_jobs.record_event(db, job_id, "oom", {**(oom.evidence or {}), "retry": plan.reason,
                                                "fence_mib": oom.fence_mib})
    first = death.messages[0][0] if death.messages else death.decision.reason
    what = f"job {job_id} ran out of GPU memory ({first})"
    if not plan.rerun:
        told = _tell_user(job, uid, gid, f"{what}; {plan.reason}.")
        store_jobs.record_event(db, job_id, "oom-not-retried",
                                {"reason": plan.reason, "user_told": told or "yes"})
        return {"oom": True, "retry": False, "why": plan.reason}
    return _submit_rerun(cfg, env, job, db, uid, gid, argv, what)
