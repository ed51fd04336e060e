"""``coloc-report``: what ran where, what it asked for, how it ended."""
from __future__ import annotations

import json
import sys
from typing import Optional

import click

from slurm_coloc import config as config_mod
from slurm_coloc.errors import ColocError
from slurm_coloc.report.summarize import load_report


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--json", "as_json", is_flag=True, help="Print JSON (one object with 'jobs' and 'problems').")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="YAML config (default $COLOC_CONFIG or /etc/slurm-coloc/coloc.yaml).")
@click.option("--job", "job_ids", type=int, multiple=True, help="Only these job ids (repeatable).")
def cli(as_json: bool, config_path: Optional[str], job_ids: tuple) -> None:
    """Summarise jobs: id, user, node, GPU(s), shards, estimate, state, exit code, runtime.

    \b
    Example:
      coloc-report
      coloc-report --json --job 42
    """
    try:
        cfg = config_mod.load(config_path)
        report = load_report(cfg)
    except ColocError as exc:
        click.echo(f"coloc-report: error: {exc.one_line()}", err=True)
        sys.exit(exc.exit_code)
    jobs = [j for j in report.jobs if not job_ids or j.job_id in job_ids]
    if as_json:
        click.echo(json.dumps({"jobs": [j.to_json() for j in jobs], "problems": report.problems}, indent=2))
        return
    from slurm_coloc.report.render import jobs_table

    jobs_table(jobs, report.problems)


def main() -> None:
    """Console-script entry point."""
    cli.main(prog_name="coloc-report")
