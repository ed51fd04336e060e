"""``coloc-sbatch``: sbatch with a GPU memory estimate turned into a shard request."""
from __future__ import annotations

import os
import shlex
import sys
import tempfile
import time
from typing import TYPE_CHECKING, List, Optional, Tuple

import click

from slurm_coloc import config as config_mod
from slurm_coloc.cli import version_option
from slurm_coloc.errors import ColocError
from slurm_coloc.estimate.decision import ProbeAnswer, explain_lines
from slurm_coloc.estimate.spec import Estimate, ModelSpec
from slurm_coloc.slurm.jobs import sbatch, spank_options_available
from slurm_coloc.slurm.run import slurm_env
from slurm_coloc.slurm.sbatch_options import installed_options
from slurm_coloc.submit.directives import ParsedScript, parse_script
from slurm_coloc.submit.plan import NO_INFORMATION, Plan, ProbeFn, build_plan
from slurm_coloc.submit.request import CommandLine, script_options, split_command_line
from slurm_coloc.units import is_bare_number

if TYPE_CHECKING:
    from slurm_coloc.probe.probe import ProbeResult

HISTORY_ASK_TIMEOUT_S = 10.0  # how long coloc-sbatch waits for the reader service's history answer
PROBE_LOG_LINES = 15  # lines of the probed program's output --explain shows


def script_history_mib(cfg: config_mod.Config, script_sha256: str) -> List[int]:
    """Memory (MiB) earlier runs of this exact script were shown to need (OOM fences, measured peaks).

    Read-only from the controller database, or, where this user may not read it (root and ``admin_group``
    only), asked of the reader service (``coloc-report serve``, at most ``HISTORY_ASK_TIMEOUT_S``). No
    database, no service or any error (``ColocError``, ``OSError``) means no history: never raises.
    """
    from slurm_coloc.store.summaries import script_history_mib as read_history

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
    """Split the command line, parse the script and plan; no side effect.

    ``build_plan`` asks the sources of rule 4 only when it needs them (``submit/plan.py``): the script probe
    (``probe_fn``: the script's training program in a child process of the job's Python, as the caller,
    bounded by ``probe_timeout_s`` and ``probe_mem_limit_mib``), the ``#COLOC model=`` estimate
    (``estimate_fn``: a child process bounded by ``estimate_timeout_s``, ``cli/estimate.py``) and the
    script's history. Neither child writes to our stdout. Returns ``(plan, parsed script or None with
    --wrap, dry_run)``.

    Raises:
        ColocError: any bad input (script, directives, options, model); ConfigError: a bad configuration.
    """
    cfg = config_mod.load()
    cmd = split_command_line(argv, installed_options(cfg.slurm_bin_dir))
    parsed = parse_script(cmd.script) if cmd.script is not None else None

    deadline = time.monotonic() + cfg.estimate_timeout_s  # one bound for all GPU models of the job

    def estimate_fn(spec: ModelSpec, gpu_model: str) -> Optional[Estimate]:
        """The estimate (MiB) of ``spec`` on ``gpu_model`` within the time left, or None (warned)."""
        from slurm_coloc.cli.estimate import estimate_isolated

        # history is applied by the decision (estimate/decision.py), to whichever figure wins
        est = estimate_isolated(spec, gpu_model, [], max(0.1, deadline - time.monotonic()))
        if est is None:
            click.echo(f"coloc-sbatch: warning: the estimate of {spec.model} did not finish within "
                       f"estimate_timeout_s ({cfg.estimate_timeout_s:g} s): submitting as without an "
                       "estimate "
                       f"(a whole GPU); give #COLOC mem= or --coloc-mem to skip the estimate", err=True)
        return est

    history: List[List[int]] = []

    def history_fn() -> List[int]:
        if not history:
            history.append(script_history_mib(cfg, parsed.sha256) if parsed is not None else [])
        return history[0]

    probe_fn: Optional[ProbeFn] = None
    probe_off = ""
    wrap = next((o.value for o in reversed(cmd.options) if o.name == "wrap" and o.value), None)
    if not cfg.probe:
        probe_off = "off (config probe: off)"
    elif parsed is None and wrap is None:
        probe_off = "no batch script"
    else:
        probe_fn = script_probe_fn(cfg, cmd, parsed, wrap)
    spank = spank_options_available(cfg.slurm_bin_dir)
    plan = build_plan(cmd, parsed, cfg, estimate_fn, spank=spank, probe_fn=probe_fn, history_fn=history_fn,
                      probe_off_reason=probe_off)
    return plan, parsed, cmd.dry_run


def script_probe_fn(cfg: config_mod.Config, cmd: CommandLine, parsed: Optional[ParsedScript],
                    wrap: Optional[str] = None) -> ProbeFn:
    """The decision's ``probe_fn``: runs ``probe.probe_script`` once (for the first GPU model asked) and
    answers other GPU models from the same replayed peaks. The script is ``parsed``, or with ``--wrap`` the
    script sbatch makes of its command (``#!/bin/sh`` + the command). The job's working directory is
    ``--chdir`` (command line, then ``#SBATCH``), else ours; root's ``--uid``/``--gid`` name the user the
    probe runs as (``probe/sandbox.py``). ``--explain`` probes afresh and its answer replaces the cached one.
    Bounds: ``probe_timeout_s`` (s), ``probe_mem_limit_mib`` (MiB). Never raises: a failed probe is an answer
    without a figure.
    """
    opts = script_options(parsed, cmd.table)[0] + list(cmd.options)
    last = lambda name: next((o.value for o in reversed(opts) if o.name == name and o.value), None)
    chdir = last("chdir")
    workdir = os.path.abspath(os.path.expanduser(chdir)) if chdir else os.getcwd()
    runs: List[Tuple[str, "ProbeResult"]] = []

    def probe_fn(gpu: str) -> ProbeAnswer:
        """The probe's answer for GPU model ``gpu`` (the probe runs once; other models reuse its peaks)."""
        from slurm_coloc.probe.probe import estimate_from_result, probe_script

        try:
            if not runs:
                path, text = (str(parsed.path), None) if parsed is not None else ("--wrap",
                                                                                  f"#!/bin/sh\n{wrap}\n")
                runs.append((gpu,
                             probe_script(path, () if parsed is None else cmd.script_args, submit_dir=workdir,
                                               gpu=gpu, timeout_s=cfg.probe_timeout_s,
                                               mem_limit_mib=cfg.probe_mem_limit_mib, refresh=cmd.explain,
                                               keep_log=cmd.explain, text=text, uid_option=last("uid"),
                                               gid_option=last("gid"))))
            first_gpu, res = runs[0]
            est = res.estimate
            if est is not None and gpu != first_gpu:
                est = estimate_from_result(res.detail, gpu)
            tail = tuple(line for line in res.log_text.splitlines()
                         if line.strip())[-PROBE_LOG_LINES:]
            writes = tuple(str(w) for w in res.detail.get("outside_writes") or ())
            made = tuple(str(f) for f in res.detail.get("scratch_files") or ())
            return ProbeAnswer(est, res.ran, res.reason, tail, writes, res.cached, res.wall_s, made)
        except Exception as exc:  # the probe never stops a submission
            return ProbeAnswer(None, "probe ran nothing",
                               f"the probe failed: {type(exc).__name__}: {exc}"[:300])

    return probe_fn


def placement_form(sbatch_argv: List[str], cfg: config_mod.Config,
                   script_index: Optional[int] = None) -> Tuple[List[str], bool]:
    """The sbatch arguments to submit and whether they are the placer's form.

    When a coloc-placer finished a round recently (``placement.heartbeat.placer_alive``: its heartbeat
    ``<state_dir>/placer.json`` is fresh) and the plan is a shard job of one GPU, the job is submitted held
    and without GRES for the placer to steer (``heartbeat.placer_argv``); otherwise (no placer, a stale
    or unreadable heartbeat, whole-GPU or multi-GPU plans, and jobs the user holds with ``--hold``/``-H``
    before the script at ``script_index``, which the placer would release) the classic untyped
    ``--gres=shard:N`` request is kept, so a missing placer never leaves a job held. Never raises.
    """
    from slurm_coloc.placement.heartbeat import placer_alive, placer_argv

    held = placer_argv(sbatch_argv)
    options = sbatch_argv[:script_index] if script_index is not None else sbatch_argv
    if held is None or any(a in ("--hold", "-H") for a in options) or not placer_alive(cfg):
        return list(sbatch_argv), False
    return held, True


def submit(plan: Plan, parsed: Optional[ParsedScript]) -> int:
    """Run sbatch for ``plan`` (its rewritten script in a temporary file; in the placer's form when a placer
    runs: ``placement_form``), echo its stdout/stderr verbatim, return its exit code.

    Raises:
        ConfigError: a bad configuration; SlurmError: sbatch missing or timed out; OSError: the temporary
        script cannot be written.
    """
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
        # held for the placer, without GRES: the SPANK plugin's "--coloc-mem without --gres" note is not its
        env = slurm_env({"COLOC_SBATCH_PLACER": "1"}) if placed else None
        proc = sbatch(args, bin_dir=cfg.slurm_bin_dir, env=env)
        if placed and proc.returncode == 0:
            proc.stderr += (f"coloc-sbatch: held for coloc-placer, which picks the GPU ({plan.shards} "
                            "shards); "
                            "squeue -o '%i %r %k' shows why it waits\n")
    finally:
        if tmp_path:
            os.unlink(tmp_path)
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    return proc.returncode


def report_decision(plan: Plan, parsed: Optional[ParsedScript], explain: bool) -> None:
    """On stderr (never stdout: ``--parsable``): ignored ``#COLOC`` lines, the decision's warnings, one line
    on what the probe ran, and with ``explain`` every source's figure and the probe's output and outside
    writes."""
    if parsed is not None and parsed.late_coloc_lines:
        lines = ", ".join(str(n) for n in parsed.late_coloc_lines)
        click.echo(f"coloc-sbatch: warning: #COLOC line(s) {lines} come after the script's first command and "
                   "are "
                   f"ignored: move them above it, into the header with the #SBATCH lines", err=True)
    decision = plan.decision
    if decision is None:
        return
    for warning in decision.warnings:
        click.echo(f"coloc-sbatch: warning: {warning}", err=True)
    if explain:
        for line in explain_lines(decision):
            click.echo(f"coloc-sbatch: explain: {line}", err=True)
    elif decision.probe is not None:
        probe = decision.probe
        tail = " (cached)" if probe.cached else f" in {probe.wall_s:.1f} s"
        what = f"; no figure: {probe.reason}" if probe.reason else ""
        click.echo(f"coloc-sbatch: {probe.ran}{tail}{what}", err=True)


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False,
                                 "help_option_names": ["-h", "--help"]})
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
@version_option("coloc-sbatch")
def cli(argv: Tuple[str, ...]) -> None:
    """Submit a training job like sbatch, asking for only the GPU memory it needs.

    ARGV is `[sbatch options] script [args]`; every sbatch option passes through unchanged (which ones take a
    value is read from the installed sbatch's --help and --usage; an option it does not list keeps the word
    after it as its value unless that word is an existing file, the script). Own options:
    --dry-run (print the sbatch command, submit nothing), --coloc-mem SIZE (override the estimate: 6G, 6GiB,
    6144M; a bare number is GiB, unlike sbatch --mem's MB), --exclusive-gpu (a whole GPU), --explain (print
    each memory source's figure and why one won, on stderr). -h/--help and --version only before the script.
    The figure comes from a probe of the script's own training program, or from `#COLOC` lines (docs/user.md).

    \b
    Example:
      coloc-sbatch --parsable -t 30 examples/train_digits.sh
      coloc-sbatch --dry-run --coloc-mem 6G train.sh --epochs 3
      coloc-sbatch --explain --dry-run train.sh --epochs 3

    \f
    Args:
        argv: the command line after the program name (sbatch options, own options, script, its arguments).

    Raises:
        SystemExit: sbatch's exit code, or the ``ColocError``'s (one error line; nothing submitted).
    """
    try:
        cmd = split_command_line(list(argv), installed_options(config_mod.load().slurm_bin_dir))
        plan, parsed, dry_run = plan_submission(list(argv))
        if cmd.coloc_mem is not None and is_bare_number(cmd.coloc_mem):
            click.echo(f"coloc-sbatch: note: --coloc-mem {cmd.coloc_mem.strip()} is read as "
                       f"{cmd.coloc_mem.strip()} GiB (sbatch --mem {cmd.coloc_mem.strip()} would be MB); "
                       "write "
                       f"{cmd.coloc_mem.strip()}G to say so", err=True)
        report_decision(plan, parsed, cmd.explain)
        if dry_run:  # the command submit() would run: the placer's held form while a placer runs
            shown, placed = placement_form(plan.argv(str(parsed.path) if parsed else None), config_mod.load(),
                                           plan.script_index)
            click.echo(shlex.join(["sbatch", *shown]))
            if placed:
                click.echo("coloc-sbatch: note: a coloc-placer runs: the job would go in held, without GRES, "
                           "for it to pick the GPU", err=True)
            if plan.rewritten_script is not None:
                click.echo("coloc-sbatch: note: GPU #SBATCH lines are commented out in the submitted copy",
                           err=True)
            click.echo(f"coloc-sbatch: {plan.mode} ({plan.reason})", err=True)
            return
        if plan.comment_dropped:
            click.echo("coloc-sbatch: note: the job comment is kept within Slurm's 1024 characters: left "
                       "out "
                       f"{'; '.join(plan.comment_dropped)}", err=True)
        code = submit(plan, parsed)
        if code == 0 and (not cmd.has("parsable") or plan.reason == NO_INFORMATION):
            click.echo(f"coloc-sbatch: {' '.join(plan.gpu_args)} ({plan.mode}: {plan.reason})", err=True)
    except ColocError as exc:
        click.echo(f"coloc-sbatch: error: {exc.one_line()}", err=True)
        sys.exit(exc.exit_code)
    sys.exit(code)


def main() -> None:
    """Console-script entry point."""
    cli.main(prog_name="coloc-sbatch")
