"""``coloc-admin``: ``check`` (is this host and the cluster config set up for slurm-coloc?), ``config``,
``enable``/``disable`` (slurm.conf, gres.conf, plugstack), ``torch`` (link a site's PyTorch into the venv)."""
from __future__ import annotations

import difflib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import List, Optional

import click

from slurm_coloc import config as config_mod
from slurm_coloc.admin import host_checks, switch
from slurm_coloc.admin.checks import run_all
from slurm_coloc.cli import version_option
from slurm_coloc.errors import ColocError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@version_option("coloc-admin")
def cli() -> None:
    """slurm-coloc administration.

    \b
    Example:
      coloc-admin check
      coloc-admin check --no-gpu --slurm-conf /etc/slurm/slurm.conf
      coloc-admin enable --dry-run
      coloc-admin disable --write
      coloc-admin torch /opt/coloc-torch
      coloc-admin config
    """


@cli.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="slurm-coloc YAML config (default $COLOC_CONFIG or /etc/slurm-coloc/coloc.yaml).")
@click.option("--slurm-conf", "slurm_conf", type=click.Path(dir_okay=False), default=None,
              help="slurm.conf (default $SLURM_CONF or /etc/slurm/slurm.conf); gres.conf is read beside it.")
@click.option("--no-gpu", is_flag=True,
              help="Skip the NVML and MPS checks whatever the role (a GPU node without its driver, CI).")
@click.option("--role", type=click.Choice(["auto", "controller", "compute", "login"]), default="auto",
              show_default=True,
              help="This host's role; auto: controller if SlurmctldHost names it, compute node if a NodeName "
                   "does, else login. GPU checks run on compute nodes only.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: {\"ok\": bool, \"checks\": [...]}.")
@click.option("--quiet", "-q", is_flag=True, help="Print only failures.")
def check(config_path: Optional[str], slurm_conf: Optional[str], no_gpu: bool, role: str, as_json: bool,
          quiet: bool) -> None:
    """Check slurm.conf, gres.conf, plugstack.conf, hook paths and permissions, databases directories,
    Slurm binaries, NVML and MPS; print each problem with its fix. The host's role (controller, compute
    node, login host) decides what applies: GPU device files, NVML, MPS and the metrics endpoint only on a
    compute node, for its own node. Exit 0 only when every check passes (skipped checks do not fail), 1 when
    any fails, 2 when the slurm-coloc config itself cannot be read.

    \b
    Example:
      coloc-admin check                   # on any host: the role comes from slurm.conf
      coloc-admin check --role compute    # a GPU node whose name slurm.conf spells otherwise

    \f
    Args:
        config_path: ``--config``, or None; slurm_conf: ``--slurm-conf``, or None.
        no_gpu: ``--no-gpu``; role: ``--role``; as_json: ``--json``; quiet: ``--quiet``.

    Raises:
        SystemExit: always, with the exit code above.
    """
    try:
        cfg = config_mod.load(config_path)
    except ColocError as exc:
        click.echo(f"coloc-admin: error: {exc.one_line()}", err=True)
        sys.exit(exc.exit_code)
    conf = Path(slurm_conf or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf")
    results = run_all(cfg, conf, no_gpu, role)
    failed = [r for r in results if r.status == "fail"]
    if as_json:
        click.echo(json.dumps({"ok": not failed, "checks": [r.to_json() for r in results]}, indent=2))
    else:
        for r in results:
            if quiet and r.status != "fail":
                continue
            click.echo(f"{r.status.upper():4}  {r.name}: {r.what}")
            if r.fix:
                click.echo(f"      fix: {r.fix}")
        n_skip = sum(r.status == "skip" for r in results)
        click.echo(f"{len(results) - len(failed) - n_skip} passed, {len(failed)} failed, {n_skip} skipped"
                   + ("" if failed else ": slurm-coloc is set up"))
    sys.exit(1 if failed else 0)


@cli.command("config", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="slurm-coloc YAML config (default $COLOC_CONFIG or /etc/slurm-coloc/coloc.yaml).")
@click.option("--sample", is_flag=True, help="Print the commented sample config (every key at its default).")
def config_cmd(config_path: Optional[str], sample: bool) -> None:
    """Print the effective configuration: every key, its value and where it comes from (the file, a
    COLOC_<KEY> variable, or the default). Exit 2 with one line when the config cannot be used.

    \b
    Example:
      coloc-admin config
      coloc-admin config --sample > coloc.yaml

    \f
    Args:
        config_path: ``--config``, or None; sample: ``--sample``.

    Raises:
        SystemExit: exit 2 when the config cannot be used.
    """
    if sample:
        click.echo(config_mod.sample_yaml(), nl=False)
        return
    try:
        text = config_mod.effective_yaml(config_path)
    except ColocError as exc:
        click.echo(f"coloc-admin: error: {exc.one_line()}", err=True)
        sys.exit(exc.exit_code)
    click.echo(text, nl=False)


@cli.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="slurm-coloc YAML config (default $COLOC_CONFIG or /etc/slurm-coloc/coloc.yaml).")
@click.option("--slurm-conf", "slurm_conf", type=click.Path(dir_okay=False), default=None,
              help="slurm.conf (default $SLURM_CONF or /etc/slurm/slurm.conf); gres.conf is beside it.")
@click.option("--dry-run/--write", "dry_run", default=True, show_default=True,
              help="Print the changes as diffs (default), or apply them, keeping a backup of each file.")
@click.option("--no-spank", is_flag=True, help="Leave plugstack.conf alone (no --coloc-* sbatch options).")
@click.option("--replace-hooks", is_flag=True, help="Replace Prolog=/Epilog=/... that name another program.")
@click.option("--chain-hooks", is_flag=True,
              help="Keep a hook key that names another program: it then names <slurm.conf "
                   "dir>/coloc-chain-<hook>, which runs that program first (its exit status counts), "
                   "then ours.")
@click.option("--hook-dir", default=switch.HOOK_DIR, show_default=True, help="Where the hook shims are.")
@click.option("--spank-so", default=switch.SPANK_SO, show_default=True, help="The SPANK plugin.")
def enable(config_path: Optional[str], slurm_conf: Optional[str], dry_run: bool, no_spank: bool,
           replace_hooks: bool, chain_hooks: bool, hook_dir: str, spank_so: str) -> None:
    """Turn slurm-coloc on in slurm.conf, gres.conf and plugstack.conf: print the changes (--dry-run), or
    write them (--write; each changed file is first copied to <file>.coloc-backup-<time>). Nothing else is
    touched; restart slurmctld and every slurmd afterwards (new GRES need a restart). Exit 2 with one line on
    a conflict (a hook already set to another program) or an unreadable file.

    \b
    Example:
      coloc-admin enable --dry-run
      coloc-admin enable --write && systemctl restart slurmctld

    \f
    Args:
        config_path: ``--config``, or None; slurm_conf: ``--slurm-conf``, or None.
        dry_run: ``--dry-run`` (True) or ``--write``; no_spank: ``--no-spank``.
        replace_hooks: ``--replace-hooks``; chain_hooks: ``--chain-hooks``; hook_dir: ``--hook-dir``;
        spank_so: ``--spank-so``.

    Raises:
        SystemExit: exit 2 on a conflict, an unreadable file or a file that cannot be written.
    """
    try:
        cfg = config_mod.load(config_path)
        conf = Path(slurm_conf or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf")
        changes = switch.plan_enable(conf, cfg, hook_dir, spank_so, spank=not no_spank,
                                     replace_hooks=replace_hooks, chain_hooks=chain_hooks)
    except ColocError as exc:
        click.echo(f"coloc-admin: error: {exc.one_line()}", err=True)
        sys.exit(exc.exit_code)
    if not changes:
        click.echo(f"{conf}: slurm-coloc is already enabled; nothing to change")
        return
    if _apply(changes, dry_run):
        click.echo(f"wrote {len(changes)} files; copy them to every node, then restart slurmctld and every "
                   "slurmd")


def _apply(changes: List[switch.Change], dry_run: bool) -> bool:
    """Print each change as a unified diff; with ``dry_run`` False write them (each existing file first
    copied to ``<file>.coloc-backup-<time>``, unless ``backup`` is off: a file wholly ours, in a directory
    whose glob would run or include a backup; new and rewritten files replaced atomically; ``remove``: the
    file deleted). Returns whether anything was written; exits 2 on a write error."""
    for c in changes:
        diff = difflib.unified_diff((c.old or "").splitlines(True), c.new.splitlines(True),
                                    str(c.path) if c.old is not None else "/dev/null",
                                    "/dev/null" if c.remove else str(c.path))
        click.echo("".join(diff), nl=False)
    if dry_run:
        click.echo(f"(dry run: {len(changes)} files would change; apply with --write)")
        return False
    stamp = time.strftime("%Y%m%d-%H%M%S")
    try:
        for c in changes:
            if c.old is not None and c.backup:
                backup = c.path.with_name(f"{c.path.name}.coloc-backup-{stamp}")
                shutil.copy2(c.path, backup)
                click.echo(f"backup: {backup}")
            if c.remove:
                c.path.unlink()
                click.echo(f"removed: {c.path}")
                continue
            tmp = c.path.with_name(f".{c.path.name}.coloc-new")
            tmp.write_text(c.new, encoding="utf-8")
            if c.old is not None:
                shutil.copymode(c.path, tmp)
            else:
                tmp.chmod(c.mode)
            os.replace(tmp, c.path)
    except OSError as exc:
        click.echo(f"coloc-admin: error: cannot write {exc.filename}: {exc.strerror}", err=True)
        sys.exit(2)
    return True


@cli.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--slurm-conf", "slurm_conf", type=click.Path(dir_okay=False), default=None,
              help="slurm.conf (default $SLURM_CONF or /etc/slurm/slurm.conf).")
@click.option("--dry-run/--write", "dry_run", default=True, show_default=True,
              help="Print the changes as diffs (default), or apply them, keeping a backup of each file.")
@click.option("--hook-dir", default=switch.HOOK_DIR, show_default=True, help="Where the hook shims are.")
@click.option("--spank-so", default=switch.SPANK_SO, show_default=True, help="The SPANK plugin.")
def disable(slurm_conf: Optional[str], dry_run: bool, hook_dir: str, spank_so: str) -> None:
    """Turn slurm-coloc's hooks and SPANK plugin off: remove the hook keys that name the shims, our script
    in a glob hook directory (prolog.d/), and the plugin's plugstack line or plugstack.conf.d file. Shards
    (GresTypes, Gres=shard, gres.conf) stay: jobs asking for shards still run. Run it, copy the files to
    every node and restart slurmctld and slurmd before removing the package (a Prolog that does not exist
    drains the node). Exit 2 with one line when slurm.conf cannot be read or a file cannot be written.

    \b
    Example:
      coloc-admin disable --dry-run
      coloc-admin disable --write && systemctl restart slurmctld

    \f
    Args:
        slurm_conf: ``--slurm-conf``, or None; dry_run: ``--dry-run`` (True) or ``--write``.
        hook_dir: ``--hook-dir``; spank_so: ``--spank-so``.

    Raises:
        SystemExit: exit 2 on an unreadable slurm.conf or a file that cannot be written.
    """
    conf = Path(slurm_conf or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf")
    try:
        changes = switch.plan_disable(conf, hook_dir, spank_so)
    except ColocError as exc:
        click.echo(f"coloc-admin: error: {exc.one_line()}", err=True)
        sys.exit(exc.exit_code)
    if not changes:
        click.echo(f"{conf}: slurm-coloc's hooks and plugin are not configured; nothing to change")
        return
    if _apply(changes, dry_run):
        click.echo(f"wrote {len(changes)} files; copy them to every node, then restart slurmctld and every "
                   "slurmd; the shards stay configured")


@cli.command("torch", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("target", required=False, type=click.Path(file_okay=False))
@click.option("--remove", is_flag=True, help="Remove the link (estimates then have no PyTorch).")
def torch_cmd(target: Optional[str], remove: bool) -> None:
    """Give slurm-coloc's venv a site's PyTorch and NumPy: TARGET is a Python environment of the same Python
    version (a venv or prefix, or its site-packages) where `pip install torch numpy` was run. Both are
    imported from it first; then a .pth file in the venv's site-packages appends it to the path (the venv's
    own packages, pinned by the package, come first and are never replaced). Exit 2 with one line when
    TARGET is unusable (e.g. "No module named 'numpy'").

    \b
    Example:
      python3 -m venv /opt/coloc-torch && /opt/coloc-torch/bin/pip install torch numpy
      coloc-admin torch /opt/coloc-torch

    \f
    Args:
        target: the environment's directory; remove: ``--remove``.

    Raises:
        SystemExit: exit 2 on an unusable TARGET or a .pth that cannot be written.
    """
    pth = host_checks.pth_path()
    try:
        if remove:
            pth.unlink(missing_ok=True)
            click.echo(f"removed {pth}")
            return
        if not target:
            raise ColocError("give the directory of a Python environment with torch and numpy",
                             hint="e.g. coloc-admin torch /opt/coloc-torch")
        found = host_checks.check_torch_site(Path(target))
        tmp = pth.with_name(f".{pth.name}.new")
        tmp.write_text(f"{found.path}\n", encoding="utf-8")
        tmp.chmod(0o644)
        os.replace(tmp, pth)
    except ColocError as exc:
        click.echo(f"coloc-admin: error: {exc.one_line()}", err=True)
        sys.exit(exc.exit_code)
    except OSError as exc:
        click.echo(f"coloc-admin: error: cannot write {pth}: {exc.strerror}", err=True)
        sys.exit(2)
    click.echo(f"torch {found.torch}, numpy {found.numpy} from {found.path} (linked by {pth})")


def main() -> None:
    """Console-script entry point."""
    cli.main(prog_name="coloc-admin")
