"""``coloc-admin check``'s Slurm version check: which release runs, and the settings whose meaning differs by
release (``docs/admin.md`` "Slurm versions"; facts recorded in ``docs/slurm-versions.md``).

- The release (``scontrol --version`` in ``slurm_bin_dir``): 22.05, 24.11 and 26.05 are tested; another works
  through the 22.05 paths and is reported as untested (``warn``).
- ``SelectTypeParameters`` with ``MULTIPLE_SHARING_GRES_PJ`` (23.11+): one job may take shards from several
  GPUs, breaking the one-GPU-per-job memory fence: ``fail``. 22.05 does not know the flag (slurmctld refuses
  the config): ``fail`` too.
- ``cgroup/v1`` on 26.05+ (``CgroupPlugin=cgroup/v1`` in cgroup.conf, or autodetect on a cgroup v1 host):
  slurmd logs ``cgroup/v1 plugin is deprecated``; it works: ``warn``.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Tuple

from slurm_coloc.admin.slurmconf import SlurmConf
from slurm_coloc.slurm.run import CGROUP_V1_DEPRECATED, MULTIPLE_SHARING_GRES, TESTED, SlurmVersion

#: One finding: (status pass|fail|warn, what, fix).
Finding = Tuple[str, str, str]

CGROUP2_MAGIC_PATH = Path("/sys/fs/cgroup/cgroup.controllers")  # present only on a cgroup v2 (unified) host


def _tested() -> str:
    return ", ".join(f"{a}.{b:02d}" for a, b in TESTED)


def cgroup_plugin(conf_dir: Path) -> str:
    """``CgroupPlugin`` of ``<conf_dir>/cgroup.conf`` (lower-case); ``"autodetect"`` when unset or no file."""
    try:
        text = (conf_dir / "cgroup.conf").read_text(errors="replace")
    except OSError:
        return "autodetect"
    for line in text.splitlines():
        key, _, value = line.split("#", 1)[0].partition("=")
        if key.strip().lower() == "cgroupplugin" and value.strip():
            return value.strip().lower()
    return "autodetect"


def evaluate(version: SlurmVersion, conf: Optional[SlurmConf], cgroup: str,
             host_cgroup_v2: bool) -> List[Finding]:
    """The version check's findings for ``version`` (pure): the release, then each per-release setting.

    ``conf`` None (unreadable): the setting checks are left out. ``host_cgroup_v2``: this host mounts the
    unified hierarchy.
    """
    out: List[Finding] = []
    if version.tested:
        out.append(("pass", f"Slurm {version.release} (tested releases: {_tested()})", ""))
    else:
        out.append(("warn", f"Slurm {version.release} is not a tested release ({_tested()}): "
                                       "slurm-coloc uses its 22.05 paths on it",
                         "run a tested release, or run the cluster tests on this one (README 'Slurm "
                         "versions')"))
    if conf is not None:
        params = {p.strip().upper() for p in conf.get("SelectTypeParameters").split(",") if p.strip()}
        if "MULTIPLE_SHARING_GRES_PJ" in params:
            why = ("one job may take shards from several GPUs, so its memory fence no longer matches one GPU"
                   if version.at_least(MULTIPLE_SHARING_GRES)
                   else f"Slurm {version.release} does not know it")
            out.append(("fail", f"SelectTypeParameters has MULTIPLE_SHARING_GRES_PJ: {why}",
                        "remove MULTIPLE_SHARING_GRES_PJ from SelectTypeParameters and restart slurmctld"))
    v1 = cgroup == "cgroup/v1" or (cgroup == "autodetect" and not host_cgroup_v2)
    if version.at_least(CGROUP_V1_DEPRECATED) and v1:
        how = "set in cgroup.conf" if cgroup == "cgroup/v1" else "autodetected"
        out.append(("warn",
                    f"cgroup/v1 ({how}) is deprecated in Slurm {version.major}.{version.minor:02d}: it "
                            "works, slurmd logs a warning",
                    "move the nodes to cgroup v2 (CgroupPlugin=cgroup/v2 or autodetect on a unified host)"))
    return out
