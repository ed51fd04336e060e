"""A user's coloc comment can neither cost a job its controller record nor set what the record bills (real
SQLite).

The comment is user text: ``hooks/ctld.py`` reads it through ``comment.JobComment`` (a comment with one
integer out of ``comment.values.BOUNDS`` is no annotation at all), and the
minimal record of a failed PrologSlurmctld (``hooks/record.py``) never takes the shards from it. Seen on the
local cluster: ``mem_mib`` 10^20 made the hook and its queued record set fail (``OverflowError``; the set was
set aside and the job kept no user, name or GRES in ``ctld.db``), and with the hook failing, ``"shards": -5``
or ``80`` in the comment became the recorded request of a 1-shard job (coloc-report billed -5 and 80 shards).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_coloc.comment import JobComment
from slurm_coloc.hooks.context import HookContext
from slurm_coloc.hooks.record import record_ops
from slurm_coloc.store import recordset
from slurm_coloc.store.db import open_ctld_db


def _ctx(job: int, comment: str) -> HookContext:
    return HookContext.from_env({"SLURM_JOB_ID": str(job), "SLURM_SCRIPT_CONTEXT": "prolog_slurmctld",
                                 "SLURM_JOB_USER": "colocuser", "SLURM_JOB_UID": "2001",
                                 "SLURM_JOB_NAME": "wrap",
                                 "SLURM_JOB_PARTITION": "debug", "SLURM_JOB_COMMENT": comment})


@pytest.mark.parametrize("coloc, kept", [
    ({"mem_mib": 10 ** 20, "shards": 1}, {}),
    ({"mem_mib": 2 ** 63, "shards": 2 ** 63}, {}),
    ({"mem_mib": -1, "shards": -5, "mode": "shard"}, {}),
    ({"mem_mib": 0, "shards": 0}, {}),
    ({"mem_mib": True, "shards": 2.0}, {}),
    ({"mem_mib": 1500, "shards": 80, "method": "m" * 500}, {}),
    ({"mem_mib": 1500, "shards": 80, "method": "m" * 64, "x": [1e400]}, {"mem_mib": 1500, "shards": 80,
                                                                      "method": "m" * 64}),
])
def test_a_comment_with_a_value_out_of_range_is_no_annotation(coloc: dict, kept: dict) -> None:
    assert JobComment.read("coloc:" + json.dumps(coloc), 5).to_json() == kept


@pytest.mark.parametrize("comment", [
    'coloc:{"mem_mib":100000000000000000000,"shards":1}',
    'coloc:{"v":1,"mode":"shard","shards":-5,"mem_mib":1500}',
    'coloc:{"shards":NaN,"mem_mib":Infinity} coloc:{"shards":80,"mem_mib":81920,"mode":"shard","v":1}',
])
def test_a_failed_prolog_slurmctld_still_records_the_job_and_never_the_comments_shards(tmp_path: Path,
                                                                                   comment: str) -> None:
    """The minimal record set of a failed hook, through JSON as from a spool file, applies to a real
    ``ctld.db`` (before: ``OverflowError`` for 10^20) with the job's user and name and no ``shards_req``
    (before: -5 / 80)."""
    ops = record_ops("prolog-slurmctld", _ctx(19, comment), False, {"error": "database is locked"},
                     1795515829.0, 9.0)
    db = open_ctld_db(tmp_path / "ctld.db")
    recordset.apply_ops(db, json.loads(json.dumps(ops)))
    row = db.execute("SELECT user_name, uid, job_name, shards_req, estimate_mib FROM jobs "
                     "WHERE job_id = 19").fetchone()
    assert row[:4] == ("colocuser", 2001, "wrap", None), row
    assert row[4] in (None, 1500, 81920), row
