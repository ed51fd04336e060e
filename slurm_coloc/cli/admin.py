"""``coloc-admin check``: is this node and the cluster config set up for slurm-coloc?"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional

import click

from slurm_coloc import config as config_mod
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
    """


@cli.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="slurm-coloc YAML config (default $COLOC_CONFIG or /etc/slurm-coloc/coloc.yaml).")
@click.option("--slurm-conf", "slurm_conf", type=click.Path(dir_okay=False), default=None,
              help="slurm.conf (default $SLURM_CONF or /etc/slurm/slurm.conf); gres.conf is read beside it.")
@click.option("--no-gpu", is_flag=True,
              help="Not a GPU node (controller, login node, CI): skip the NVML and MPS checks.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: {\"ok\": bool, \"checks\": [...]}.")
@click.option("--quiet", "-q", is_flag=True, help="Print only failures.")
def check(config_path: Optional[str], slurm_conf: Optional[str], no_gpu: bool, as_json: bool, quiet: bool) -> None:
    """Check slurm.conf, gres.conf, plugstack.conf, hook paths and permissions, databases directories,
    Slurm binaries, NVML and MPS; print each problem with its fix. Exit 0 only when every check passes
    (skipped checks do not fail), 1 when any fails, 2 when the slurm-coloc config itself cannot be read.

    \b
    Example:
      coloc-admin check                   # on a GPU node
      coloc-admin check --no-gpu          # on the controller or in CI
    """
    try:
        cfg = config_mod.load(config_path)
    except ColocError as exc:
        click.echo(f"coloc-admin: error: {exc.one_line()}", err=True)
        sys.exit(exc.exit_code)
    conf = Path(slurm_conf or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf")
    results = run_all(cfg, conf, no_gpu)
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


def main() -> None:
    """Console-script entry point."""
    cli.main(prog_name="coloc-admin")
