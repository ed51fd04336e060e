"""The GPU node's checks of ``coloc-admin check``: NVML lists the GPUs and the MPS binaries exist, the
sampler's metrics endpoint answers, and every GPU shared under MPS is in ``EXCLUSIVE_PROCESS`` compute mode.

Each returns ``Check`` results (admin/result.py) and is skipped with ``--no-gpu`` (a controller or CI host);
``admin/checks.py``'s ``run_all`` runs them after the cluster config checks.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Optional, Union

from slurm_coloc.admin.result import Check, fail, ok
from slurm_coloc.config import Config


def _why(no_gpu: Union[bool, str]) -> str:
    """Why the GPU checks are skipped: ``--no-gpu`` (True) or the reason given (the host's role)."""
    return no_gpu if isinstance(no_gpu, str) else "--no-gpu"


def check_gpu(cfg: Config, no_gpu: Union[bool, str]) -> List[Check]:
    """NVML answers and lists GPUs; the MPS control and server binaries exist (unless mps_mode is off).

    ``no_gpu``: ``--no-gpu`` (True), or why the host has no GPUs (its role): skipped.
    """
    if no_gpu:
        return [Check("NVML", "skip", f"{_why(no_gpu)}: not a GPU node"),
                Check("MPS", "skip", f"{_why(no_gpu)}: not a GPU node")]
    from slurm_coloc.errors import ColocError
    from slurm_coloc.node import mps_daemon
    from slurm_coloc.nvml import reader

    out: List[Check] = []
    try:
        uuids = reader.gpu_uuids()
        out.append(ok("NVML", f"{len(uuids)} GPU(s): {', '.join(uuids.values())}") if uuids else fail(
            "NVML", "NVML answers but lists no GPU", "check nvidia-smi; is this a GPU node?"))
    except ColocError as exc:
        out.append(fail("NVML", f"NVML not available: {exc.message}",
                        (exc.hint or "install the NVIDIA driver")
                        + "; on a node without GPUs run with --no-gpu"))
    if cfg.mps_mode == "off":
        out.append(Check("MPS", "skip", "mps_mode: off"))
        return out
    control = mps_daemon.resolve_binary(cfg)
    if not control:
        out.append(fail("MPS", f"{cfg.mps_control_bin} not found "
                               f"(PATH and {', '.join(mps_daemon.EXTRA_BIN_DIRS)})",
                        "install the CUDA MPS binaries (nvidia-cuda-mps-control/-server), set "
                        "mps_control_bin, "
                        "or set mps_mode: off"))
    else:
        server = Path(control).with_name("nvidia-cuda-mps-server")
        out.append(ok("MPS", f"{control} and {server}") if os.access(server, os.X_OK) else fail(
            "MPS", f"{server} missing next to {control}", "install nvidia-cuda-mps-server with the driver"))
    return out


def check_metrics(cfg: Config, no_gpu: Union[bool, str], node: Optional[str] = None,
                  timeout_s: float = 3.0) -> List[Check]:
    """The sampler's Prometheus endpoint answers ``/metrics`` with slurm-coloc's families (docs/metrics.md).

    Skipped without GPUs, with ``exporter_port: 0``, or while no sampler runs on ``node`` (default: the short
    hostname; the Prolog starts one with the first GPU job).
    """
    import socket
    import urllib.error
    import urllib.request

    from slurm_coloc.node.sampler_daemon import running_pid
    name = "metrics endpoint"
    if no_gpu:
        return [Check(name, "skip", f"{_why(no_gpu)}: not a GPU node")]
    if not cfg.exporter_port:
        return [Check(name, "skip", "exporter_port: 0 (endpoint off)")]
    node = node or socket.gethostname().split(".")[0]
    pid = running_pid(cfg, node)
    if not pid:
        return [Check(name, "skip",
                      f"no sampler runs on {node} yet (the Prolog starts one with the first GPU job)")]
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(cfg.exporter_bind_address,
                                                                     cfg.exporter_bind_address)
    url = f"http://{'[' + host + ']' if ':' in host else host}:{cfg.exporter_port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            body = resp.read(8 << 20).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:  # something answers, with an error status
        body = f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        return [fail(name,
                     f"the sampler (pid {pid}) runs but {url} does not answer: {getattr(exc, 'reason', exc)}",
                     f"see {Path(cfg.log_dir) / f'sampler-{node}.log'} (port in use?); set exporter_port and "
                     "exporter_bind_address in coloc.yaml, or exporter_port: 0 to turn it off")]
    if "coloc_exporter_collect_errors" not in body:
        return [fail(name, f"{url} answers but is not slurm-coloc's sampler endpoint",
                     "another program holds exporter_port: choose a free port in coloc.yaml")]
    return [ok(name, f"{url} answers ({len(body.splitlines())} lines, {cfg.exporter_names} names)")]


def shared_gpus(cfg: Config) -> Dict[str, int]:
    """Daemon directory name -> member count of this node's MPS daemons serving at least one shard job now.

    From ``<run_dir>/mps/<key>[.uid<uid>]/members/*`` (the Prolog's, node/mps.py); empty when unreadable.
    """
    out: Dict[str, int] = {}
    base = Path(cfg.run_dir) / "mps"
    try:
        roots = sorted(p for p in base.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return out
    for root in roots:
        try:
            n = sum(1 for m in (root / "members").iterdir() if not m.name.startswith("."))
        except OSError:
            continue
        if n:
            out[root.name] = n
    return out


def evaluate_mps_protection(cfg: Config, shared: Dict[str, int],
                            mode_of: Dict[str, Optional[str]]) -> List[Check]:
    """One result per shared GPU: pass when in ``EXCLUSIVE_PROCESS`` (only the MPS server opens a context),
    else fail.

    A job can allocate outside MPS otherwise (measured on the H100: 20 GiB in compute mode DEFAULT).
    ``mode_of``: GPU key (``GPU-<uuid>`` or ``idx<N>``) -> mode name, None when NVML could not say.
    """
    name = "MPS protection"
    if not shared:
        return [ok(name, "no GPU is shared under MPS now")]
    out: List[Check] = []
    fix = ("set mps_compute_mode: exclusive-process (mps_mode multi-user) or `nvidia-smi -i <gpu> -c "
           "EXCLUSIVE_PROCESS` while the GPU is shared; the watchdog (watchdog_action: stop) stops such a "
           "job "
           "after the fact but cannot prevent its allocation")
    for key in sorted({k.split(".uid")[0] for k in shared}):
        mode = mode_of.get(key)
        members = sum(n for k, n in shared.items() if k.split(".uid")[0] == key)
        if mode == "EXCLUSIVE_PROCESS":
            out.append(ok(name, f"{key}: shared by {members} job(s), compute mode EXCLUSIVE_PROCESS"))
        else:
            out.append(fail(name, f"{key}: shared by {members} job(s) under MPS in compute mode "
                                  f"{mode or 'unknown (NVML did not answer)'}: a job can open a context "
                                  "outside "
                                  f"MPS and take its neighbours' memory", fix))
    return out


def check_mps_protection(cfg: Config, no_gpu: Union[bool, str]) -> List[Check]:
    """Shared GPUs not in ``EXCLUSIVE_PROCESS`` (read through NVML, nothing changed; never raises)."""
    if no_gpu:
        return [Check("MPS protection", "skip", f"{_why(no_gpu)}: not a GPU node")]
    shared = shared_gpus(cfg)
    mode_of: Dict[str, Optional[str]] = {}
    if shared:
        try:
            from slurm_coloc.nvml import reader
            modes = reader.NvmlComputeModes()
            for index, uuid in reader.gpu_uuids().items():
                try:
                    mode: Optional[str] = modes.get(index)
                except Exception:  # one GPU not answering: unknown
                    mode = None
                mode_of[uuid] = mode_of[f"idx{index}"] = mode
        except Exception:  # no NVML: every mode unknown
            pass
    return evaluate_mps_protection(cfg, shared, mode_of)
