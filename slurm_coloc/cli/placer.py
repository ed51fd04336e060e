"""``coloc-placer``: the controller-side daemon that steers held shard jobs to GPUs (docs/design.md,
"Placement mechanism"), a one-shot memory-only release of every held job, and a status check."""
from __future__ import annotations

import json
import signal
import sys
import time
from typing import Optional

import click

from slurm_coloc import config as config_mod
from slurm_coloc.cli import setup_logging, version_option
from slurm_coloc.errors import ColocError


def _cfg() -> config_mod.Config:
    """The config; on a config error one line on stderr and exit 2 (the units' RestartPreventExitStatus=2: a
    unit started before its config exists says so once instead of restarting every few seconds)."""
    try:
        return config_mod.load()
    except ColocError as exc:
        click.echo(f"coloc-placer: error: {exc.one_line()}", err=True)
        sys.exit(2)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@version_option("coloc-placer")
def cli() -> None:
    """Utilization-aware placement of shared GPU jobs, with Slurm as the scheduler of record.

    \b
    Examples:
      coloc-placer run                  # the daemon, on the slurmctld host, as root
      coloc-placer run --rounds 1       # one round, then exit
      coloc-placer status --json
      coloc-placer release-all          # stop placing: every held job runs, packed by memory only
      coloc-placer fallback             # (timer) release held jobs memory-only when no placer is alive
    """


@cli.command("run")
@click.option("--rounds", type=click.IntRange(min=1), default=None, help="Stop after this many rounds.")
@click.option("--log-file/--log-stderr", default=False, help="Log to <log_dir>/placer.log instead of stderr.")
def run_cmd(rounds: Optional[int], log_file: bool) -> None:
    """Steer held shard jobs every placement_interval_s.

    \b
    Example: coloc-placer run --log-file

    \f
    Args:
        rounds: ``--rounds``: stop after this many rounds; None: run until stopped.
        log_file: ``--log-file`` (True) or ``--log-stderr``.

    Raises:
        click.ClickException: Slurm or the configuration failed (one line, exit 1).
    """
    from slurm_coloc.placement.daemon import run_loop
    from slurm_coloc.placement.heartbeat import clear_heartbeat

    cfg = _cfg()
    setup_logging(cfg.log_dir, "coloc-placer", "placer.log" if log_file else None)

    def stop(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)  # systemd's stop is a clean stop, as Ctrl-C is
    try:
        run_loop(cfg, rounds)
    except ColocError as exc:
        raise click.ClickException(exc.one_line()) from None
    except KeyboardInterrupt:
        clear_heartbeat(cfg)  # jobs submitted after a clean stop are not held for a placer that is gone
        sys.exit(0)


@cli.command("release-all")
def release_all_cmd() -> None:
    """Release every held job the placer would steer, as an untyped shard request (memory-only packing).

    \b
    Example: coloc-placer release-all
    """
    from slurm_coloc.slurm import placement as sp

    cfg = _cfg()
    try:
        jobs = [(j, sp.placer_shards(j)) for j in sp.queue(cfg.slurm_bin_dir)]
    except ColocError as exc:
        raise click.ClickException(exc.one_line()) from None
    released, failed = 0, 0
    for job, shards in jobs:
        if shards is None:
            continue
        try:
            sp.release_memory_only(job.job_id, shards, job.comment, cfg.slurm_bin_dir)
            click.echo(f"job {job.job_id}: released with shard:{shards}")
            released += 1
        except ColocError as exc:  # one job's failure never stops the others' release
            click.echo(f"job {job.job_id}: not released: {exc.one_line()}", err=True)
            failed += 1
    click.echo(f"{released} job(s) released" + (f", {failed} failed" if failed else ""))
    if failed:
        sys.exit(1)


@cli.command("fallback")
@click.option("--max-age-s", type=click.FloatRange(min=0), default=None,
              help="Heartbeat age that counts as dead (default: 5 x placement_interval_s + 30).")
def fallback_cmd(max_age_s: Optional[float]) -> None:
    """When no placer is alive, release every held placer job memory-only; otherwise do nothing.

    Meant for a timer on the controller host (deploy/systemd/coloc-placer-fallback.timer), so held jobs never
    wait on a dead placer.

    \b
    Example: coloc-placer fallback

    \f
    Args:
        max_age_s: ``--max-age-s``: the heartbeat age (s) that counts as dead; None: the default above.

    Raises:
        click.ClickException: Slurm could not be asked (one line, exit 1; nothing released).
    """
    from slurm_coloc.placement.daemon import release_if_stale

    cfg = _cfg()
    setup_logging(cfg.log_dir, "coloc-placer", None)
    try:
        released = release_if_stale(cfg, max_age_s=max_age_s)
    except ColocError as exc:
        raise click.ClickException(exc.one_line()) from None
    if released is None:
        click.echo("coloc-placer fallback: placer alive, nothing to do")
    else:
        click.echo(f"coloc-placer fallback: no placer heartbeat: {len(released)} job(s) released memory-only"
                   + (f" ({', '.join(map(str, released))})" if released else ""))


@cli.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print the heartbeat as JSON.")
def status_cmd(as_json: bool) -> None:
    """Whether a placer finished a round recently (exit 1 when not).

    \b
    Example: coloc-placer status

    \f
    Args:
        as_json: ``--json``: print the heartbeat and ``alive`` as one JSON object.

    Raises:
        SystemExit: exit 1 when no placer is alive.
    """
    from slurm_coloc.placement.heartbeat import heartbeat_paths, placer_alive

    cfg = _cfg()
    beat = {}
    for path in heartbeat_paths(cfg):
        try:
            beat = json.loads(path.read_text())
            break
        except (OSError, ValueError):
            continue
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
