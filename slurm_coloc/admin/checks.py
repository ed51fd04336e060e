"""The checks of ``coloc-admin check``: each returns ``Check`` results with the problem and its fix.

A check never raises for a broken setup: it reports ``fail`` with one line saying what is wrong and one saying
how to fix it. ``skip`` is for checks that do not apply (``--no-gpu`` on a controller or CI host, no
plugstack.conf configured); skips do not fail the run.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from slurm_coloc.admin import versioncheck
from slurm_coloc.admin.munge import check_munge
from slurm_coloc.admin.result import Check, fail, ok
from slurm_coloc.admin.slurmconf import (
    SlurmConf,
    expand_hostlist,
    parse_gres_conf,
    parse_gres_counts,
    parse_plugstack,
    parse_slurm_conf,
)
from slurm_coloc.config import Config
from slurm_coloc.errors import ColocError
from slurm_coloc.slurm.run import slurm_env
from slurm_coloc.slurm.version import slurm_version

HOOK_KEYS = ("Prolog", "Epilog", "PrologSlurmctld", "EpilogSlurmctld", "TaskProlog")
SLURM_BINARIES = ("sbatch", "scontrol", "squeue")


def _read(path: Path, name: str) -> "tuple[Optional[str], Optional[Check]]":
    try:
        return path.read_text(encoding="utf-8", errors="replace"), None
    except OSError as exc:
        return None, fail(name, f"cannot read {path}: {exc.strerror or exc}",
                          f"create {path} or pass its path")


def unsafe_path(path: Path) -> Optional[str]:
    """Why ``path`` (or a directory above it) could be replaced by a non-root user, or None when it is safe.

    Safe: owned by root and not writable by group or others; a directory writable by all is accepted only
    with the sticky bit and root ownership (``/tmp``), where others cannot replace root's entries.

    Args:
        path: the file or directory (symbolic links resolved first).

    Returns:
        The reason in words (for a path that cannot be read: its error), or None. Never raises ``OSError``.
    """
    p = path.resolve()
    for q in [p, *p.parents]:
        try:
            st = q.stat()
        except OSError as exc:
            return f"{q}: {exc.strerror or exc}"
        if st.st_uid != 0:
            return f"{q} is owned by uid {st.st_uid}, not root"
        mode = stat.S_IMODE(st.st_mode)
        if mode & (stat.S_IWGRP | stat.S_IWOTH):
            if stat.S_ISDIR(st.st_mode) and mode & stat.S_ISVTX and q != p:
                continue
            return f"{q} is writable by {'others' if mode & stat.S_IWOTH else 'its group'} (mode {mode:o})"
    return None


def check_slurm_conf(conf_path: Path, cfg: Config) -> "tuple[List[Check], Optional[SlurmConf]]":
    """slurm.conf: GresTypes, cons_tres, the hooks configured, each node's gpu and shard counts agree.

    Args:
        conf_path: the slurm.conf to read.
        cfg: ``gpu_mem_gib`` (shards per GPU).

    Returns:
        ``(checks, parsed conf)``; the conf is None when the file cannot be read.
    """
    name = "slurm.conf"
    text, err = _read(conf_path, name)
    if err:
        return [err], None
    conf = parse_slurm_conf(text or "")
    out: List[Check] = []
    types = {t.strip() for t in conf.get("GresTypes").split(",") if t.strip()}
    missing = {"gpu", "shard"} - types
    out.append(ok(name, f"GresTypes={conf.get('GresTypes')}") if not missing else fail(
        name, f"GresTypes lacks {', '.join(sorted(missing))} (is {conf.get('GresTypes') or 'unset'!r})",
        "set GresTypes=gpu,shard in slurm.conf and restart slurmctld and every slurmd"))
    select = conf.get("SelectType")
    out.append(ok(name, f"SelectType={select}") if select == "select/cons_tres" else fail(
        name, f"SelectType is {select or 'unset'!r}; shards need select/cons_tres",
        "set SelectType=select/cons_tres (with SelectTypeParameters=CR_Core or CR_Core_Memory)"))
    for key in HOOK_KEYS[:4]:
        if not conf.get(key):
            out.append(fail(name, f"{key} is not set: slurm-coloc's hooks would not run",
                            f"set {key}=/etc/slurm/coloc/{key.lower()}.sh (docs/admin.md)"))
    for node in conf.nodes:
        counts = parse_gres_counts(node.get("gres", ""))
        names = ",".join(expand_hostlist(node.get("nodename", "?")))
        if node.get("nodename", "").lower() == "default":
            continue
        gpus, shards = counts.get("gpu", 0), counts.get("shard", 0)
        if gpus and shards != gpus * cfg.gpu_mem_gib:
            out.append(fail(name,
                            f"node {names}: Gres shard:{shards} but gpu:{gpus} x gpu_mem_gib "
                            f"{cfg.gpu_mem_gib}"
                                  f" = {gpus * cfg.gpu_mem_gib}",
                            f"set Gres=gpu:{gpus},shard:{gpus * cfg.gpu_mem_gib} on NodeName={names}"
                            " (1 shard = 1 GiB)"))
        elif gpus:
            out.append(ok(name, f"node {names}: gpu:{gpus}, shard:{shards}"))
    for inc in conf.includes:
        out.append(Check(name, "skip", f"Include {inc} not followed: check it by hand"))
    return out, conf


def check_gres_conf(gres_path: Path, conf: SlurmConf, cfg: Config) -> List[Check]:
    """gres.conf: every GPU file has one shard line with Count = gpu_mem_gib, and the device files exist.

    GPU files come from ``Name=gpu File=`` lines, or, on a node with ``AutoDetect=nvml`` (or ``nvidia``,
    24.11+) from a global line or the node's own (gres.conf(5)), from slurmd's NVML autodetection: then the
    shard lines' ``File=`` name the GPUs (one per GPU, as docs/admin.md's production gres.conf).

    Args:
        gres_path: the gres.conf to read.
        conf: the parsed slurm.conf (``check_slurm_conf``): its nodes with ``Gres=gpu`` are checked.
        cfg: ``gpu_mem_gib`` (shards per GPU).

    Returns:
        One ``Check`` per GPU node (ok, or each failure with its fix); a single failure when the file cannot
        be read.
    """
    name = "gres.conf"
    text, err = _read(gres_path, name)
    if err:
        return [err]
    out: List[Check] = []
    gpu_files, shard_files, autodetect = _gres_lines(text or "")
    gpu_nodes = {n for node in conf.nodes for n in expand_hostlist(node.get("nodename", ""))
                 if parse_gres_counts(node.get("gres", "")).get("gpu")}
    for n in sorted(gpu_nodes | set(gpu_files)):
        files = gpu_files.get(n, []) + gpu_files.get("(all)", [])
        shards = {**shard_files.get("(all)", {}), **shard_files.get(n, {})}
        detect = autodetect.get(n, autodetect.get("(all)", "off"))
        auto = not files and detect in ("nvml", "nvidia")
        if auto:
            files = sorted(f for f in shards if f != "(no File=)")
            if not files:
                out.append(fail(name, f"node {n}: AutoDetect={detect} finds the GPUs, but no Name=shard line "
                                      "names a GPU with File=",
                                f"add one 'NodeName={n} Name=shard Count={cfg.gpu_mem_gib} "
                                "File=/dev/nvidiaK' "
                                "line per GPU"))
                continue
        bad = _check_gpu_files(name, n, files, shards, cfg, out)
        if not files:
            out.append(fail(name, f"node {n}: no Name=gpu line with File=",
                            f"add 'NodeName={n} Name=gpu File=/dev/nvidia[0-N]'"))
        elif not bad:
            how = f" (GPUs from AutoDetect={detect})" if auto else ""
            out.append(ok(name, f"node {n}: {len(files)} GPUs x {cfg.gpu_mem_gib} shards{how}"))
    return out


def _gres_lines(text: str) -> Tuple[Dict[str, List[str]], Dict[str, Dict[str, int]], Dict[str, str]]:
    """gres.conf by node (``(all)``: a line without ``NodeName=``): the GPU device files, the shard count per
    device file (``(no File=)`` for a shard line without one), and the ``AutoDetect=`` value (lower case)."""
    gpu_files: Dict[str, List[str]] = {}
    shard_files: Dict[str, Dict[str, int]] = {}
    autodetect: Dict[str, str] = {}
    for line in parse_gres_conf(text):
        kind = line.get("name")
        nodes = expand_hostlist(line.get("nodename", "")) or ["(all)"]
        if line.get("autodetect"):
            for n in nodes:
                autodetect[n] = line["autodetect"].lower()
        files = expand_hostlist(line.get("file", "")) if line.get("file") else []
        for n in nodes:
            if kind == "gpu":
                gpu_files.setdefault(n, []).extend(files)
            elif kind == "shard":
                count = int(line.get("count", "0") or 0)
                for f in files or ["(no File=)"]:
                    shard_files.setdefault(n, {})[f] = count // max(1, len(files)) if files else count
    return gpu_files, shard_files, autodetect


def _check_gpu_files(name: str, node: str, files: List[str], shards: Dict[str, int], cfg: Config,
                     out: List[Check]) -> bool:
    """Append a failure to ``out`` for each GPU device file of ``node`` that does not exist or has no shard
    line with ``Count = cfg.gpu_mem_gib``; returns whether any failed."""
    bad = False
    for f in files:
        if not os.path.exists(f):
            out.append(fail(name, f"node {node}: GPU device file {f} does not exist",
                            f"fix File= on the Name=gpu line for {node} (ls /dev/nvidia*)"))
            bad = True
        shard_count = shards.get(f)
        if shard_count is None:
            out.append(fail(name, f"node {node}: no Name=shard line for {f}",
                            f"add 'NodeName={node} Name=shard Count={cfg.gpu_mem_gib} File={f}'"))
            bad = True
        elif shard_count != cfg.gpu_mem_gib:
            out.append(fail(name,
                            f"node {node}: {f} has {shard_count} shards, gpu_mem_gib is {cfg.gpu_mem_gib}",
                            f"set Count={cfg.gpu_mem_gib} on the Name=shard line of {f} (1 shard = 1 GiB)"))
            bad = True
    return bad


def check_plugstack(conf: SlurmConf, conf_dir: Path) -> List[Check]:
    """plugstack.conf (if configured or present): each plugin exists and is root-owned, not writable by
    others.

    Args:
        conf: the parsed slurm.conf (``PlugStackConfig``); conf_dir: slurm.conf's directory.

    Returns:
        One ``Check`` per plugin line (``include`` lines skipped: not followed), or one skip/fail/pass.
    """
    name = "plugstack.conf"
    path = Path(conf.get("PlugStackConfig") or conf_dir / "plugstack.conf")
    if not conf.get("PlugStackConfig") and not path.exists():
        return [Check(name, "skip",
                      "no PlugStackConfig and no plugstack.conf: the --coloc-* options are off")]
    text, err = _read(path, name)
    if err:
        return [err]
    out: List[Check] = []
    for kind, plugin, _args in parse_plugstack(text or ""):
        if kind == "include":
            out.append(Check(name, "skip", f"include {plugin} not followed: check it by hand"))
            continue
        if kind not in ("required", "optional"):
            out.append(fail(name, f"line for {plugin}: first word must be required or optional",
                            "write 'required /usr/lib/slurm/coloc_spank.so' (spank(8))"))
            continue
        if not Path(plugin).is_file():
            out.append(fail(name, f"plugin {plugin} does not exist" + (" (required: every job would fail)"
                                                                        if kind == "required" else ""),
                            "install it (make -C spank install) or fix the path"))
            continue
        why = unsafe_path(Path(plugin))
        out.append(fail(name, f"plugin {plugin} is not safe: {why}",
                        f"chown root:root {plugin}; chmod 0755 {plugin}")
                   if why else ok(name, f"{kind} {plugin}"))
    return out or [ok(name, f"{path}: no plugin lines")]


def check_hooks(conf: SlurmConf) -> List[Check]:
    """Each configured hook exists, is executable, and neither it nor a directory above it is writable by
    non-root.

    Args:
        conf: the parsed slurm.conf (``Prolog``, ``Epilog``, ``PrologSlurmctld``, ... of ``HOOK_KEYS``).

    Returns:
        One ``Check`` per hook path (a glob skipped: check it by hand); empty when no hook is configured.
    """
    name = "hooks"
    out: List[Check] = []
    for key in HOOK_KEYS:
        value = conf.get(key)
        if not value:
            continue
        paths = [Path(p) for p in expand_hostlist(value)] if "[" in value else [Path(value)]
        for p in paths:
            if "*" in str(p):
                out.append(Check(name, "skip", f"{key}={p}: a glob, check its files by hand"))
            elif not p.is_file():
                out.append(fail(name, f"{key}={p} does not exist", f"install the hook at {p} or fix {key}="))
            elif not os.access(p, os.X_OK):
                out.append(fail(name, f"{key}={p} is not executable", f"chmod 0755 {p}"))
            else:
                why = unsafe_path(p)
                out.append(fail(name, f"{key}={p} runs as root but {why}",
                                f"chown root:root {p} and its directories; chmod go-w them")
                           if why else ok(name, f"{key}={p}"))
    return out


def check_dirs(cfg: Config) -> List[Check]:
    """state_dir (databases), its nodes/ and run_dir: root-owned, not writable by group/others; DB files
    too.

    Args:
        cfg: the configuration (``state_dir``, ``run_dir``, ``admin_group`` for the databases' fix).

    Returns:
        One ``Check`` per directory (a missing one passes: the first hook creates it), one ``fail`` per unsafe
        database.
    """
    name = "directories"
    out: List[Check] = []
    for label, path in (("state_dir", Path(cfg.state_dir)), ("node databases", cfg.node_db_dir),
                        ("run_dir", Path(cfg.run_dir))):
        if not path.exists():
            out.append(ok(name,
                          f"{label} {path} not created yet (the first hook creates it root-owned 0755)"))
            continue
        why = unsafe_path(path)
        out.append(fail(name, f"{label} {path}: {why}", f"chown root:root {path}; chmod 0755 {path}")
                   if why else ok(name, f"{label} {path}: root-only writable"))
    for db in [cfg.ctld_db_path, *sorted(cfg.node_db_dir.glob("*.db"))] if cfg.node_db_dir.is_dir() else []:
        if db.exists():
            why = unsafe_path(db)
            if why:
                group, mode = (cfg.admin_group, "0640") if cfg.admin_group else ("root", "0600")
                out.append(fail(name, f"database {db}: {why}", f"chown root:{group} {db}; chmod {mode} {db}"))
    return out


def check_slurm_binaries(cfg: Config) -> List[Check]:
    """sbatch/scontrol/squeue in ``slurm_bin_dir`` (hooks get no PATH).

    Args:
        cfg: the configuration (``slurm_bin_dir``).

    Returns:
        One ``Check``: ``pass``, or ``fail`` naming the binaries missing or not executable.
    """
    missing = [b for b in SLURM_BINARIES if not os.access(Path(cfg.slurm_bin_dir) / b, os.X_OK)]
    if missing:
        return [fail("slurm binaries", f"{', '.join(missing)} not found in slurm_bin_dir {cfg.slurm_bin_dir}",
                     "install slurm-client or set slurm_bin_dir in coloc.yaml")]
    return [ok("slurm binaries", f"{', '.join(SLURM_BINARIES)} in {cfg.slurm_bin_dir}")]


def check_gpu(cfg: Config, no_gpu: bool) -> List[Check]:
    """NVML answers and lists GPUs; the MPS control and server binaries exist (unless mps_mode is off).
    ``no_gpu`` (a node without GPUs, e.g. the controller): skipped.

    Args:
        cfg: the configuration (``mps_mode``; where the MPS binaries are, ``node/mps_daemon.py``).
        no_gpu: ``--no-gpu``: skip the checks.

    Returns:
        The NVML check and the MPS binaries' checks (``skip`` with ``no_gpu``). NVML errors become ``fail``.
    """
    if no_gpu:
        return [Check("NVML", "skip", "--no-gpu: not a GPU node"),
                Check("MPS", "skip", "--no-gpu: not a GPU node")]
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


def check_metrics(cfg: Config, no_gpu: bool, node: Optional[str] = None,
                  timeout_s: float = 3.0) -> List[Check]:
    """The sampler's Prometheus endpoint answers ``/metrics`` with slurm-coloc's families (docs/metrics.md).

    Skipped on a node without GPUs, with ``exporter_port: 0``, or while no sampler runs on ``node`` (default:
    the short hostname; the Prolog starts one with the first GPU job).

    Args:
        cfg: the configuration (``exporter_port``, ``exporter_names``, the sampler's pid file).
        no_gpu: ``--no-gpu``: skip the check; node: the node's name (default: the short hostname).
        timeout_s: the HTTP request's bound (s).

    Returns:
        One ``Check``: ``skip``, ``fail`` (no answer, or not our families) with its fix, or ``pass``.
    """
    import socket
    import urllib.error
    import urllib.request

    from slurm_coloc.node.sampler_daemon import running_pid
    name = "metrics endpoint"
    if no_gpu:
        return [Check(name, "skip", "--no-gpu: not a GPU node")]
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


def run_all(cfg: Config, slurm_conf: Path, no_gpu: bool) -> List[Check]:
    """Every check, in order: slurm.conf, gres.conf, plugstack.conf, hooks (those four when slurm.conf reads),
    munge, directories, binaries, GPU, metrics, MPS protection, Slurm version.

    Args:
        cfg: the slurm-coloc config checked with the cluster.
        slurm_conf: slurm.conf; gres.conf and plugstack.conf are looked for beside it.
        no_gpu: this node has no GPU (the controller): the GPU, MPS and metrics checks are skipped.

    Returns:
        Every ``Check`` (ok, skip or fail with its fix), in that order.
    """
    results, conf = check_slurm_conf(slurm_conf, cfg)
    if conf is not None:
        results += check_gres_conf(slurm_conf.parent / "gres.conf", conf, cfg)
        results += check_plugstack(conf, slurm_conf.parent)
        results += check_hooks(conf)
    results += check_munge(conf)
    results += check_dirs(cfg)
    results += check_slurm_binaries(cfg)
    results += check_gpu(cfg, no_gpu)
    results += check_metrics(cfg, no_gpu)
    results += check_mps_protection(cfg, no_gpu)
    results += check_slurm_version(cfg, conf, slurm_conf)
    return results


def shared_gpus(cfg: Config) -> Dict[str, int]:
    """``{daemon directory name: members}`` of this node's MPS daemons that serve at least one shard job now
    (``<run_dir>/mps/<key>[.uid<uid>]/members/*``, written by the Prolog; node/mps.py).

    Args:
        cfg: the configuration (``run_dir``).

    Returns:
        daemon directory name -> member count (empty when ``<run_dir>/mps`` cannot be read).
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
    """One result per shared GPU: pass when its compute mode is ``EXCLUSIVE_PROCESS`` (only the MPS server
    opens a context), else fail (a job can allocate outside MPS; measured on the H100: 20 GiB in compute mode
    DEFAULT).

    Args:
        shared: ``shared_gpus`` output (keys ``GPU-<uuid>``, ``idx<N>``, optionally ``.uid<uid>``).
        mode_of: GPU key (``GPU-<uuid>`` or ``idx<N>``) -> compute mode name, None when NVML could not say.
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


def check_mps_protection(cfg: Config, no_gpu: bool) -> List[Check]:
    """Shared GPUs not in ``EXCLUSIVE_PROCESS`` compute mode (read through NVML; nothing is changed).

    Args:
        cfg: the configuration (``run_dir``: the MPS daemons' members).
        no_gpu: ``--no-gpu``: skip the check.

    Returns:
        The checks (``evaluate_mps_protection``); a GPU NVML cannot answer for has an unknown mode. Never
        raises for NVML.
    """
    if no_gpu:
        return [Check("MPS protection", "skip", "--no-gpu: not a GPU node")]
    shared = shared_gpus(cfg)
    mode_of: Dict[str, Optional[str]] = {}
    if shared:
        try:
            from slurm_coloc.nvml import control, reader
            modes = control.NvmlComputeModes()
            for index, uuid in reader.gpu_uuids().items():
                try:
                    mode: Optional[str] = modes.get(index)
                except Exception:  # one GPU not answering: unknown
                    mode = None
                mode_of[uuid] = mode_of[f"idx{index}"] = mode
        except Exception:  # no NVML: every mode unknown
            pass
    return evaluate_mps_protection(cfg, shared, mode_of)


def check_slurm_version(cfg: Config, conf: Optional[SlurmConf], slurm_conf: Path) -> List[Check]:
    """The Slurm release in ``slurm_bin_dir`` and the settings that differ by release (admin/versioncheck.py).

    ``scontrol --version`` is run with ``SLURM_CONF`` set to the checked slurm.conf: without a configuration
    source 22.05's scontrol exits before printing its version (DNS SRV look-up).

    Args:
        cfg: the configuration (``slurm_bin_dir``); conf: the parsed slurm.conf, or None when unreadable.
        slurm_conf: the checked slurm.conf's path.

    Returns:
        The findings as checks (``admin/versioncheck.py``), or one ``fail`` when the release cannot be told.
    """
    name = "Slurm version"
    conf_dir = slurm_conf.parent
    try:
        version = slurm_version(cfg.slurm_bin_dir, slurm_env({"SLURM_CONF": str(slurm_conf)}))
    except ColocError as exc:
        return [fail(name, f"cannot tell the Slurm release: {exc.one_line()}",
                     "install slurm-client or set slurm_bin_dir in coloc.yaml")]
    found = versioncheck.evaluate(version, conf, versioncheck.cgroup_plugin(conf_dir),
                                  versioncheck.CGROUP2_MAGIC_PATH.exists())
    return [Check(name, status, what, fix) for status, what, fix in found]
