"""coloc-report's output conventions on real SQLite files (the ``state`` fixture of tests/test_report.py):
tables that fit the terminal, ``-o/--format`` column selection, CSV with a header even when empty and ISO 8601
times, Slurm's time forms for ``--since``/``--until`` and an end before the start refused."""
from __future__ import annotations

import csv
import datetime
import io
import json
from pathlib import Path

import pytest

from slurm_coloc.report import export, query, views
from slurm_coloc.report.query import parse_when, parse_window
from tests.test_report import T0, _cfg, _report, state  # noqa: F401 - the fixture

NOW = datetime.datetime(2026, 11, 26, 7, 30, 0).timestamp()  # local time, as Slurm's forms are


def test_column_lists_match_the_rows_each_view_writes(state: Path) -> None:  # noqa: F811
    cfg = _cfg(state)
    for view in query.VIEWS:
        rows = query.collect(cfg, query.Query(view=view), views.Viewer("root", True)).rows
        assert rows, view
        for r in rows:
            assert tuple(r) == export.VIEW_COLUMNS[view], view


@pytest.mark.slow
@pytest.mark.parametrize("cols", [80, 100, 120])
def test_tables_fit_the_terminal_width(state: Path, cols: int) -> None:  # noqa: F811
    for view in ("jobs", "users", "gpus", "nodes", "cluster"):
        out = _report(state, view, env={"COLUMNS": str(cols)})
        assert out.returncode == 0, out.stderr
        table = out.stdout.split("\nnote:")[0].split("\njob ")[0]  # the table, before the per-job lines
        widest = max(len(line) for line in table.splitlines())
        assert widest <= cols, (view, cols, widest, table)
    jobs = _report(state, env={"COLUMNS": "100"}).stdout
    assert "left out to fit 100 columns:" in jobs and "job id" in jobs and "peak" in jobs
    wide = _report(state, env={"COLUMNS": "260"}).stdout
    assert "left out to fit" not in wide and "vs alone" in wide


@pytest.mark.slow
def test_format_selects_columns_in_table_csv_and_json(state: Path) -> None:  # noqa: F811
    out = _report(state, "-o", "jobid,user,shards,peak_mib", "--csv")
    assert out.returncode == 0, out.stderr
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    assert list(rows[0]) == ["job_id", "user", "shards", "peak_mem_mib"] and rows[0]["job_id"] == "11"
    data = json.loads(_report(state, "--format", "job_id,state", "--json").stdout)["jobs"]
    assert data[1] == {"job_id": 12, "state": "FAILED"}
    table = _report(state, "-o", "user,job_id", env={"COLUMNS": "80"}).stdout
    header = next(line for line in table.splitlines() if "job_id" in line)
    assert header.split() == ["user", "job_id"]
    bad = _report(state, "-o", "jobid,nope")
    lines = bad.stderr.strip().splitlines()
    assert bad.returncode != 0 and len(lines) == 1 and "'nope'" in lines[0] and "peak_mem_mib" in lines[0]
    assert _report(state, "users", "-o", "shards").returncode != 0  # a jobs column in the users view


def test_csv_has_a_header_when_empty_and_iso_times(state: Path) -> None:  # noqa: F811
    empty = _report(state, "--csv", "--user", "nobody")
    assert empty.returncode == 0 and empty.stdout.splitlines() == [",".join(export.JOB_COLUMNS)]
    for view in ("users", "gpus", "nodes"):
        out = _report(state, view, "--csv", "--since", f"@{T0 + 99999}")
        assert out.stdout.splitlines()[0] == ",".join(export.VIEW_COLUMNS[view]), view
    row = next(csv.DictReader(io.StringIO(_report(state, "--csv").stdout)))
    start = datetime.datetime.fromisoformat(row["start_ts"])
    assert start.tzinfo is not None and start.timestamp() == T0


def test_slurm_time_forms() -> None:
    midnight = datetime.datetime(2026, 11, 26).timestamp()
    assert parse_when("now-7days", NOW) == NOW - 7 * 86400
    assert parse_when("now-2hours", NOW) == NOW - 7200
    assert parse_when("now+30minutes", NOW) == NOW + 1800 and parse_when("now-90", NOW) == NOW - 90
    assert parse_when("today", NOW) == midnight == parse_when("midnight", NOW)
    assert parse_when("tomorrow", NOW) == datetime.datetime(2026, 11, 27).timestamp()
    assert parse_when("noon", NOW) == datetime.datetime(2026, 11, 25,
                                                        12).timestamp()  # still to come: yesterday
    assert parse_when("06:15", NOW) == datetime.datetime(2026, 11, 26, 6, 15).timestamp()
    assert parse_when("2026-11-01", NOW) == datetime.datetime(2026, 11, 1).timestamp()
    assert parse_when("2026-11-01T10:00", NOW) == datetime.datetime(2026, 11, 1, 10).timestamp()
    assert parse_when("2026-11-01T10:00:30", NOW) == datetime.datetime(2026, 11, 1, 10, 0, 30).timestamp()
    assert parse_when("7d", NOW) == NOW - 7 * 86400  # the short forms stay
    for bad in ("now-7lightyears", "25:00", "yesterday-ish", "now--1days"):
        with pytest.raises(Exception, match="invalid time"):
            parse_when(bad, NOW)


def test_end_before_start_is_one_error_line(state: Path) -> None:  # noqa: F811
    with pytest.raises(Exception, match="before --since"):
        parse_window("today", "now-2days", NOW)
    assert parse_window("now-2days", "today", NOW) == (NOW - 2 * 86400,
                                                       datetime.datetime(2026, 11, 26).timestamp())
    out = _report(state, "users", "--since", "now-1hours", "--until", "now-2hours")
    assert (out.returncode != 0 and len(out.stderr.strip().splitlines()) == 1
            and "before --since" in out.stderr)
    assert out.stdout == ""
    ok = _report(state, "--json", "-S", f"@{T0 - 10}", "-E", "now")
    assert ok.returncode == 0 and len(json.loads(ok.stdout)["jobs"]) == 4
