"""coloc-replay: replay a CARMA/Philly trace through coloc-sbatch, exclusive and collocated, and compare."""

from __future__ import annotations

import functools
import json
import logging
import sys
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import click

from slurm_coloc import config as config_mod
from slurm_coloc.cli import version_option
from slurm_coloc.errors import ColocError
from slurm_coloc.replay.metrics import compare
from slurm_coloc.replay.trace import Task, build_tasks

MODE_SETS = ("both", "all")  # both = exclusive + coloc; all = exclusive, blind and every registered policy


def _modes() -> List[str]:
    """Every replay mode (``replay.runner.modes``: Slurm's, ``aware``, the registered placement policies)."""
    from slurm_coloc.replay.runner import modes

    return list(modes())


def _mode_set(mode: str) -> List[str]:
    """The modes ``--mode`` runs, one after the other."""
    from slurm_coloc.placement import policies

    if mode == "both":
        return ["exclusive", "coloc"]
    return ["exclusive", "blind", *policies.names()] if mode == "all" else [mode]


class _ModeChoice(click.Choice):
    """``--mode``'s choices, read when used: a policy registered after this module was imported is one."""

    def __init__(self) -> None:
        super().__init__(())

    @property  # type: ignore[override]
    def choices(self) -> Sequence[str]:
        return (*_modes(), *MODE_SETS)

    @choices.setter
    def choices(self, _value: Sequence[str]) -> None:
        """``click.Choice.__init__`` assigns choices; the registry is their one source: dropped."""


@dataclass(frozen=True)
class TraceArgs:
    """The trace options that ``plan`` and ``run`` share (``_trace_options`` collects them into one)."""

    trace: str
    catalog: str
    runtimes: str
    time_scale: float
    work_scale: float
    max_tasks: Optional[int]
    first_task: int

    def tasks(self) -> List[Task]:
        """The scaled tasks of the trace (``build_tasks``)."""
        return build_tasks(
            Path(self.trace),
            Path(self.catalog),
            Path(self.runtimes),
            self.time_scale,
            self.work_scale,
            self.max_tasks,
            self.first_task,
        )


@contextmanager
def _click_errors() -> Iterator[None]:
    """Turn a ColocError raised inside the block into a one-line click error."""
    try:
        yield
    except ColocError as exc:
        raise click.ClickException(str(exc)) from None


def _csv_option(name: str, help_text: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A required option naming an input CSV file."""
    return click.option(name, required=True, type=click.Path(dir_okay=False), help=help_text)


def _trace_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Add the trace options to a command and hand them to it as one ``trace_args: TraceArgs``."""
    names = [fl.name for fl in fields(TraceArgs)]

    @functools.wraps(f)
    def wrapper(**kwargs: Any) -> Any:
        trace_args = TraceArgs(**{n: kwargs.pop(n) for n in names})
        return f(trace_args=trace_args, **kwargs)

    opts = [
        _csv_option("--trace", "trace CSV (task_index,submit_time_s,gap_from_previous_s,task_rad)"),
        _csv_option("--catalog", "workload_catalog_from_rad.csv"),
        _csv_option("--runtimes", "exclusive_run_summary.csv (reference exclusive runtimes)"),
        click.option(
            "--time-scale", type=float, default=0.01, show_default=True, help="multiply submit times by this"
        ),
        click.option(
            "--work-scale",
            type=float,
            default=0.001,
            show_default=True,
            help="multiply each task's reference exclusive runtime by this",
        ),
        click.option("--max-tasks", type=int, default=None, help="replay only this many tasks"),
        click.option(
            "--first-task", type=int, default=0, show_default=True, help="skip the tasks before this row"
        ),
    ]
    decorated: Callable[..., Any] = wrapper
    for o in reversed(opts):
        decorated = o(decorated)
    return decorated


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@version_option("coloc-replay")
def cli() -> None:
    """Replay a trace of training tasks through coloc-sbatch, exclusive and collocated, and compare the runs.

    Example: coloc-replay plan --trace philly_mix-90-tasks.csv --catalog workload_catalog_from_rad.csv
    --runtimes exclusive_run_summary.csv --max-tasks 10
    """


@cli.command()
@_trace_options
@click.option("--json", "as_json", is_flag=True, help="print the tasks as JSON")
def plan(trace_args: TraceArgs, as_json: bool) -> None:
    """Print the scaled tasks (workload, steps, memory request, submit offset); submit nothing.

    Example: coloc-replay plan --trace t.csv --catalog c.csv --runtimes r.csv --time-scale 0.01
    --work-scale 0.001

    \f
    Args:
        trace_args: the trace options (``--trace``, ``--catalog``, ``--runtimes``, scales, task range).
        as_json: ``--json``: print the tasks as JSON (``submit_s``, ``work_s`` in s, ``mem_mib`` in MiB).

    Raises:
        click.ClickException: a trace file that cannot be read or used (one line, exit 1).
    """
    with _click_errors():
        tasks = trace_args.tasks()
    if as_json:
        click.echo(json.dumps([asdict(t) for t in tasks], indent=1))
        return
    click.echo(
        f"{'task':>4} {'submit s':>9} {'work s':>8} {'steps':>7} {'mem MiB':>8}  workload  (rad; note)"
    )
    for t in tasks:
        click.echo(
            f"{t.index:>4} {t.submit_s:>9.1f} {t.work_s:>8.1f} {t.steps:>7} {t.mem_mib or '-':>8}  "
            f"{t.workload}  ({t.rad}{'; ' + t.note if t.note else ''})"
        )
    click.echo(
        f"{len(tasks)} tasks, {sum(t.work_s for t in tasks):.0f} s of scaled exclusive work, "
        f"last submit at {max(t.submit_s for t in tasks):.0f} s"
    )


@cli.command()
@_trace_options
@click.option(
    "--job-script",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="batch script run as: <script> <workload> --steps N --tag T (benchmarks/device/job_generic.sh)",
)
@click.option(
    "--mode",
    type=_ModeChoice(),
    default="both",
    show_default=True,
    help="placement policy: exclusive (whole GPUs), blind (= coloc: memory-only packing), gate (= aware: "
         "held for a coloc-placer with placement_policy gate), throughput (held for a coloc-placer with "
         "placement_policy throughput: packs under the slowdown bound), or any other registered placement "
         "policy (held for a coloc-placer running it); both = exclusive + coloc, all = exclusive, blind and "
         "every placement policy (restart the placer with the next policy between them: a mismatch is "
         "reported as a problem)",
)
@click.option(
    "--out-dir",
    default=".",
    show_default=True,
    type=click.Path(file_okay=False),
    help="where the jobs' output files go",
)
@click.option(
    "--deadline-s",
    type=float,
    default=600.0,
    show_default=True,
    help="per mode: cancel what is still running this long after the first submission",
)
@click.option(
    "--context-mib",
    type=int,
    default=1024,
    show_default=True,
    help="coloc mode: added to each task's catalog peak (CUDA context and workspaces)",
)
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON")
def run(
    trace_args: TraceArgs,
    job_script: str,
    mode: str,
    out_dir: str,
    deadline_s: float,
    context_mib: int,
    as_json: bool,
) -> None:
    """Submit the tasks through coloc-sbatch under each policy asked (one after the other) and report
    makespan, mean and p95 job completion time, p95 slowdown vs alone, mean SM activity, GPU energy and OOM
    reruns. ``aware`` needs a running ``coloc-placer`` and typed shards (docs/design.md, "Placement
    mechanism").

    Example: coloc-replay run --trace t.csv --catalog c.csv --runtimes r.csv --max-tasks 8
    --job-script benchmarks/device/job_generic.sh --mode all --json

    \f
    Args:
        trace_args: the trace options (``--trace``, ``--catalog``, ``--runtimes``, scales, task range).
        job_script: ``--job-script``; mode: ``--mode``; out_dir: ``--out-dir``.
        deadline_s: ``--deadline-s``: per mode, seconds after the first submission before cancelling.
        context_mib: ``--context-mib``: added to each task's catalog peak (MiB).
        as_json: ``--json``: print the result as JSON.

    Raises:
        click.ClickException: a trace file that cannot be used or a submission that failed (one line, exit 1).
    """
    logging.basicConfig(level=logging.INFO, format="coloc-replay: %(message)s", stream=sys.stderr)
    with _click_errors():
        result = _replay_modes(trace_args, _mode_set(mode), job_script, out_dir, deadline_s,
                               context_mib)
    _add_changes(result)
    if as_json:
        click.echo(json.dumps(result, indent=1))
        return
    _print_result(result)


def _replay_modes(
    trace_args: TraceArgs, modes: List[str], job_script: str, out_dir: str, deadline_s: float,
    context_mib: int
) -> Dict[str, Any]:
    """Replay the trace under each mode of ``modes`` in turn: ``{"tasks", "time_scale", "work_scale",
    "context_mib", <mode>: {metrics..., "problems", "jobs"}}``.

    Raises ColocError for a bad config or trace (``config.load``, ``TraceArgs.tasks``).
    """
    from slurm_coloc.replay.runner import run_replay

    cfg = config_mod.load()
    tasks = trace_args.tasks()
    result: Dict[str, Any] = {
        "tasks": len(tasks),
        "time_scale": trace_args.time_scale,
        "work_scale": trace_args.work_scale,
        "context_mib": context_mib,
    }
    for m in modes:
        rr = run_replay(
            tasks,
            m,
            cfg,
            str(Path(job_script).resolve()),
            str(Path(out_dir).resolve()),
            deadline_s,
            context_mib=context_mib,
        )
        result[m] = {
            **rr.metrics.as_dict(),
            "problems": rr.problems,
            "jobs": {str(t): j for t, j in rr.job_of_task.items()},
            "runs": rr.per_task,
        }
    return result


def _add_changes(result: Dict[str, Any]) -> None:
    """Add to ``result`` each policy's change against the exclusive run: ``change`` (coloc) and
    ``change_<mode>`` (percent per metric, ``replay.metrics.compare``)."""
    if "exclusive" in result and "coloc" in result:
        result["change"] = compare(result["exclusive"], result["coloc"])
    for m in _modes():
        if m not in ("exclusive", "coloc") and "exclusive" in result and m in result:
            result[f"change_{m}"] = compare(result["exclusive"], result[m])


RESULT_KEYS = [
    "tasks",
    "completed",
    "lost",
    "oom_retries",
    "makespan_s",
    "mean_jct_s",
    "mean_wait_s",
    "p95_jct_s",
    "p95_slowdown",
    "max_slowdown",
    "max_run_slowdown",
    "mean_smact_pct",
    "energy_j",
]


def _print_result(result: Dict[str, Any]) -> None:
    """Print the replay result as a table (one column per mode), SM activity per GPU and the changes."""
    modes = [m for m in _modes() if m in result]
    click.echo(f"{'':<16}" + "".join(f"{m:>14}" for m in modes))
    for k in RESULT_KEYS:
        vals = [result[m].get(k) for m in modes]
        click.echo(
            f"{k:<16}" + "".join(f"{v:>14.1f}" if isinstance(v, float) else f"{str(v):>14}" for v in vals)
        )
    for m in modes:
        per = result[m].get("smact_pct_per_gpu") or {}
        if per:
            click.echo(f"{m} SM activity per GPU %: " + ", ".join(
                f"{g} {'-' if v is None else f'{v:.1f}'}" for g, v in per.items()))
    for name in ["change", *(f"change_{m}" for m in _modes() if m not in ("exclusive", "coloc"))]:
        for k, v in (result.get(name) or {}).items():
            label = "coloc" if name == "change" else name.split("_", 1)[1]
            click.echo(f"{label} {k}: {'-' if v is None else f'{v:+.1f}%'}")


def main() -> int:
    """Console entry point."""
    try:
        cli.main(standalone_mode=False)
    except click.ClickException as exc:
        click.echo(f"coloc-replay: error: {exc.format_message()}", err=True)
        return 2
    except click.exceptions.Abort:
        return 1
    return 0
