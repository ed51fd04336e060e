"""``coloc-admin enable``: the slurm.conf / gres.conf / plugstack.conf changes, printed (--dry-run) or written
with a backup (--write); a site's own Prolog is never replaced silently."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Dict

from slurm_coloc.admin.checks import check_gres_conf
from slurm_coloc.admin.slurmconf import parse_plugstack, parse_slurm_conf
from slurm_coloc.config import Config

SITE = """\
ClusterName=site
SlurmctldHost=ctl
SelectType=select/cons_res
GresTypes=gpu
NodeName=gpu[01-02] CPUs=64 Gres=gpu:4 RealMemory=500000
NodeName=cpu01 CPUs=64 RealMemory=500000
PartitionName=debug Nodes=ALL Default=YES
"""


def _enable(conf: Path, *args: str) -> subprocess.CompletedProcess:
    cfg = conf.parent.parent / f"{conf.parent.name}-coloc.yaml"
    if not cfg.exists():
        cfg.write_text("gpu_mem_gib: 80\n")
    return subprocess.run([sys.executable, "-m", "slurm_coloc", "admin", "enable", "--slurm-conf", str(conf),
                           *args],
                          capture_output=True, text=True,
                          env={"COLOC_CONFIG": str(cfg), "PATH": "/usr/bin:/bin"})


def _files(d: Path) -> Dict[str, str]:
    return {p.name: p.read_text() for p in sorted(d.iterdir())}


def test_dry_run_prints_the_changes_and_writes_nothing(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text(SITE)
    (tmp_path / "gres.conf").write_text("Name=gpu File=/dev/nvidia[0-3]\n")
    before = _files(tmp_path)
    out = _enable(conf, "--dry-run")
    assert out.returncode == 0, out.stderr
    assert _files(tmp_path) == before
    for line in ("-SelectType=select/cons_res", "+SelectType=select/cons_tres", "+GresTypes=gpu,shard",
                 "+NodeName=gpu[01-02] CPUs=64 Gres=gpu:4,shard:320 RealMemory=500000",
                 "+Prolog=/usr/lib/slurm-coloc/hooks/prolog.sh",
                 "+TaskProlog=/usr/lib/slurm-coloc/hooks/task_prolog.sh",
                 "+NodeName=gpu[01-02] Name=shard Count=80 File=/dev/nvidia3",
                 "+optional /usr/lib/slurm-coloc/coloc_spank.so run_dir=/run/slurm-coloc",
                 "+++ " + str(conf)):
        assert line in out.stdout.splitlines(), line
    assert "NodeName=cpu01 CPUs=64 RealMemory=500000" not in "".join(
        ln for ln in out.stdout.splitlines() if ln.startswith("+"))


def test_write_keeps_a_backup_and_a_second_run_changes_nothing(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text(SITE)
    (tmp_path / "gres.conf").write_text("AutoDetect=nvml\n")
    out = _enable(conf, "--write")
    assert out.returncode == 0, out.stderr
    backups = sorted(p.name for p in tmp_path.glob("*.coloc-backup-*"))
    assert [b.split(".coloc")[0] for b in backups] == ["gres.conf", "slurm.conf"]
    assert (tmp_path / backups[1]).read_text() == SITE
    parsed = parse_slurm_conf(conf.read_text())
    assert parsed.get("SelectType") == "select/cons_tres" and parsed.get("GresTypes") == "gpu,shard"
    assert parsed.get("EpilogSlurmctld") == "/usr/lib/slurm-coloc/hooks/epilog_slurmctld.sh"
    assert parsed.nodes[0]["gres"] == "gpu:4,shard:320" and "gres" not in parsed.nodes[1]
    gres = (tmp_path / "gres.conf").read_text()   # AutoDetect=nvml: the devices NVML finds, /dev/nvidia0..3
    assert [ln.split("File=")[1] for ln in gres.splitlines() if "Name=shard" in ln] == \
        [f"/dev/nvidia{i}" for i in range(4)]
    checks = check_gres_conf(tmp_path / "gres.conf", parsed, Config(gpu_mem_gib=80))
    assert not [c for c in checks if "shard" in c.what and c.status == "fail"], checks
    assert parse_plugstack((tmp_path / "plugstack.conf").read_text())[0][:2] == \
        ("optional", "/usr/lib/slurm-coloc/coloc_spank.so")
    after = _files(tmp_path)
    again = _enable(conf, "--write")
    assert again.returncode == 0 and "already enabled; nothing to change" in again.stdout
    assert _files(tmp_path) == after


def test_a_site_prolog_is_a_conflict_in_one_line_and_nothing_is_written(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text(SITE + "Prolog=/etc/slurm/site-prolog.sh\n")
    (tmp_path / "gres.conf").write_text("Name=gpu File=/dev/nvidia[0-3]\n")
    before = _files(tmp_path)
    out = _enable(conf, "--write")
    assert out.returncode == 2 and out.stdout == "" and len(out.stderr.splitlines()) == 1
    assert "Prolog=/etc/slurm/site-prolog.sh" in out.stderr and "--replace-hooks" in out.stderr
    assert _files(tmp_path) == before
    out = _enable(conf, "--write", "--replace-hooks", "--no-spank")
    assert out.returncode == 0 and "Prolog=/usr/lib/slurm-coloc/hooks/prolog.sh" in conf.read_text()
    assert not (tmp_path / "plugstack.conf").exists()


def test_a_gpu_node_without_device_files_is_one_line(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text(SITE)
    out = _enable(conf, "--dry-run")  # no gres.conf at all: the GPUs' device files are unknown
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1 and "gpu[01-02]" in out.stderr


JOBSTATS = SITE + "Prolog={d}/prolog.d/*.sh\nEpilog={d}/epilog.d/*.sh\n"


def test_a_glob_prolog_is_joined_and_plugstack_d_gets_a_file_and_disable_undoes_both(tmp_path: Path) -> None:
    """jobstats' Prolog=/etc/slurm/prolog.d/*.sh (Slurm runs every match): our hook joins the directory as a
    script of its own; Debian's plugstack.conf (another package's file) includes plugstack.conf.d/*.conf,
    where the plugin's line goes. ``disable`` removes both and our hook keys, leaving the site's."""
    for d in ("prolog.d", "epilog.d", "plugstack.conf.d"):
        (tmp_path / d).mkdir()
    (tmp_path / "prolog.d" / "jobstats.sh").write_text("#!/bin/sh\nexit 0\n")
    conf = tmp_path / "slurm.conf"
    conf.write_text(JOBSTATS.format(d=tmp_path))
    (tmp_path / "gres.conf").write_text("Name=gpu File=/dev/nvidia[0-3]\n")
    plugstack = f"include {tmp_path}/plugstack.conf.d/*.conf\n"
    (tmp_path / "plugstack.conf").write_text(plugstack)
    out = _enable(conf, "--write")
    assert out.returncode == 0, out.stderr
    parsed = parse_slurm_conf(conf.read_text())
    assert parsed.get("Prolog") == f"{tmp_path}/prolog.d/*.sh"  # the site's glob stays
    assert parsed.get("TaskProlog") == "/usr/lib/slurm-coloc/hooks/task_prolog.sh"
    ours = tmp_path / "prolog.d" / "coloc.sh"
    assert ours.stat().st_mode & 0o777 == 0o755
    assert ours.read_text().splitlines()[-1] == 'exec /usr/lib/slurm-coloc/hooks/prolog.sh "$@"'
    assert (tmp_path / "epilog.d" / "coloc.sh").read_text().splitlines()[-1].endswith("/epilog.sh \"$@\"")
    assert (tmp_path / "plugstack.conf").read_text() == plugstack  # not ours to edit
    assert parse_plugstack((tmp_path / "plugstack.conf.d" / "coloc.conf").read_text())[0][:2] == \
        ("optional", "/usr/lib/slurm-coloc/coloc_spank.so")
    # no backup where a glob would run it
    assert sorted(p.name for p in (tmp_path / "prolog.d").iterdir()) == ["coloc.sh", "jobstats.sh"]
    assert _enable(conf, "--write").stdout.endswith("nothing to change\n")
    off = subprocess.run([sys.executable, "-m", "slurm_coloc", "admin", "disable", "--slurm-conf", str(conf),
                          "--write"], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert off.returncode == 0, off.stderr
    parsed = parse_slurm_conf(conf.read_text())
    assert not [k for k in ("TaskProlog", "PrologSlurmctld", "EpilogSlurmctld") if parsed.get(k)]
    assert parsed.get("Prolog") == f"{tmp_path}/prolog.d/*.sh" and parsed.get("GresTypes") == "gpu,shard"
    assert sorted(p.name for p in (tmp_path / "prolog.d").iterdir()) == ["jobstats.sh"]
    assert not (tmp_path / "epilog.d" / "coloc.sh").exists()
    assert not (tmp_path / "plugstack.conf.d" / "coloc.conf").exists()
    again = subprocess.run([sys.executable, "-m", "slurm_coloc", "admin", "disable", "--slurm-conf",
                            str(conf)], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert again.returncode == 0 and "nothing to change" in again.stdout


def test_disable_takes_our_plugin_line_out_of_a_plugstack_conf_it_shares(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text(SITE)
    (tmp_path / "gres.conf").write_text("Name=gpu File=/dev/nvidia[0-3]\n")
    (tmp_path / "plugstack.conf").write_text("required /usr/lib/slurm/site_spank.so\n")
    assert _enable(conf, "--write").returncode == 0
    assert "coloc_spank.so" in (tmp_path / "plugstack.conf").read_text()
    off = subprocess.run([sys.executable, "-m", "slurm_coloc", "admin", "disable", "--slurm-conf", str(conf),
                          "--write"], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert off.returncode == 0, off.stderr
    assert (tmp_path / "plugstack.conf").read_text() == "required /usr/lib/slurm/site_spank.so\n"
    assert not parse_slurm_conf(conf.read_text()).get("Prolog")


def test_chain_hooks_keeps_a_sites_program_first_and_disable_puts_it_back(tmp_path: Path) -> None:
    """jobstats' EpilogSlurmctld=/usr/local/sbin/slurmctldepilog.sh: --chain-hooks keeps it (its exit status
    counts), ours runs after it; disable names the site's program again."""
    site = tmp_path / "site-epilog.sh"
    log = tmp_path / "ran"
    site.write_text(f"#!/bin/sh\necho site \"$@\" >> {log}\nexit 3\n")
    site.chmod(0o755)
    conf = tmp_path / "slurm.conf"
    conf.write_text(SITE + f"EpilogSlurmctld={site}\n")
    (tmp_path / "gres.conf").write_text("Name=gpu File=/dev/nvidia[0-3]\n")
    refused = _enable(conf, "--write", "--no-spank")
    assert refused.returncode == 2 and "--chain-hooks" in refused.stderr
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "epilog_slurmctld.sh").write_text(f"#!/bin/sh\necho ours \"$@\" >> {log}\nexit 0\n")
    (hooks / "epilog_slurmctld.sh").chmod(0o755)
    out = _enable(conf, "--write", "--no-spank", "--chain-hooks", "--hook-dir", str(hooks))
    assert out.returncode == 0, out.stderr
    chain = tmp_path / "coloc-chain-epilog_slurmctld.sh"
    assert parse_slurm_conf(conf.read_text()).get("EpilogSlurmctld") == str(chain)
    run = subprocess.run([str(chain), "a1"], capture_output=True, text=True, timeout=30)
    assert run.returncode == 3 and log.read_text() == "site a1\nours a1\n"
    again = _enable(conf, "--write", "--no-spank", "--chain-hooks", "--hook-dir", str(hooks))
    assert again.stdout.endswith("nothing to change\n"), again.stdout
    off = subprocess.run([sys.executable, "-m", "slurm_coloc", "admin", "disable", "--slurm-conf", str(conf),
                          "--hook-dir", str(hooks), "--write"], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin"})
    assert off.returncode == 0, off.stderr
    assert parse_slurm_conf(conf.read_text()).get("EpilogSlurmctld") == str(site) and not chain.exists()


def test_check_reads_a_glob_prolog_file_by_file_and_wants_ours_among_them(tmp_path: Path) -> None:
    from slurm_coloc.admin.host_checks import check_hooks

    (tmp_path / "prolog.d").mkdir()
    site = tmp_path / "prolog.d" / "jobstats.sh"
    site.write_text("#!/bin/sh\nexit 0\n")
    site.chmod(0o755)
    conf = parse_slurm_conf(f"Prolog={tmp_path}/prolog.d/*.sh\n")
    before = check_hooks(conf)
    assert [c.status for c in before] == ["pass", "fail"] and "matches no slurm-coloc hook" in before[1].what
    ours = tmp_path / "prolog.d" / "coloc.sh"
    ours.write_text(f"#!/bin/sh\n# slurm-coloc (coloc-admin enable): ...\nexec {tmp_path}/none \"$@\"\n")
    ours.chmod(0o755)
    assert [(c.status, c.what.rsplit("/", 1)[1]) for c in check_hooks(conf)] == \
        [("pass", "coloc.sh"), ("pass", "jobstats.sh")]
