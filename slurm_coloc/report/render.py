"""Rendering report rows for people (rich tables). The only module that imports rich.

Every string printed goes through ``export.visible`` (control and reordering characters written as visible
escapes) and reaches rich as plain text: table cells as ``rich.text.Text``, lines through ``_say`` with
markup, highlighting and emoji codes off. A job name is the user's text: ESC sequences in it would reach the
admin's terminal, and in a table cell ``[link=...]`` would become a live OSC 8 hyperlink and ``[blink]``
markup.
"""
from __future__ import annotations

import datetime
import shutil
from typing import IO, Callable, Dict, List, Optional, Sequence, Tuple

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from slurm_coloc.report import diagnose
from slurm_coloc.report.export import visible
from slurm_coloc.report.summarize import JobView
from slurm_coloc.units import format_mib

Fmt = Callable[[object], str]


def _duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}"


def _when(ts: Optional[float]) -> str:
    return "-" if ts is None else datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M")


def _num(nd: int, unit: str = "") -> Fmt:
    return lambda v: "-" if v is None else f"{float(v):.{nd}f}{unit}"  # type: ignore[arg-type]


def _pair(a: Optional[float], b: Optional[float]) -> str:
    if a is None and b is None:
        return "-"
    return f"{'-' if a is None else f'{a:.0f}'}/{'-' if b is None else f'{b:.0f}'}"


def _err(j: JobView) -> str:
    if j.estimate_error_mib is None:
        return "-"
    pct = "" if j.estimate_error_pct is None else f" ({j.estimate_error_pct:+.0f}%)"
    return f"{j.estimate_error_mib / 1024:+.1f} GiB{pct}"


def _oom(j: JobView) -> str:
    if j.retry_of:
        return f"retry of {j.retry_of}"
    if not j.oom:
        return "-"
    if j.retry_job_id:
        return f"OOM, retry {j.retry_job_id} {j.retry_outcome or 'pending'}"
    return f"OOM ({j.retry_status or 'not retried'})"


# above this, a plain fixed-width layout (rich measures every cell: seconds for 4000 rows)
RICH_MAX_ROWS = 1000


def _alone(j: JobView) -> str:
    """``0.45x shared`` / ``1.00x alone``: runtime alone (history) over this runtime, and whether it shared.
    """
    if j.rate_vs_alone is None:
        return "-" if j.shared_gpu is None else ("shared" if j.shared_gpu else "alone")
    return f"{j.rate_vs_alone:.2f}x " + ("shared" if j.shared_gpu else "alone")


def terminal_width() -> int:
    """Columns to draw in: ``COLUMNS``, else the terminal's width, else 120 (output to a file or pipe)."""
    return max(40, shutil.get_terminal_size((120, 24)).columns)


def _console(file: Optional[IO[str]]) -> Console:
    return Console(file=file, width=terminal_width())


def _say(console: Console, text: str, style: Optional[str] = None) -> None:
    """Print one line of report text: ``visible``, no markup, highlighting or emoji codes."""
    console.print(visible(text), markup=False, highlight=False, emoji=False, style=style)


def fit_columns(widths: Sequence[int], priority: Sequence[int], width: int) -> List[int]:
    """Indices (in order) of the columns kept so the table fits ``width`` characters (rich's SIMPLE_HEAD box:
    3 characters of padding and rule per column): the lowest ``priority`` go first; the first column always
    stays, even when it alone does not fit.
    """
    keep = list(range(len(widths)))
    for i in sorted(range(1, len(widths)), key=lambda k: priority[k]):
        if sum(widths[k] + 3 for k in keep) <= width:
            break
        keep.remove(i)
    return keep


def _emit(console: Console, title: str, headers: Sequence[str], right: Sequence[bool],
          rows: Sequence[Sequence[str]], priority: Optional[Sequence[int]] = None) -> None:
    """A table that fits the console's width (columns of lowest ``priority`` left out, with a note naming
    them; default: the last columns go first), rich up to ``RICH_MAX_ROWS`` rows, above that plain aligned
    text. Every cell is shown through ``visible``, as plain text (no markup)."""
    rows = [[visible(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    prio = list(priority) if priority is not None else [-i for i in range(len(headers))]
    keep = fit_columns(widths, prio, console.width)
    dropped = [headers[i] for i in range(len(headers)) if i not in keep]
    headers, right, widths = [headers[i] for i in keep], [right[i] for i in keep], [widths[i] for i in keep]
    rows = [[r[i] for i in keep] for r in rows]
    if len(rows) <= RICH_MAX_ROWS:
        table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
        for h, r in zip(headers, right):
            table.add_column(h, justify="right" if r else "left", no_wrap=True, overflow="ellipsis")
        for row in rows:
            table.add_row(*(Text(c) for c in row))
        console.print(table)
    else:
        def line(cells: Sequence[str]) -> str:
            return "  ".join(c.rjust(w) if r else c.ljust(w) for c, w,
                             r in zip(cells, widths, right)).rstrip()

        out = [f"{title} ({len(rows)} rows, plain layout)", line(headers), line(["-" * w for w in widths])]
        out.extend(line(r) for r in rows)
        console.file.write("\n".join(out) + "\n")
    if dropped:
        _say(console, f"left out to fit {console.width} columns: {', '.join(dropped)} (-o/--format picks "
             "columns; COLUMNS=200 widens)", style="dim")


def _plain(key: str, v: object) -> str:
    if v is None:
        return "-"
    if key.endswith("_ts") and isinstance(v, (int, float)):
        return _when(float(v))
    if isinstance(v, float):
        return f"{v:.3f}".rstrip("0").rstrip(".") if abs(v) < 1e6 else f"{v:.0f}"
    if isinstance(v, list):
        return "; ".join(str(x.get("name", x)) if isinstance(x, dict) else str(x) for x in v) or "-"
    return str(v)


def selected_table(view: str, rows: Sequence[Dict[str, object]], cols: Sequence[str], problems: Sequence[str],
                   file: Optional[IO[str]] = None) -> None:
    """A table of the ``-o/--format`` columns (headed by their keys), in the order given, then the problems
    dimmed; ``file`` None: standard output.
    """
    console = _console(file)
    cells = [[_plain(c, r.get(c)) for c in cols] for r in rows]
    right = [bool(rows) and all(isinstance(r.get(c), (int, float)) or r.get(c) is None for r in rows)
             and not c.endswith("_ts") for c in cols]
    _emit(console, f"slurm-coloc {view}", list(cols), right, cells, [len(cols) - i for i in range(len(cols))])
    if not rows:
        console.print("[dim]nothing recorded in this window[/dim]")
    _problems(console, problems)


def jobs_table(jobs: List[JobView], problems: List[str], file: Optional[IO[str]] = None) -> None:
    """Print the per-job table, then each job's waste reasons and notes, then the reading problems (dimmed);
    ``file`` None: standard output.
    """
    console = _console(file)
    headers = ("job id", "user", "GPU(s)", "mode", "request", "estimate", "peak", "est. error", "unused",
               "util.",
               "SM act.", "SM occ.", "GPU-h", "kWh", "state", "OOM/retry", "start", "runtime", "vs alone",
               "finding")
    # which columns stay when the terminal is narrow (higher stays longer)
    priority = (100, 90, 55, 40, 85, 70, 85, 65, 45, 30, 75, 35, 60, 25, 80, 50, 38, 48, 20, 42)
    left = {"user", "GPU(s)", "mode", "state", "OOM/retry", "start", "finding"}
    rows = []
    for j in jobs:
        exit_text = "" if not j.exit_code and not j.signal else f" {j.exit_code}:{j.signal or 0}"
        rows.append((
            str(j.job_id), j.user or "-", j.gpus or j.nodes or "-", j.share_mode or "-",
            format_mib(j.requested_mib),
            format_mib(j.estimate_mib), format_mib(j.peak_mem_mib), _err(j), format_mib(j.unused_mib),
            _num(0)(j.util_mean), _pair(j.smact_mean, j.smact_p95), _pair(j.smocc_mean, j.smocc_p95),
            _num(3)(j.gpu_hours), _num(4)(j.energy_kwh), (j.state or "-") + exit_text, _oom(j),
            _when(j.start_ts),
            _duration(j.runtime_s), _alone(j), j.findings[0]["name"] if j.findings else "-"))
    _emit(console,
          "slurm-coloc jobs (SM act./occ. = mean/p95 %, util. = coarse NVML %, vs alone = runtime alone "
                   "from history / runtime)", headers,
          [h not in left for h in headers], rows, priority)
    for j in jobs:
        if j.watchdog:
            _say(console, f"job {j.job_id} {j.watchdog}")
        for w in j.waste:
            _say(console, f"job {j.job_id} wasteful: {w}")
        if j.findings:
            f = j.findings[0]
            more = (f" (+{len(j.findings) - 1} more: coloc-report advise {j.job_id})"
                    if len(j.findings) > 1 else "")
            _say(console, f"job {j.job_id} {f['name']}: {f['evidence']}. Try: {f['suggestion']}{more}")
    for j in jobs:
        if j.notes:
            _say(console, f"job {j.job_id}: {'; '.join(j.notes)}", style="dim")
    _problems(console, problems)


def advice(job: JobView, notes: Sequence[str], png: Optional[str], file: Optional[IO[str]] = None) -> None:
    """Print ``coloc-report advise``: the job in one line, every finding with evidence and suggestion, the
    notes, and ``png``'s path when given; ``file`` None: standard output.
    """
    console = _console(file)

    def out(text: str, style: Optional[str] = None) -> None:
        _say(console, text, style)

    out(f"job {job.job_id} ({job.user or '?'}, {job.name or '-'}): {job.state or '-'}, ran "
        f"{_duration(job.runtime_s)} "
        f"on {job.gpus or job.nodes or '-'}; request {format_mib(job.requested_mib)}, peak "
        f"{format_mib(job.peak_mem_mib)}; SM activity {_pair(job.smact_mean, job.smact_p95)} % (mean/p95), "
        f"SM occupancy {_pair(job.smocc_mean, job.smocc_p95)} %, tensor "
        f"{'-' if job.tensor_mean is None else f'{job.tensor_mean:.1f}'} %, DRAM "
        f"{'-' if job.dram_mean is None else f'{job.dram_mean:.1f}'} %; batch {job.batch_size or '-'}, "
        f"precision {job.precision or '-'}")
    cpu = diagnose.cpu_of(job)
    out("CPU: " + ("not recorded" if cpu is None else
                   cpu.words() + ("" if job.job_cpu_cores is None
                                  else f", whole job {job.job_cpu_cores:.1f} cores")
                   + f"; mean of {cpu.samples} samples"))
    if not job.findings:
        out("no finding: nothing in the recorded figures points at a problem")
    for i, f in enumerate(job.findings, 1):
        out(f"{i}. {f['name']}: {f['evidence']}")
        out(f"   try: {f['suggestion']}")
    for n in notes:
        out(f"note: {n}", style="dim")
    if png:
        out(f"timeline: {png}")


def _problems(console: Console, problems: Sequence[str]) -> None:
    for p in problems:
        _say(console, f"note: {p}", style="dim")


COLUMNS: Dict[str, List[Tuple[str, str, Fmt]]] = {
    "users": [("user", "user", str), ("jobs", "jobs", str), ("GPU-h", "gpu_hours", _num(3)),
              ("kWh", "energy_kwh", _num(4)), ("util. %", "util_mean", _num(0)),
              ("SM act. %", "smact_mean", _num(0)), ("SM occ. %", "smocc_mean", _num(0)),
              ("unused GiB-h", "unused_gib_hours", _num(2)),
              ("|est. err| %", "estimate_abs_error_pct_mean", _num(0)),
              ("OOMs", "ooms", str), ("wasteful", "wasteful_jobs", str),
              ("no samples", "jobs_without_samples", str)],
    "gpus": [("node", "node", str), ("GPU", "gpu", str), ("jobs", "jobs", str),
             ("busy h", "busy_hours", _num(2)),
             ("jobs/busy GPU", "collocation_factor", _num(2)), ("util. %", "util_mean", _num(0)),
             ("SM act. % mean", "smact_mean", _num(0)), ("p95", "smact_p95", _num(0)),
             ("SM occ. % mean", "smocc_mean", _num(0)), ("p95", "smocc_p95", _num(0)),
             ("mem used mean", "mem_used_mean_mib", lambda v: format_mib(v)),  # type: ignore[arg-type]
             ("max", "mem_used_max_mib", lambda v: format_mib(v)),  # type: ignore[arg-type]
             ("kWh", "energy_kwh", _num(4)), ("sampled h", "sampled_hours", _num(2)),
             ("saturated %", "saturated_pct", _num(0))],
    "nodes": [("node", "node", str), ("GPUs", "gpus", str), ("busy GPU-h", "busy_gpu_hours", _num(2)),
              ("jobs/busy GPU", "collocation_factor", _num(2)), ("util. %", "util_mean", _num(0)),
              ("SM act. %", "smact_mean", _num(0)), ("SM occ. %", "smocc_mean", _num(0)),
              ("kWh", "energy_kwh", _num(4))],
}
TITLES = {"users": "per user", "gpus": "per GPU (sample figures over the window)", "nodes": "per node"}


def rows_table(view: str, rows: Sequence[Dict[str, object]], problems: Sequence[str],
               file: Optional[IO[str]] = None) -> None:
    """Print a ``users``/``gpus``/``nodes`` view (a key of ``COLUMNS``) as a table, then the problems dimmed;
    ``file`` None: standard output.
    """
    console = _console(file)
    _emit(console, f"slurm-coloc {TITLES[view]}", [h for h, _, _ in COLUMNS[view]],
          [key not in ("user", "node") for _, key, _ in COLUMNS[view]],
          [[fmt(r.get(key)) if r.get(key) is not None else "-" for _, key, fmt in COLUMNS[view]]
           for r in rows])
    if not rows:
        console.print("[dim]nothing recorded in this window[/dim]")
    _problems(console, problems)


def cluster_table(row: Dict[str, object], problems: Sequence[str], file: Optional[IO[str]] = None) -> None:
    """Print ``views.cluster_row``'s row as a two-column table, then the problems dimmed; ``file`` None:
    standard output.
    """
    console = _console(file)
    table = Table(title="slurm-coloc cluster summary")
    table.add_column("figure")
    table.add_column("value", justify="right")
    labels = [("jobs", "jobs"), ("users", "users"), ("GPUs with samples or jobs", "gpus"),
              ("GPU-hours held by jobs", "gpu_hours"), ("busy GPU-hours", "busy_gpu_hours"),
              ("collocation factor (jobs per busy GPU)", "collocation_factor"),
              ("coarse utilization % (mean)", "util_mean"), ("SM activity % (mean)", "smact_mean"),
              ("SM occupancy % (mean)", "smocc_mean"), ("GPU energy kWh (counters)", "energy_kwh"),
              ("job energy kWh (attributed)", "job_energy_kwh"), ("OOM deaths", "ooms"),
              ("OOM retries that completed", "oom_retries_completed"), ("wasteful jobs", "wasteful_jobs"),
              ("mean |estimate error| %", "estimate_abs_error_pct_mean")]
    for label, key in labels:
        v = row.get(key)
        table.add_row(label, Text("-" if v is None else visible(str(v))))
    console.print(table)
    _problems(console, problems)
