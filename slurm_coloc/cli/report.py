"""``coloc-report``: usage per job, user, GPU, node and cluster; ``coloc-report plot`` draws PNGs."""
from __future__ import annotations

import sys
import time
from typing import Any, Callable, List, Optional

import click

from slurm_coloc import config as config_mod
from slurm_coloc.errors import ColocError
from slurm_coloc.report import export, views
from slurm_coloc.report.summarize import load_report
from slurm_coloc.report.timespec import parse_when

VIEWS = ("jobs", "users", "gpus", "nodes", "cluster")


class DefaultGroup(click.Group):
    """A group that runs ``jobs`` when the first argument is not a command (``coloc-report --json``)."""

    def parse_args(self, ctx: click.Context, args: List[str]) -> List[str]:
        if not args or (args[0] not in self.commands and args[0] not in ("-h", "--help")):
            args = ["jobs", *args]
        return super().parse_args(ctx, args)


def _fail(exc: ColocError) -> None:
    click.echo(f"coloc-report: error: {exc.one_line()}", err=True)
    sys.exit(exc.exit_code)


def common(f: Callable[..., Any]) -> Callable[..., Any]:
    """Window, filter, sort and output options shared by every view."""
    opts = [
        click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
                     help="YAML config (default $COLOC_CONFIG or /etc/slurm-coloc/coloc.yaml)."),
        click.option("--since", default=None, help="Window start: 7d, 12h, 2026-11-01, 2026-11-01T10:00, @<unix s>."),
        click.option("--until", default=None, help="Window end (same forms; default now)."),
        click.option("--user", "users", multiple=True, help="Only this user's jobs (repeatable)."),
        click.option("--node", "nodes", multiple=True, help="Only this node (repeatable)."),
        click.option("--job", "job_ids", type=int, multiple=True, help="Only these job ids (repeatable)."),
        click.option("--sort", "sort_key", default=None, help="Sort by this column (a JSON key, e.g. gpu_hours)."),
        click.option("--desc", is_flag=True, help="Sort descending."),
        click.option("--json", "as_json", is_flag=True, help="Print JSON: {\"<view>\": [...], \"problems\": [...]}."),
        click.option("--csv", "as_csv", is_flag=True, help="Print CSV (header + one line per row)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _collect(view: str, config_path: Optional[str], since: Optional[str], until: Optional[str], users: tuple,
             nodes: tuple, job_ids: tuple, sort_key: Optional[str], desc: bool):
    now = time.time()
    cfg = config_mod.load(config_path)
    flt = views.Filters(since=parse_when(since, now), until=parse_when(until, now), users=users or None,
                        nodes=nodes or None, job_ids=job_ids or None)
    viewer = views.current_viewer(cfg)
    report = load_report(cfg)
    jobs = views.select_jobs(report, cfg, flt, viewer, with_util=view in ("jobs", "users"), now=now)
    if not viewer.sees_all:
        report.problems.append(f"showing only {viewer.name}'s jobs (root and group "
                               f"{cfg.admin_group or '<admin_group unset>'} see all)")
    if view == "jobs":
        rows = views.job_rows(jobs)
    elif view == "users":
        rows = views.user_rows(jobs)
    else:
        gpus = views.gpu_rows(report, jobs, flt, viewer, now)
        rows = {"gpus": lambda: views.public(gpus), "nodes": lambda: views.node_rows(gpus),
                "cluster": lambda: [views.cluster_row(gpus, jobs)]}[view]()
    try:
        rows = views.sort_rows(rows, sort_key, desc)
    except KeyError:
        cols = ", ".join(rows[0].keys()) if rows else ""
        raise ColocError(f"--sort: no column {sort_key!r} in the {view} view", hint=f"columns: {cols}") from None
    return report, jobs, rows


def _make_view(view: str) -> click.Command:
    @common
    def cmd(as_json: bool, as_csv: bool, sort_key: Optional[str], desc: bool, **kw: Any) -> None:
        if as_json and as_csv:
            _fail(ColocError("--json and --csv exclude each other"))
        try:
            report, jobs, rows = _collect(view, kw["config_path"], kw["since"], kw["until"], kw["users"],
                                          kw["nodes"], kw["job_ids"], sort_key, desc)
        except ColocError as exc:
            _fail(exc)
            return
        if as_json:
            export.to_json(view, rows, report.problems, sys.stdout)
        elif as_csv:
            export.to_csv(rows, sys.stdout)
        else:
            from slurm_coloc.report import render

            if view == "jobs":
                order = {r["job_id"]: i for i, r in enumerate(rows)}
                render.jobs_table(sorted(jobs, key=lambda j: order[j.job_id]), report.problems)
            elif view == "cluster":
                render.cluster_table(rows[0], report.problems)
            else:
                render.rows_table(view, rows, report.problems)

    helps = {
        "jobs": "Per job: request, estimate vs measured peak and error, unused memory, utilization next to SM "
                "activity/occupancy, GPU-hours, kWh, state, OOM and retry; wasteful jobs with the reason.",
        "users": "Per user: jobs, GPU-hours, kWh, SM activity, unused GiB-hours, estimate error, OOMs, waste.",
        "gpus": "Per GPU: jobs, busy hours, collocation factor, utilization vs SM activity/occupancy (mean/p95), "
                "memory, kWh.",
        "nodes": "Per node: the GPU figures folded.",
        "cluster": "One summary: GPU-hours, busy GPU-hours, collocation factor, kWh, OOMs, waste, estimate error.",
    }
    sort_by = {"jobs": "gpu_hours", "users": "gpu_hours", "gpus": "busy_hours", "nodes": "busy_gpu_hours",
               "cluster": None}[view]
    first = f"coloc-report {view} --since 7d" + (f" --sort {sort_by} --desc" if sort_by else "")
    cmd.__doc__ = f"{helps[view]}\n\n\b\nExample:\n  {first}\n" \
                  f"  coloc-report {view} --json --user alice\n"
    return click.command(name=view, context_settings={"help_option_names": ["-h", "--help"]})(cmd)


@click.group(cls=DefaultGroup, context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Summarise slurm-coloc usage; the default view is ``jobs``.

    Users see only their own jobs; root and members of the config's admin_group see all.

    \b
    Example:
      coloc-report --since 7d                 # per-job table
      coloc-report users --since 30d --csv
      coloc-report gpus --node n1 --json
      coloc-report plot --since 1d --out /tmp/coloc-plots
    """


for _view in VIEWS:
    cli.add_command(_make_view(_view))


@cli.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None, help="YAML config.")
@click.option("--since", default="1d", show_default=True, help="Window start (7d, 2026-11-01, ...).")
@click.option("--until", default=None, help="Window end (default now).")
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
    """
    from slurm_coloc.report import plot as plot_mod

    now = time.time()
    try:
        cfg = config_mod.load(config_path)
        t0, t1 = parse_when(since, now), parse_when(until, now) or now
        flt = views.Filters(since=t0, until=t1, users=users or None, nodes=nodes or None)
        viewer = views.current_viewer(cfg)
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


def main() -> None:
    """Console-script entry point."""
    cli.main(prog_name="coloc-report")
