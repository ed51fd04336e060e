"""Rendering report rows for people (rich tables). The only module that imports rich."""
from __future__ import annotations

import datetime
from typing import IO, List, Optional

from rich.console import Console
from rich.table import Table

from slurm_coloc.report.summarize import JobView
from slurm_coloc.units import format_mib


def _duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}"


def _when(ts: Optional[float]) -> str:
    return "-" if ts is None else datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def jobs_table(jobs: List[JobView], problems: List[str], file: Optional[IO[str]] = None) -> None:
    """Print the per-job table (and any problems, dimmed, below it)."""
    console = Console(file=file, width=160)
    table = Table(title="slurm-coloc jobs", show_lines=False)
    for col in ("job id", "user", "name", "node", "GPU(s)", "shards", "mode", "estimate", "state", "exit",
                "start", "runtime"):
        table.add_column(col, justify="right" if col in ("job id", "shards", "estimate", "exit") else "left")
    for j in jobs:
        exit_text = "-" if j.exit_code is None else (f"{j.exit_code}" + (f":{j.signal}" if j.signal else ""))
        est = format_mib(j.estimate_mib) + (f" ({j.estimate_method})" if j.estimate_method else "")
        table.add_row(str(j.job_id), j.user or "-", j.name or "-", j.nodes or "-", j.gpus or "-",
                      "-" if j.shards is None else str(j.shards), j.share_mode or "-", est, j.state or "-",
                      exit_text, _when(j.start_ts), _duration(j.runtime_s))
    console.print(table)
    for p in problems:
        console.print(f"[dim]note: {p}[/dim]")
