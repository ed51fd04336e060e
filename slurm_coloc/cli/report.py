"""``coloc-report``: usage per job, user, GPU, node and cluster; ``coloc-report plot`` draws PNGs."""
from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import click

from slurm_coloc import config as config_mod
from slurm_coloc.cli import version_option
from slurm_coloc.errors import ColocError, require
from slurm_coloc.report import export, query, reader, views
from slurm_coloc.report.query import parse_window
from slurm_coloc.report.summarize import load_report

VIEWS = query.VIEWS


class DefaultGroup(click.Group):
    """A group that runs ``jobs`` when the first argument is not a command (``coloc-report --json``)."""

    def parse_args(self, ctx: click.Context, args: List[str]) -> List[str]:
        """Put ``jobs`` in front of ``args`` when they name no command (or are empty), then parse as a group.

        Args:
            ctx: the click context; args: the command line after the program name.
        """
        if not args or (args[0] not in self.commands and args[0] not in ("-h", "--help", "--version")):
            args = ["jobs", *args]
        return super().parse_args(ctx, args)


def _fail(exc: ColocError) -> None:
    click.echo(f"coloc-report: error: {exc.one_line()}", err=True)
    sys.exit(exc.exit_code)


def common(f: Callable[..., Any]) -> Callable[..., Any]:
    """Window, filter, sort and output options shared by every view.

    Args:
        f: the view's command function (it receives the options as keyword arguments).

    Returns:
        ``f`` with the options applied (a click decorator).
    """
    opts = [
        click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
                     help="YAML config (default $COLOC_CONFIG or /etc/slurm-coloc/coloc.yaml)."),
        click.option("--since", "-S", default=None,
                     help="Window start, as sacct -S: now-7days, now-2hours, today, midnight, 2026-11-01, "
                          "2026-11-01T10:00; or 7d, 12h, @<unix s>."),
        click.option("--until", "-E", default=None,
                     help="Window end (same forms; default now; not before the start)."),
        click.option("--user", "users", multiple=True, help="Only this user's jobs (repeatable)."),
        click.option("--node", "nodes", multiple=True, help="Only this node (repeatable)."),
        click.option("--job", "job_ids", type=int, multiple=True, help="Only these job ids (repeatable)."),
        click.option("--sort", "sort_key", default=None,
                     help="Sort by this column (a JSON key, e.g. gpu_hours)."),
        click.option("--desc", is_flag=True, help="Sort descending."),
        click.option("--json", "as_json", is_flag=True,
                     help="Print JSON: {\"<view>\": [...], \"problems\": [...]}."),
        click.option("--csv", "as_csv", is_flag=True,
                     help="Print CSV: a header (also when empty), one line per row, times in ISO 8601."),
        click.option("-o", "--format", "fmt", default=None, metavar="COLS",
                     help="Columns to show, as squeue/sacct -o: comma-separated keys of the JSON rows "
                          "(jobs: -o jobid,user,shards,peak_mib); applies to the table, --csv and --json."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _direct_read_allowed(cfg: config_mod.Config, viewer: views.Viewer) -> bool:
    """Whether this process reads the databases itself: root and the admin group always; anyone else only
    where the files let them (a readable copy, a fresh install); otherwise the reader service answers."""
    if viewer.sees_all:
        return True
    state = Path(cfg.state_dir)
    try:
        if not state.exists():
            return True  # nothing recorded yet: the direct read says so
        if not os.access(state, os.R_OK | os.X_OK):
            return False
        return not cfg.ctld_db_path.exists() or os.access(cfg.ctld_db_path, os.R_OK)
    except OSError:  # EACCES on a path above or at state_dir
        return False


def _collect(q: query.Query, config_path: Optional[str]):
    """(problems, jobs, rows) of ``q``: read directly, or asked of the reader service (``coloc-report
    serve``)."""
    cfg = config_mod.load(config_path)
    viewer = views.current_viewer(cfg)
    if _direct_read_allowed(cfg, viewer):
        got = query.collect(cfg, q, viewer)
        return got.report.problems, got.jobs, got.rows
    reply = reader.ask(reader.socket_path(cfg), q.to_json())
    if not reply.get("ok"):
        err = ColocError(str(reply.get("error") or "the reader refused the request"))
        err.exit_code = int(reply.get("exit_code") or 2)
        raise err
    jobs = query.jobs_from_json(reply.get("jobs") or [])
    return list(reply.get("problems") or []), jobs, list(reply["rows"])


def _make_view(view: str) -> click.Command:
    @common
    def cmd(as_json: bool, as_csv: bool, sort_key: Optional[str], desc: bool, fmt: Optional[str],
            **kw: Any) -> None:
        if as_json and as_csv:
            _fail(ColocError("--json and --csv exclude each other"))
        try:
            cols = export.select_columns(view, fmt) if fmt is not None else None
            q = query.Query(view=view, since=kw["since"], until=kw["until"], users=kw["users"],
                            nodes=kw["nodes"],
                            job_ids=kw["job_ids"], sort_key=sort_key, desc=desc)
            problems, jobs, rows = _collect(q, kw["config_path"])
        except ColocError as exc:
            _fail(exc)
            return
        if as_json:
            export.to_json(view, export.project(rows, cols) if cols else rows, problems, sys.stdout)
        elif as_csv:
            export.to_csv(rows, sys.stdout, cols or export.VIEW_COLUMNS[view])
        else:
            from slurm_coloc.report import render

            if cols:
                render.selected_table(view, rows, cols, problems)
            elif view == "jobs":
                order = {r["job_id"]: i for i, r in enumerate(rows)}
                render.jobs_table(sorted(jobs, key=lambda j: order[j.job_id]), problems)
            elif view == "cluster":
                render.cluster_table(rows[0], problems)
            else:
                render.rows_table(view, rows, problems)

    helps = {
        "jobs": "Per job: request, estimate vs measured peak and error, unused memory, utilization next to "
                "SM "
                "activity/occupancy, GPU-hours, kWh, state, OOM and retry; wasteful jobs with the reason.",
        "users": "Per user: jobs, GPU-hours, kWh, SM activity, unused GiB-hours, estimate error, OOMs, "
                 "waste.",
        "gpus": "Per GPU: jobs, busy hours, collocation factor, utilization vs SM activity/occupancy "
                "(mean/p95), "
                "memory, kWh.",
        "nodes": "Per node: the GPU figures folded.",
        "cluster": "One summary: GPU-hours, busy GPU-hours, collocation factor, kWh, OOMs, waste, estimate "
                   "error.",
    }
    sort_by = {"jobs": "gpu_hours", "users": "gpu_hours", "gpus": "busy_hours", "nodes": "busy_gpu_hours",
               "cluster": None}[view]
    first = f"coloc-report {view} --since 7d" + (f" --sort {sort_by} --desc" if sort_by else "")
    cmd.__doc__ = f"{helps[view]}\n\n\b\nExample:\n  {first}\n" \
                  f"  coloc-report {view} --json --user alice\n"
    return click.command(name=view, context_settings={"help_option_names": ["-h", "--help"]})(cmd)


@click.group(cls=DefaultGroup, context_settings={"help_option_names": ["-h", "--help"]})
@version_option("coloc-report")
def cli() -> None:
    """Summarise slurm-coloc usage; the default view is ``jobs``.

    Users see only their own jobs; root and members of the config's admin_group see all.

    \b
    Example:
      coloc-report --since 7d                 # per-job table
      coloc-report users --since 30d --csv
      coloc-report gpus --node n1 --json
      coloc-report plot --since 1d --out /tmp/coloc-plots
      coloc-report advise 4242 --out /tmp/coloc-plots
    """


for _view in VIEWS:
    cli.add_command(_make_view(_view))


@cli.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None, help="YAML config.")
@click.option("--since", "-S", default="1d", show_default=True,
              help="Window start, as sacct -S (now-7days, today, 2026-11-01, 7d, ...).")
@click.option("--until", "-E", default=None,
              help="Window end (same forms; default now; not before the start).")
@click.option("--node", "nodes", multiple=True, help="Only this node (repeatable).")
@click.option("--user", "users", multiple=True, help="Only this user's jobs (repeatable).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=".", show_default=True,
              help="Directory for the PNG files (created).")
def plot(config_path: Optional[str], since: str, until: Optional[str], nodes: tuple, users: tuple,
         out_dir: str) -> None:
    """Draw PNGs: per GPU, memory and SM activity over time with job spans; and estimate vs measured peak.

    \b
    Example:
      coloc-report plot --since 2d --node n1 --out /tmp/plots

    \f
    Args:
        config_path: ``--config``, or None; since, until: ``--since`` / ``--until`` (``until`` None: now).
        nodes: ``--node`` values; users: ``--user`` values (empty: all); out_dir: ``--out``.

    Raises:
        SystemExit: bad input, matplotlib missing, or a caller who may not read the databases (one error
            line, the ``ColocError``'s exit code).
    """
    now = time.time()
    try:
        require("matplotlib")
        from slurm_coloc.report import plot as plot_mod

        cfg = config_mod.load(config_path)
        t0, t1 = parse_window(since, until, now)
        t1 = now if t1 is None else t1
        flt = views.Filters(since=t0, until=t1, users=users or None, nodes=nodes or None)
        viewer = views.current_viewer(cfg)
        if not _direct_read_allowed(cfg, viewer):
            raise ColocError("plot reads the databases itself: root and the admin group only",
                             hint="use `coloc-report jobs --json` or `coloc-report gpus --json` (answered by "
                                  "the "
                                  "reader service)")
        report = load_report(cfg)
        jobs = views.select_jobs(report, cfg, flt, viewer)
        files = plot_mod.draw_all(report, jobs, flt, viewer, out_dir, now)
    except ColocError as exc:
        _fail(exc)
        return
    for f in files:
        click.echo(f)
    for p in report.problems:
        click.echo(f"note: {p}", err=True)


@cli.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("job_id", type=int)
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None, help="YAML config.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write the job's timeline as <out>/advise-<job id>.png (created).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: {job, findings, notes, png, problems}.")
def advise(job_id: int, config_path: Optional[str], out_dir: Optional[str], as_json: bool) -> None:
    """Why one job's GPU share sat idle and what to change: every finding with its evidence and one
    suggestion, and with --out a timeline of its SM activity/occupancy, tensor and DRAM activity and memory vs
    grant.

    Your own jobs only, unless you are root or in the admin group (answered by the reader service when you
    cannot read the databases).

    \b
    Example:
      coloc-report advise 4242 --out /tmp/plots
      coloc-report advise 4242 --json

    \f
    Args:
        job_id: the job id; config_path: ``--config``; out_dir: ``--out`` (None: no PNG); as_json: ``--json``.

    Raises:
        SystemExit: an unknown or foreign job, bad input, or a plot that cannot be written (one error line,
            the ``ColocError``'s exit code or the reader's).
    """
    try:
        cfg = config_mod.load(config_path)
        viewer = views.current_viewer(cfg)
        if _direct_read_allowed(cfg, viewer):
            data = query.advise(cfg, job_id, viewer)
        else:
            data = reader.ask(reader.socket_path(cfg), {"op": "advise", "job_id": job_id})
            if not data.get("ok"):
                err = ColocError(str(data.get("error") or "the reader refused the request"))
                err.exit_code = int(data.get("exit_code") or 2)
                raise err
        job = query.jobs_from_json([data["job"]])[0]
        png = None
        if out_dir is not None:
            require("matplotlib")
            from slurm_coloc.report import plot as plot_mod

            out = Path(out_dir)
            try:
                out.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ColocError(f"cannot write the plot to {out_dir!r}: {exc}") from None
            png = str(plot_mod.advise_timeline(job, data.get("series") or [], out / f"advise-{job_id}.png"))
    except ColocError as exc:
        _fail(exc)
        return
    if as_json:
        import json

        click.echo(json.dumps({"job": data["job"], "findings": data["job"].get("findings", []),
                               "notes": data.get("notes", []), "png": png,
                               "problems": data.get("problems", [])},
                              default=str))
        return
    from slurm_coloc.report import render

    render.advice(job, data.get("notes") or [], png)
    for p in data.get("problems") or []:
        click.echo(f"note: {p}", err=True)


@cli.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None, help="YAML config.")
@click.option("--pidfile", type=click.Path(dir_okay=False), default=None, help="Write the server's pid here.")
def serve(config_path: Optional[str], pidfile: Optional[str]) -> None:
    """Run the reader service (as root): answer ordinary users' coloc-report with their own rows.

    Listens on report_socket_path (default <run_dir>/report.sock) until SIGTERM. The caller's uid comes from
    the kernel (SO_PEERCRED); the config is read again for every request. Logs one line per answer to stderr.

    \b
    Example:
      coloc-report serve --config /etc/slurm-coloc/coloc.yaml

    \f
    Args:
        config_path: ``--config``, or None; pidfile: ``--pidfile``, or None.

    Raises:
        SystemExit: not root, a bad config or a socket that cannot be served (one error line).
    """
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s coloc-report serve: %(message)s")
    try:
        if os.geteuid() != 0:
            raise ColocError("coloc-report serve must run as root (it reads every database for its callers)")
        path = reader.socket_path(config_mod.load(config_path))

        def ready() -> None:
            if pidfile:
                Path(pidfile).write_text(f"{os.getpid()}\n")
            click.echo(f"coloc-report serve: listening at {path}", err=True)

        def handle(request: object, uid: int) -> Dict[str, Any]:
            """``query.answer`` with the config read afresh; ``uid`` from ``SO_PEERCRED``."""
            try:
                cfg = config_mod.load(config_path)
            except ColocError as exc:
                return {"ok": False, "error": f"the reader's config: {exc.one_line()}", "exit_code": 1}
            return query.answer(cfg, request, uid)

        reader.serve(path, handle, ready)
    except ColocError as exc:
        _fail(exc)
    except OSError as exc:
        _fail(ColocError(f"cannot serve: {exc}"))


def main() -> None:
    """Console-script entry point."""
    cli.main(prog_name="coloc-report")
