"""``probe_script``: a batch script's GPU memory estimate from its own first training steps.

Find the training command (``command.py``) and the job's Python on the PATH its setup lines leave
(``discover.py``); answer from the per-user probe cache, else run the probe (``runner.py``) and bound its
replayed peak with the estimator's calibrated bound (``estimate.combine.bound_from_trace``).

Cache: ``<user cache dir>/slurm-coloc/probes.json`` (off with ``COLOC_ESTIMATE_CACHE=off``). Key: sha256 of
the program (file sha256 or module name), arguments (without the inert ones a sweep varies:
``sweep.config_args``; a hit for other such values is reused and its ``ran`` line says so, even under
``refresh``), uid, launcher environment, working directory, the resolved interpreter (path, realpath's size
and mtime), its torch's version (read without importing torch), GPU, steps, the probe's sources and the
estimator's identity. An entry also holds every imported user file's sha256 and is used only while all are
unchanged. An answer without a figure is kept ``FAILURE_TTL_S`` only, so repeated submissions do not pay
the time limit each time while a fix the key cannot see (data made, a share mounted) counts within minutes.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

from slurm_coloc.estimate.spec import Estimate
from slurm_coloc.probe.command import ProbeCommand, find_command
from slurm_coloc.probe.discover import discover_job, torch_version
from slurm_coloc.probe.runner import DEFAULT_MEM_LIMIT_MIB, DEFAULT_TIMEOUT_S, RunOutcome, run_probe
from slurm_coloc.probe.sandbox import RunAs, probe_identity
from slurm_coloc.probe.words import config_args, differs_only_in

FORMAT = 1
MAX_ENTRIES = 256
FAILURE_TTL_S = 120.0
_PROBE_DIR = os.path.dirname(os.path.abspath(__file__))


@dataclass
class ProbeResult:
    """The probe's answer for one batch script: ``estimate`` (method ``probe``) or None and ``reason``;
    ``ran``: one line on what ran and was seen; ``detail``: the child's raw result (peaks in bytes);
    ``log_text``: the program's last 20,000 characters of output with ``keep_log`` ("" when cached)."""

    estimate: Optional[Estimate]
    ran: str
    reason: str = ""
    command: Optional[ProbeCommand] = None
    wall_s: float = 0.0
    cached: bool = False
    detail: Dict[str, Any] = field(default_factory=dict)
    log_text: str = ""


def precision_of(result: Dict[str, Any]) -> str:
    """``amp-fp16``/``bf16`` from the autocast dtype the program used; else ``bf16`` when more than half the
    parameter elements (``param_dtypes``) are 16-bit; else ``fp32``."""
    ac = result.get("autocast") or []
    if "float16" in ac:
        return "amp-fp16"
    if "bfloat16" in ac:
        return "bf16"
    dtypes = result.get("param_dtypes") or {}
    low = sum(int(v) for k, v in dtypes.items() if k in ("bfloat16", "float16"))
    return "bf16" if dtypes and low * 2 > sum(int(v) for v in dtypes.values()) else "fp32"


def estimate_from_result(result: Dict[str, Any], gpu_name: str = "H100") -> Estimate:
    """The calibrated figure (MiB, method ``probe``) for a probe's replayed peaks (bytes):
    ``combine.bound_from_trace``, plus the GPU's ``nccl_mib`` when ``nccl_group`` is true (the communicator's
    memory outside the allocator); ``flops_per_step`` outside the job comment's ``BOUNDS`` is dropped.

    Raises:
        EstimateError: unknown GPU.
        KeyError: ``result`` lacks ``peak_allocated_b`` or ``peak_reserved_b``.
    """
    from slurm_coloc.comment.values import BOUNDS
    from slurm_coloc.estimate.combine import bound_from_trace
    from slurm_coloc.estimate.spec import gpu_model
    from slurm_coloc.estimate.trace import ReplayedPeaks

    precision = precision_of(result)
    flops = result.get("flops_per_step")
    peaks = ReplayedPeaks(peak_allocated_b=int(result["peak_allocated_b"]),
                          peak_reserved_b=int(result["peak_reserved_b"]),
                          depthwise_max_hw=int(result.get("depthwise_max_hw", 0)),
                          assumed_values=dict(result.get("assumed_values") or {}),
                          conv_workspace_max_b=int(result.get("conv_workspace_max_b", 0)),
                          flops_per_step=flops if isinstance(flops, int) and not isinstance(flops, bool)
                          and 0 <= flops <= BOUNDS["flops_per_step"][1] else None)  # the job comment's range
    est = bound_from_trace(peaks, gpu_name, precision)
    detail = dict(est.detail, precision=precision, chosen="probe")
    detail.pop("params_mib", None)  # the probe does not see parameter bytes apart
    mem_mib = est.mem_mib
    if result.get("nccl_group") is True:
        detail["nccl_mib"] = gpu_model(gpu_name).nccl_mib
        mem_mib += detail["nccl_mib"]
    return dataclasses.replace(est, mem_mib=mem_mib, method="probe", detail=detail)


def ran_line(cmd: ProbeCommand, result: Optional[Dict[str, Any]], interpreter: str) -> str:
    """One line: what the probe ran (``interpreter`` "" = ``python3``) and saw (``result`` None: none)."""
    prog = os.path.basename(cmd.target) if cmd.mode == "file" else f"-m {cmd.target}"
    line = f"probe ran `{prog}{' ' if cmd.args else ''}{' '.join(cmd.args)}` with {interpreter or 'python3'}"
    if not result:
        return line
    opts = ", ".join(result.get("optimizers") or []) or "no optimizer"
    ac = ",".join(result.get("autocast") or []) or "no autocast"
    return (f"{line}: {result.get('forwards', 0)} forward(s), {result.get('steps', 0)} step(s) of {opts}, "
            f"{ac}, torch {result.get('torch', '?')}")


def _sha(path: str) -> Optional[str]:
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except OSError:
        return None


def _cache_file() -> str:
    from slurm_coloc.estimate import cache

    return os.path.join(os.path.dirname(cache.cache_path()), "probes.json")


def _key(cmd: ProbeCommand, gpu: str, steps: int, torch: Optional[str] = None, uid: int = -1) -> str:
    from slurm_coloc.estimate import cache

    interp = cmd.interpreter or "python3"
    real = os.path.realpath(interp) if os.sep in interp else interp
    try:
        st = os.stat(real)
        interp_id = [interp, real, st.st_size, int(st.st_mtime)]
    except OSError:
        interp_id = [interp, real]
    probe_src = hashlib.sha256()
    for root, _, files in sorted(os.walk(_PROBE_DIR)):
        for f in sorted(files):
            if f.endswith(".py"):
                probe_src.update(f.encode() + (_sha(os.path.join(root, f)) or "-").encode())
    blob = {"format": FORMAT, "mode": cmd.mode, "target": cmd.target,
            "target_sha256": _sha(cmd.target) if cmd.mode == "file" else None,
            "args": config_args(cmd.args)[0],
            "env": list(cmd.env), "workdir": cmd.workdir, "interpreter": interp_id, "gpu": gpu,
            "steps": steps, "probe": probe_src.hexdigest(), "estimator": cache.estimator_identity(),
            "torch": torch, "uid": uid}
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()


def _read_cache() -> Dict[str, Any]:
    try:
        with open(_cache_file(), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    ok = isinstance(data, dict) and data.get("format") == FORMAT and isinstance(data.get("entries"), dict)
    return data["entries"] if ok else {}


def _lookup(key: str) -> Optional[Dict[str, Any]]:
    entry = _read_cache().get(key)
    if not isinstance(entry, dict):
        return None
    if not entry.get("estimate") and time.time() - float(entry.get("stored_at", 0)) > FAILURE_TTL_S:
        return None
    for path, digest in (entry.get("user_files") or {}).items():
        if _sha(path) != digest:
            return None
    if entry.get("estimate"):
        try:
            Estimate.from_json(entry["estimate"])
        except ValueError:  # a damaged entry is a miss
            return None
    return entry


def _store(key: str, entry: Dict[str, Any]) -> None:
    path = _cache_file()
    try:
        entries = _read_cache()
        entries[key] = dict(entry, stored_at=time.time())
        if len(entries) > MAX_ENTRIES:
            keep = sorted(entries, key=lambda k: float(entries[k].get("stored_at", 0)))[-MAX_ENTRIES:]
            entries = {k: entries[k] for k in keep}
        d = os.path.dirname(path)
        os.makedirs(d, mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".probes-", suffix=".tmp", dir=d)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"format": FORMAT, "entries": entries}, fh, sort_keys=True)
        os.replace(tmp, path)
    except (OSError, TypeError, ValueError):
        return


def probe_script(script_path: str, script_args: Sequence[str] = (), submit_dir: Optional[str] = None,
                 gpu: str = "H100", timeout_s: float = DEFAULT_TIMEOUT_S,
                 mem_limit_mib: int = DEFAULT_MEM_LIMIT_MIB, steps: int = 2,
                 use_cache: bool = True, python: Optional[str] = None, keep_log: bool = False,
                 refresh: bool = False, text: Optional[str] = None,
                 environ: Optional[Mapping[str, str]] = None, uid_option: Optional[str] = None,
                 gid_option: Optional[str] = None) -> ProbeResult:
    """Estimate the GPU memory of the training program a batch script runs, by probing it.

    Args:
        timeout_s: the probe's time limit (s); mem_limit_mib: its address-space limit (MiB).
        use_cache: read and write the per-user probe cache (also off with ``COLOC_ESTIMATE_CACHE=off``).
        python: the job's interpreter (a path or a name on PATH), instead of the one its command implies.
        keep_log: return the program's output in ``log_text`` (for ``--explain``).
        refresh: probe afresh (a sweep sibling's entry is still reused) and store the answer (``--explain``).
        text: the script's text (``--wrap``'s command); ``script_path`` is then not read.
        environ: the submitting environment (default ``os.environ``): the preamble's and the probe's.
        uid_option, gid_option: sbatch's ``--uid``/``--gid`` (root submitting for a user): the probe's
            children run as that user (``sandbox.py``); root without them probes only its own files.

    Raises:
        EstimateError: ``gpu`` is not a known GPU model.
        OSError: the script cannot be read.
    """
    from slurm_coloc.estimate import cache
    from slurm_coloc.estimate.spec import gpu_model

    t0 = time.monotonic()
    gpu = gpu_model(gpu).name
    text_given = text is not None
    if text is None:
        with open(script_path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    submit_dir = os.path.abspath(submit_dir or os.getcwd())
    found = find_command(text, script_args, submit_dir, environ)
    if found.command is None:
        return ProbeResult(None, "probe ran nothing", found.reason, wall_s=time.monotonic() - t0)
    prog = found.command.target if found.command.mode == "file" else None
    run_as, refused = probe_identity(uid_option, gid_option, [None if text_given else script_path, prog])
    if refused:
        return ProbeResult(None, "probe ran nothing", refused, found.command, time.monotonic() - t0)
    environ = run_as.environ(os.environ if environ is None else environ) if run_as is not None else environ
    job = discover_job(text, found.command, script_args, submit_dir, environ, python, run_as)
    job_env, notes = job.env, list(found.notes) + job.notes
    if job.python is None:
        return ProbeResult(None, "probe ran nothing", job.reason, found.command, time.monotonic() - t0,
                           detail={"notes": notes})
    cmd = dataclasses.replace(found.command, interpreter=job.python)
    limits = {"timeout_s": timeout_s, "mem_limit_mib": mem_limit_mib, "steps": steps}
    return _probe_job(cmd, job_env, notes, run_as, gpu, limits, use_cache and cache.enabled(), refresh,
                      keep_log, t0)


def _probe_job(cmd: ProbeCommand, job_env: Dict[str, str], notes: List[str], run_as: Optional[RunAs],
               gpu: str, limits: Dict[str, float], use_cache: bool, refresh: bool, keep_log: bool,
               t0: float) -> ProbeResult:
    """``probe_script``'s answer for the found command ``cmd`` (its Python resolved) in ``job_env``: from the
    cache (a sweep sibling's too; not for ``refresh`` of the same arguments), else a probe run as ``run_as``
    under ``limits`` (``timeout_s``, ``mem_limit_mib``, ``steps``), stored for later submissions."""
    steps = int(limits["steps"])
    torch_v = key = None
    if use_cache:
        torch_v = torch_version(cmd.interpreter or "python3", job_env, os.path.dirname(_cache_file()), run_as)
        key = _key(cmd, gpu, steps, torch_v, os.geteuid() if run_as is None else run_as.uid)
        entry = _lookup(key)
        if entry is not None and not (refresh and list(entry.get("args") or []) == list(cmd.args)):
            return _from_cache(entry, cmd, time.monotonic() - t0)  # --explain of the same arguments: afresh
    out = run_probe(cmd, timeout_s=float(limits["timeout_s"]), mem_limit_mib=int(limits["mem_limit_mib"]),
                    steps=steps, environ=job_env, run_as=run_as)
    res = _from_run(out, cmd, gpu, notes, torch_v, keep_log, t0)
    if key and (res.estimate is not None or out.reason):
        _store_run(key, res, out)
    return res


def _from_cache(entry: Dict[str, Any], cmd: ProbeCommand, wall_s: float) -> ProbeResult:
    """The cached answer ``entry`` (``_store_run``'s) for ``cmd``, found in ``wall_s`` seconds."""
    est = entry.get("estimate")
    ran = str(entry["ran"])
    change = differs_only_in(list(entry.get("args") or []), cmd.args)
    if change:
        ran += (f"; reused for this submission, which differs only in arguments that change no shape, dtype, "
                f"model or batch ({change})")
    return ProbeResult(Estimate.from_json(est) if est else None, ran, entry.get("reason", ""),
                       cmd, wall_s, True, entry.get("detail", {}))


def _from_run(out: RunOutcome, cmd: ProbeCommand, gpu: str, notes: List[str], torch_v: Optional[str],
              keep_log: bool, t0: float) -> ProbeResult:
    """The answer of probe run ``out`` of ``cmd`` for GPU model ``gpu``, the discovery ``notes`` before the
    run's own; ``t0``: the call's ``time.monotonic()``."""
    result = out.result or {}
    estimate = estimate_from_result(result, gpu) if not out.reason and result else None
    ran = ran_line(cmd, out.result, out.interpreter)
    res = ProbeResult(estimate, ran, out.reason, cmd, time.monotonic() - t0, False, result,
                      out.log_text if keep_log else "")
    res.detail = dict(result, scratch_files=out.scratch_files, probe_wall_s=round(out.wall_s, 2),
                      notes=notes + list(result.get("notes") or []), job_torch=torch_v)
    return res


def _store_run(key: str, res: ProbeResult, out: RunOutcome) -> None:
    """Store ``res`` under cache ``key`` with a digest of each user file the program imported."""
    files = {p: _sha(p) for p in (out.result or {}).get("user_files") or []}
    _store(key, {"estimate": res.estimate.to_json() if res.estimate else None, "ran": res.ran,
                 "args": list(res.command.args) if res.command is not None else [],
                 "reason": out.reason, "detail": res.detail, "timed_out": out.timed_out,
                 "user_files": {p: d for p, d in files.items() if d}})
