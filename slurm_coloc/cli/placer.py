"""``coloc-placer``: the controller-side daemon that steers held shard jobs to GPUs (docs/design.md,
"Placement mechanism"), a one-shot memory-only release of every held job, and a status check."""
from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Optional

import click

from slurm_coloc import config as config_mod
from slurm_coloc.errors import ColocError


def _cfg() -> config_mod.Config:
    try:
        return config_mod.load()
    except ColocError as exc:
        raise click.ClickException(exc.one_line()) from None


def _logging(cfg: config_mod.Config, to_file: bool) -> None:
    handler: logging.Handler = logging.StreamHandler()
    if to_file:
        try:
            Path(cfg.log_dir).mkdir(parents=True, exist_ok=True)
            handler = logging.FileHandler(Path(cfg.log_dir) / "placer.log")
        except OSError:
            pass
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s coloc-placer[%(process)d] %(message)s"))
    root = logging.getLogger("slurm_coloc")
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, os.environ.get("COLOC_LOG_LEVEL", "INFO").upper(), logging.INFO))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Utilization-aware placement of shared GPU jobs, with Slurm as the scheduler of record.

    \b
    Examples:
      coloc-placer run                  # the daemon, on the slurmctld host, as root
      coloc-placer run --rounds 1       # one round, then exit
      coloc-placer status --json
      coloc-placer release-all          # stop placing: every held job runs, packed by memory only
    """


@cli.command("run")
@click.option("--rounds", type=click.IntRange(min=1), default=None, help="Stop after this many rounds.")
@click.option("--log-file/--log-stderr", default=False, help="Log to <log_dir>/placer.log instead of stderr.")
def run_cmd(rounds: Optional[int], log_file: bool) -> None:
    """Steer held shard jobs every placement_interval_s.

    \b
    Example: coloc-placer run --log-file
    """
    from slurm_coloc.placement.daemon import run_loop

    cfg = _cfg()
    _logging(cfg, log_file)
    try:
        run_loop(cfg, rounds)
    except ColocError as exc:
        raise click.ClickException(exc.one_line()) from None
    except KeyboardInterrupt:
        sys.exit(0)


@cli.command("release-all")
def release_all_cmd() -> None:
    """Release every held job the placer would steer, as an untyped shard request (memory-only packing).

    \b
    Example: coloc-placer release-all
    """
    from slurm_coloc.comment import parse_comment
    from slurm_coloc.slurm import placement as sp

    cfg = _cfg()
    try:
        jobs = [j for j in sp.queue(cfg.slurm_bin_dir) if sp.is_candidate(j)]
        for job in jobs:
            shards = int((parse_comment(job.comment) or {})["shards"])
            sp.release_memory_only(job.job_id, shards, job.comment, cfg.slurm_bin_dir)
            click.echo(f"job {job.job_id}: released with shard:{shards}")
    except ColocError as exc:
        raise click.ClickException(exc.one_line()) from None
    click.echo(f"{len(jobs)} job(s) released")


@cli.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print the heartbeat as JSON.")
def status_cmd(as_json: bool) -> None:
    """Whether a placer finished a round recently (exit 1 when not).

    \b
    Example: coloc-placer status
    """
    from slurm_coloc.placement.daemon import placer_alive

    cfg = _cfg()
    path = Path(cfg.state_dir) / "placer.json"
    try:
        beat = json.loads(path.read_text())
    except (OSError, ValueError):
        beat = {}
    alive = placer_alive(cfg)
    if as_json:
        click.echo(json.dumps({"alive": alive, **beat}, sort_keys=True))
    else:
        age = time.time() - float(beat["ts"]) if "ts" in beat else None
        click.echo(f"coloc-placer: {'alive' if alive else 'not running'}"
                   + (f", last round {age:.0f} s ago: {beat}" if age is not None else ""))
    if not alive:
        sys.exit(1)


def main() -> None:
    cli(prog_name="coloc-placer")


if __name__ == "__main__":
    main()
