"""``coloc-sbatch``: sbatch with a GPU memory estimate turned into a shard request."""
from __future__ import annotations

import os
import sys
import tempfile
import time
from typing import List, Optional, Tuple

import click

from slurm_coloc import config as config_mod
from slurm_coloc.errors import ColocError
from slurm_coloc.estimate.spec import Estimate, ModelSpec
from slurm_coloc.slurm.jobs import sbatch, spank_options_available
from slurm_coloc.submit.argv import split_command_line
from slurm_coloc.submit.directives import ParsedScript, parse_script
from slurm_coloc.submit.plan import Plan, build_plan

HISTORY_ASK_TIMEOUT_S = 10.0  # how long coloc-sbatch waits for the reader service's history answer


def script_history_mib(cfg: config_mod.Config, script_sha256: str) -> List[int]:
    """Memory (MiB) earlier runs of this exact script were shown to need (OOM fences, measured peaks).

    Read-only from the controller database, or, where this user may not read it (root and ``admin_group``
    only), asked of the reader service (``coloc-report serve``, at most ``HISTORY_ASK_TIMEOUT_S``). No database,
    no service or any error means no history (never fatal).
    """
    from slurm_coloc.store.history import script_history_mib as read_history

    try:
        if os.access(cfg.ctld_db_path, os.R_OK):
            return read_history(cfg, script_sha256)
        state = cfg.ctld_db_path.parent
        if not state.exists() or (os.access(state, os.X_OK) and not cfg.ctld_db_path.exists()):
            return []  # nothing recorded yet
        from slurm_coloc.report import reader

        reply = reader.ask(reader.socket_path(cfg), {"op": "history", "sha256": script_sha256},
                           timeout_s=HISTORY_ASK_TIMEOUT_S)
        values = reply.get("history_mib") if reply.get("ok") else None
        return [int(v) for v in values if isinstance(v, int)] if isinstance(values, list) else []
    except (ColocError, OSError):  # OSError: Path.exists() raises EACCES inside a directory we may not search
        return []


def plan_submission(argv: List[str]) -> Tuple[Plan, Optional[ParsedScript], bool]:
    """Split the command line, parse the script and plan (``build_plan`` runs the estimator only when the GPU
    rule needs it, for the GPU model of the job's partition, in a child process bounded by
    ``estimate_timeout_s``: ``cli/sbatch_estimate.py``); no side effect. Returns (plan, parsed script, dry_run).

    Raises:
        ColocError: any bad input (script, directives, options, model).
    """
    cfg = config_mod.load()
    cmd = split_command_line(argv)
    parsed = parse_script(cmd.script) if cmd.script is not None else None

    deadline = time.monotonic() + cfg.estimate_timeout_s  # one bound for all GPU models of the job

    def estimate_fn(spec: ModelSpec, gpu_model: str) -> Optional[Estimate]:
        from slurm_coloc.cli.sbatch_estimate import estimate_isolated

        history = script_history_mib(cfg, parsed.sha256) if parsed is not None else []
        est = estimate_isolated(spec, gpu_model, history, max(0.1, deadline - time.monotonic()))
        if est is None:
            click.echo(f"coloc-sbatch: warning: the estimate of {spec.model} did not finish within "
                       f"estimate_timeout_s ({cfg.estimate_timeout_s:g} s): submitting as without an estimate "
                       f"(a whole GPU); give #COLOC mem= or --coloc-mem to skip the estimate", err=True)
        return est

    spank = spank_options_available(cfg.slurm_bin_dir)
    return build_plan(cmd, parsed, cfg, estimate_fn, spank=spank), parsed, cmd.dry_run


# --- placement form (coloc-placer): the only place coloc-sbatch decides between held-for-placer and classic ---
def placement_form(sbatch_argv: List[str], cfg: config_mod.Config,
                   script_index: Optional[int] = None) -> Tuple[List[str], bool]:
    """The sbatch arguments to submit and whether they are the placer's form.

    When a coloc-placer finished a round recently (``placement.daemon.placer_alive``: its heartbeat
    ``<state_dir>/placer.json`` is fresh) and the plan is a shard job of one GPU, the job is submitted held and
    without GRES for the placer to steer (``placement.submit.placer_argv``); otherwise (no placer, a stale or
    unreadable heartbeat, whole-GPU or multi-GPU plans, and jobs the user holds with ``--hold``/``-H`` before
    the script at ``script_index``, which the placer would release) the classic untyped ``--gres=shard:N``
    request is kept, so a missing placer never leaves a job held.
    """
    from slurm_coloc.placement.daemon import placer_alive
    from slurm_coloc.placement.submit import placer_argv

    held = placer_argv(sbatch_argv)
    options = sbatch_argv[:script_index] if script_index is not None else sbatch_argv
    if held is None or any(a in ("--hold", "-H") for a in options) or not placer_alive(cfg):
        return list(sbatch_argv), False
    return held, True
# --- end of placement form ---


def submit(plan: Plan, parsed: Optional[ParsedScript]) -> int:
    """Run sbatch for ``plan`` (in the placer's form when a placer runs: ``placement_form``), echo its
    stdout/stderr verbatim, return its exit code."""
    cfg = config_mod.load()
    tmp_path = None
    try:
        script_path = str(parsed.path) if parsed is not None else None
        if plan.rewritten_script is not None:
            fd, tmp_path = tempfile.mkstemp(prefix="coloc-sbatch-", suffix=".sh")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(plan.rewritten_script)
            script_path = tmp_path
        args, placed = placement_form(plan.argv(script_path), cfg, plan.script_index)
        proc = sbatch(args, bin_dir=cfg.slurm_bin_dir)
        if placed and proc.returncode == 0:
            proc.stderr += (f"coloc-sbatch: held for coloc-placer, which picks the GPU ({plan.shards} shards); "
                            "squeue -o '%i %r %k' shows why it waits\n")
    finally:
        if tmp_path:
            os.unlink(tmp_path)
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    return proc.returncode


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False,
                                 "help_option_names": ["--help"]})
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
def cli(argv: Tuple[str, ...]) -> None:
    """Submit a training job like sbatch, asking for only the GPU memory it needs.

    ARGV is `[sbatch options] script [args]`; every sbatch option passes through unchanged. Own options:
    --dry-run (print the sbatch command, submit nothing), --coloc-mem SIZE (override the estimate, e.g. 6G),
    --exclusive-gpu (a whole GPU). The model comes from `#COLOC` lines in the script (docs/user.md).

    \b
    Example:
      coloc-sbatch --parsable -t 30 examples/train_digits.sh
      coloc-sbatch --dry-run --coloc-mem 6G train.sh --epochs 3
    """
    try:
        plan, parsed, dry_run = plan_submission(list(argv))
        if dry_run:
            click.echo(plan.command_line(str(parsed.path) if parsed else None))
            if plan.rewritten_script is not None:
                click.echo("coloc-sbatch: note: GPU #SBATCH lines are commented out in the submitted copy", err=True)
            click.echo(f"coloc-sbatch: {plan.mode} ({plan.reason})", err=True)
            return
        if plan.comment_dropped:
            click.echo(f"coloc-sbatch: note: the job comment is kept within Slurm's 1024 characters: left out "
                       f"{'; '.join(plan.comment_dropped)}", err=True)
        code = submit(plan, parsed)
        if code == 0 and "--parsable" not in argv:
            click.echo(f"coloc-sbatch: {' '.join(plan.gpu_args)} ({plan.mode}: {plan.reason})", err=True)
    except ColocError as exc:
        click.echo(f"coloc-sbatch: error: {exc.one_line()}", err=True)
        sys.exit(exc.exit_code)
    sys.exit(code)


def main() -> None:
    """Console-script entry point."""
    cli.main(prog_name="coloc-sbatch")
