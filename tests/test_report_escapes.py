"""F7 and the fifth campaign: user text in coloc-report output is shown, never obeyed.

Before: a job name holding ESC ``]0;``/``[2J``, a C1 CSI or U+202E reached the terminal raw through
``advise`` and ``--csv``; in a table cell rich read ``[link=...]`` as markup and wrote a live OSC 8 hyperlink;
a CSV cell ``=HYPERLINK(...)`` was a spreadsheet formula. The cluster side (a real job of colocuser, root's
real ``coloc-report``) is ``tests/cluster/reliability/test_report_escapes.py``.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import re

import pytest

from slurm_coloc.report import export, render
from slurm_coloc.report.summarize import JobView

NAME = "t\x1b]0;pwned\x07\x1b[2J\x9b31m[link=http://evil.example/]x[/link]\u202egnp.exe :skull:"
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _job(**kw: object) -> JobView:
    need = {f.name: None for f in dataclasses.fields(JobView)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}  # type: ignore[misc]
    return JobView(**{**need, "job_id": 7, "user": "colocuser", **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize("raw,shown", [
    ("a\x1b[2Jb", "a\\x1b[2Jb"), ("\x9b31m", "\\x9b31m"), ("x\u202ey", "x\\u202ey"),
    ("t\tn\n", "t\\x09n\\x0a"),
    ("\x00\x7f", "\\x00\\x7f"), ("été ü 中文", "été ü 中文"), ("", ""),
])
def test_visible_writes_controls_and_reorderings_as_escapes(raw: str, shown: str) -> None:
    assert export.visible(raw) == shown


def test_csv_cells_show_escapes_and_quote_formulas() -> None:
    buf = io.StringIO()
    export.to_csv([{"job_id": 1, "name": NAME, "estimate_method": '=HYPERLINK("http://e","x")',
                    "exit_code": -5}], buf)
    assert not RAW.search(buf.getvalue().replace("\n", ""))
    row = next(csv.DictReader(io.StringIO(buf.getvalue())))
    assert row["name"].startswith("t\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m")
    assert row["estimate_method"] == "'=HYPERLINK(\"http://e\",\"x\")" and row["exit_code"] == "-5"


@pytest.mark.parametrize("force_color", ["", "1"])
def test_advise_tables_and_notes_show_user_text_as_text(monkeypatch, force_color: str) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    if force_color:
        monkeypatch.setenv("FORCE_COLOR", "1")
    else:
        monkeypatch.delenv("FORCE_COLOR", raising=False)
    job = _job(name=NAME, state="FAILED", notes=[f"method {NAME}"], waste=[NAME])
    outs = []
    for draw in (lambda f: render.advice(job, [NAME], None, file=f),
                 lambda f: render.selected_table("jobs", [{"job_id": 7, "name": NAME}], ["job_id", "name"],
                                                 [NAME], file=f),
                 lambda f: render.jobs_table([job], [NAME], file=f),
                 lambda f: render.rows_table("users", [{"user": NAME, "jobs": 1}], [], file=f)):
        buf = io.StringIO()
        draw(buf)
        outs.append(buf.getvalue())
    for text in outs:
        plain = re.sub("\x1b\\[[0-9;]*m", "", text)  # rich's own styles when colour is forced
        assert not RAW.search(plain), repr(text)
        assert "\x1b]" not in text and ":skull:" in text, repr(text)  # no OSC (title, link), no emoji
    assert "\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m[link=http://evil.example/]x[/link]\\u202egnp.exe" in outs[0]
    assert "[link=http://evil.example/]x[/link]" in outs[1]
