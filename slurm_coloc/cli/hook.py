"""``coloc-hook``: the entry point the Prolog/Epilog shims in prolog_epilog/ call. Always exits 0."""
from __future__ import annotations

import sys

import click

from slurm_coloc.hooks.runner import HOOKS, run_hook


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("hook", type=click.Choice(sorted(HOOKS)))
def cli(hook: str) -> None:
    """Run one slurm-coloc hook for the job in the environment (called by Slurm, as root).

    \b
    Example (slurm.conf):
      Prolog=/usr/local/share/slurm-coloc/prolog_epilog/prolog.sh
    where prolog.sh runs: coloc-hook prolog
    """
    for line in run_hook(hook):
        click.echo(line)


def main() -> None:
    """Console-script entry: run and exit 0 whatever happened (errors are in hooks.log)."""
    try:
        cli.main(standalone_mode=False)
    except click.ClickException as exc:
        exc.show()
    except Exception as exc:  # noqa: BLE001 - never fail the node
        print(f"coloc-hook: {exc}", file=sys.stderr)
    sys.exit(0)
