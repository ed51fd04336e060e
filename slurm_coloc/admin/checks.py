"""The cluster config checks of ``coloc-admin check`` (slurm.conf, gres.conf, plugstack.conf, directories,
Slurm binaries and release) and ``run_all``, which adds the host checks (``host_checks.py``) for this host's
role (``slurmconf.detect``).

A check never raises for a broken setup: it reports ``fail`` with one line saying what is wrong and one saying
how to fix it. ``skip`` is for checks that do not apply (``--no-gpu``, no plugstack.conf configured); skips do
not fail the run.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import AbstractSet, Dict, List, Optional, Tuple

from slurm_coloc.admin.host_checks import (
    HOOK_KEYS,
    Check,
    check_gpu,
    check_hooks,
    check_metrics,
    check_mps_protection,
    check_munge,
    fail,
    ok,
    unsafe_path,
)
from slurm_coloc.admin.slurmconf import (
    CGROUP2_MAGIC_PATH,
    SlurmConf,
    cgroup_plugin,
    detect,
    evaluate,
    expand_hostlist,
    parse_gres_conf,
    parse_gres_counts,
    parse_plugstack,
    parse_slurm_conf,
)
from slurm_coloc.config import Config
from slurm_coloc.errors import ColocError
from slurm_coloc.slurm.run import slurm_env, slurm_version

SLURM_BINARIES = ("sbatch", "scontrol", "squeue")


def _read(path: Path, name: str) -> "tuple[Optional[str], Optional[Check]]":
    try:
        return path.read_text(encoding="utf-8", errors="replace"), None
    except OSError as exc:
        return None, fail(name, f"cannot read {path}: {exc.strerror or exc}",
                          f"create {path} or pass its path")


def check_slurm_conf(conf_path: Path, cfg: Config) -> "tuple[List[Check], Optional[SlurmConf]]":
    """GresTypes, cons_tres, the hooks configured, each node's gpu and shard counts agree; the conf is None
    when the file cannot be read."""
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


def check_gres_conf(gres_path: Path, conf: SlurmConf, cfg: Config,
                    local: Optional[AbstractSet[str]] = None) -> List[Check]:
    """gres.conf: every GPU file has one shard line with Count = gpu_mem_gib, and the device files exist.

    GPU files come from ``Name=gpu File=`` lines or, on a node with ``AutoDetect=nvml`` (or ``nvidia``,
    24.11+) globally or on its own line (gres.conf(5)), from slurmd's NVML autodetection: then the shard
    lines' ``File=`` name the GPUs (docs/admin.md's production gres.conf). Only the device files of ``local``
    nodes (None: every node) must exist here. One ``Check`` per GPU node.
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
        bad = _check_gpu_files(name, n, files, shards, cfg, out, local is None or n in local)
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
                     out: List[Check], here: bool = True) -> bool:
    """Append a failure to ``out`` for each GPU device file of ``node`` that does not exist (when the node is
    ``here``) or has no shard line with ``Count = cfg.gpu_mem_gib``; returns whether any failed."""
    bad = False
    for f in files:
        if here and not os.path.exists(f):
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
    """plugstack.conf (if configured or present): each plugin line's plugin exists, root-owned, not writable
    by others (``include`` lines are not followed)."""
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


def check_dirs(cfg: Config) -> List[Check]:
    """state_dir, its nodes/ and run_dir, and the DB files: root-owned, not writable by group/others (a
    missing directory passes: the first hook creates it)."""
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
    """sbatch/scontrol/squeue executable in ``slurm_bin_dir`` (hooks get no PATH)."""
    missing = [b for b in SLURM_BINARIES if not os.access(Path(cfg.slurm_bin_dir) / b, os.X_OK)]
    if missing:
        return [fail("slurm binaries", f"{', '.join(missing)} not found in slurm_bin_dir {cfg.slurm_bin_dir}",
                     "install slurm-client or set slurm_bin_dir in coloc.yaml")]
    return [ok("slurm binaries", f"{', '.join(SLURM_BINARIES)} in {cfg.slurm_bin_dir}")]


def run_all(cfg: Config, slurm_conf: Path, no_gpu: bool, role: str = "auto",
            hostname: Optional[str] = None) -> List[Check]:
    """Every check, in order: the host's role, slurm.conf, gres.conf, plugstack.conf, hooks (those four when
    slurm.conf reads), munge, directories, binaries, GPU, metrics, MPS protection, Slurm version.

    ``no_gpu`` skips the GPU, MPS and metrics checks whatever the role; ``role`` ``auto`` comes from
    slurm.conf and the host name. On a controller or login host the GPU checks are skipped and no GPU device
    file of gres.conf must exist here.
    """
    results, conf = check_slurm_conf(slurm_conf, cfg)
    try:
        text = slurm_conf.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    host = detect(conf, text, role, hostname)
    results.insert(0, ok("role", host.describe()))
    skip_gpu: "bool | str" = no_gpu or ("" if host.gpu else f"{'/'.join(sorted(host.roles))} host")
    if conf is not None:
        local = set(host.nodes) if host.nodes or not host.gpu else None
        results += check_gres_conf(slurm_conf.parent / "gres.conf", conf, cfg, local)
        results += check_plugstack(conf, slurm_conf.parent)
        results += check_hooks(conf)
    results += check_munge(conf)
    results += check_dirs(cfg)
    results += check_slurm_binaries(cfg)
    results += check_gpu(cfg, skip_gpu)
    results += check_metrics(cfg, skip_gpu)
    results += check_mps_protection(cfg, skip_gpu)
    results += check_slurm_version(cfg, conf, slurm_conf)
    return results


def check_slurm_version(cfg: Config, conf: Optional[SlurmConf], slurm_conf: Path) -> List[Check]:
    """The Slurm release in ``slurm_bin_dir`` and the settings that differ by release (``evaluate``).

    ``scontrol --version`` runs with ``SLURM_CONF`` set to the checked slurm.conf: without a configuration
    source 22.05's scontrol exits before printing its version (DNS SRV look-up).
    """
    name = "Slurm version"
    conf_dir = slurm_conf.parent
    try:
        version = slurm_version(cfg.slurm_bin_dir, slurm_env({"SLURM_CONF": str(slurm_conf)}))
    except ColocError as exc:
        return [fail(name, f"cannot tell the Slurm release: {exc.one_line()}",
                     "install slurm-client or set slurm_bin_dir in coloc.yaml")]
    found = evaluate(version, conf, cgroup_plugin(conf_dir), CGROUP2_MAGIC_PATH.exists())
    return [Check(name, status, what, fix) for status, what, fix in found]
