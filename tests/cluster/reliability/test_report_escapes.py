"""F7 on the real cluster: escape sequences in a job's name and in its comment's ``method`` never
reach an admin's terminal raw (``coloc-report advise``, the jobs table, ``--csv``), nor become rich markup.

An ordinary user (colocuser) submits with plain sbatch: ``-J`` holding ESC ``]0;`` (terminal title), ESC
``[2J`` (clear screen), a C1 CSI (``\\x9b``), a right-to-left override (U+202E) and rich markup
(``[link=...]``); ``--comment`` with the same in ``method``. Root then reads the reports. Before: the bytes
came out raw in ``advise`` and ``--csv``, and in a table cell the markup became an OSC 8 hyperlink.
"""
from __future__ import annotations

import csv
import io
import json
import re

import pytest

from tests.cluster.reliability.conftest import FaultCluster

pytestmark = pytest.mark.slurm
NAME = "t\x1b]0;pwned\x07\x1b[2J\x9b31m[link=http://evil.example/]x[/link]\u202egnp.exe"
METHOD = "an\x1b[31mred\x1b]8;;http://evil.example/\x07"
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")  # newline and tab are layout


def test_escapes_in_job_names_and_methods_are_shown_not_obeyed(fc: FaultCluster) -> None:
    comment = "coloc:" + json.dumps({"v": 1, "mode": "shard", "shards": 2, "mem_mib": 1500, "method": METHOD})
    proc = fc.c.run(["sbatch", "--parsable", "-w", "n1", "--gres=shard:2", "-t", "2", "-J", NAME,
                     f"--comment={comment}", "-o", "/dev/null", "--wrap", "true"])
    assert proc.returncode == 0, proc.stderr
    job = int(proc.stdout.strip().split(";")[0])
    assert fc.c.wait_job(job)["job_state"] == "COMPLETED"
    fc.wait_hooks(job)
    row = fc.rows(fc.c.ctld_db, "SELECT job_name, estimate_method FROM jobs WHERE job_id = ?", (job,))
    assert row == [{"job_name": NAME, "estimate_method": METHOD}], row  # stored verbatim
    env = {"COLUMNS": "250", "FORCE_COLOR": "1"}  # rich styles on, as on a terminal
    outs = {
        "advise": fc.c.run(["coloc-report", "advise", str(job)], user=None, env=env),
        "table": fc.c.run(["coloc-report", "jobs", "--since", "1d", "--job", str(job), "-o",
                           "job_id,name,estimate_method"], user=None, env=env),
        "csv": fc.c.run(["coloc-report", "jobs", "--since", "1d", "--job", str(job), "--csv", "-o",
                         "job_id,name,estimate_method"], user=None),
    }
    for what, out in outs.items():
        assert out.returncode == 0, (what, out.stderr)
        text = out.stdout
        assert not RAW.search(re.sub("\x1b\\[[0-9;]*m", "", text)), (what, repr(text))  # only rich's own SGR
        assert "\x1b]" not in text and "evil.example/\x1b" not in text, (what, repr(text))  # no OSC, no link
    assert "\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m" in outs["advise"].stdout
    assert "[link=http://evil.example/]x[/link]" in outs["table"].stdout  # shown as text, not a link
    rows = list(csv.DictReader(io.StringIO(outs["csv"].stdout)))
    assert rows[0]["name"].startswith("t\\x1b]0;pwned") and rows[0]["estimate_method"] == (
        "an\\x1b[31mred\\x1b]8;;http://evil.example/\\x07"), rows
