"""Attacks on coloc-placer by an ordinary user (``colocuser2``) on a real Slurm cluster with typed shards
(N3, and the fourth campaign in docs/reliability.md). Each test says what happened before the fix.
"""
from __future__ import annotations

import time
from typing import Dict, List

import pytest

from slurm_coloc.placement.daemon import PlacerState
from tests.cluster.test_placement_cluster import cl, run_round, submit_held, typed_cluster  # noqa: F401 - fixtures
from tests.slurm_cluster import Cluster

pytestmark = pytest.mark.slurm
ATTACKER = "colocuser2"
BIG_INT = "9" * 401


def _held_as(cl: Cluster, user: str, comment: str, *opts: str) -> int:  # noqa: F811 - cl is the fixture's type
    out = cl.run(["sbatch", "--parsable", "--hold", "--wrap=sleep 120", "-o", "/dev/null", *opts,
                  "--comment=" + comment], user=user)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip().split(";")[0])


def _rec(cl: Cluster, job: int) -> Dict:  # noqa: F811
    rec = cl.job(job)
    assert rec is not None
    return rec


BAD_COMMENTS = [
    # N3 as reported
    'coloc:{"place":true,"shards":2,"spec":{"batch_size":1,"input_shape":[' + BIG_INT + ']}}',
    'coloc:{"place":true,"shards":2,"flops_per_step":NaN}',  # N10: a NaN prediction
    'coloc:{"place":true,"shards":2,"spec":{"batch_size":1048576,"input_shape":[16777216,16777216,16777216]}}',
    'coloc:{"place":true,"shards":' + "9" * 30 + '}',  # before: Gres=shard:g0:999... handed to scontrol
    'coloc:{"place":"true","shards":2}',
]


def test_bad_comments_never_stop_a_round_and_their_jobs_stay_as_their_user_held_them(cl: Cluster) -> None:  # noqa: F811
    """N3: before, the first comment made every round fail ("int too large to convert to float") and every
    other user's held job waited for the fallback timer. Now each bad comment is no annotation (one log line):
    the job is no candidate, stays user-held and untouched, and the victim's job is placed in the same
    round."""
    bad = [_held_as(cl, ATTACKER, c) for c in BAD_COMMENTS]
    victim = submit_held(cl, 2)  # colocuser, submitted after the attacker's jobs
    counts = run_round(cl, PlacerState())
    assert counts["errors"] == 0 and counts["candidates"] == 1 and counts["placed"] == 1, counts
    cl.wait_state(victim, ("RUNNING",), 40)
    for job, comment in zip(bad, BAD_COMMENTS):
        rec = _rec(cl, job)
        assert rec["job_state"] == "PENDING" and rec["state_reason"] == "JobHeldUser", rec
        assert rec["comment"] == comment and not rec["tres_per_node"]  # nothing was written to it
    log = cl.run(["coloc-placer", "run", "--rounds", "1"],
                 user=None)  # the daemon's own log: one line per job
    assert log.returncode == 0, log.stderr
    for job in bad:
        assert log.stderr.count(f"job {job}: coloc comment ignored") == 1, log.stderr


def test_words_in_a_comment_never_become_options_of_roots_scontrol(cl: Cluster) -> None:  # noqa: F811
    """Fourth campaign: the placer writes the user's comment back with ``scontrol update ... Comment=<text>``
    (the wait note). Option-like words, a newline and ``|`` in it stay text: the job's GRES, nodes and
    partition are unchanged, and the note keeps the user's text after its one ``|``."""
    texts = ["x NodeList=n2 Gres=gpu:g0:1 Partition=nope TimeLimit=UNLIMITED Priority=1000000",
             "a\nNodeList=n2\nGres=gpu:2", "coloc-wait:fake|Gres=gpu:1 |"]
    jobs = [_held_as(cl, ATTACKER, t + ' coloc:{"place":true,"shards":200}')
            for t in texts]  # fits no GPU: waits
    before = {j: _rec(cl, j) for j in jobs}
    counts = run_round(cl, PlacerState())
    assert counts["waiting"] == 3 and counts["errors"] == 0, counts
    for job, text in zip(jobs, texts):
        rec = _rec(cl, job)
        assert rec["state_reason"] == "JobHeldAdmin" and not rec["tres_per_node"], rec
        assert rec["partition"] == before[job]["partition"] and rec["time_limit"] == before[job]["time_limit"]
        assert not rec.get("required_nodes") and rec["priority"] == before[job]["priority"]
        assert rec["comment"].startswith("coloc-wait:no GPU has 200 free shards")
        tail = ' coloc:{"place":true,"shards":200}'
        assert rec["comment"].split("|", 1)[1] == text.split("|", 1)[1] + tail \
            if text.startswith("coloc-wait:") else rec["comment"].endswith(text + tail)


def test_a_flood_of_held_jobs_does_not_starve_a_later_users_job(cl: Cluster) -> None:  # noqa: F811
    """Fourth campaign: 25 held jobs of colocuser2 that fit no GPU, all older than colocuser's job: the victim
    is placed in the first round (each job is decided on its own; a waiting job takes nothing from later
    ones)."""
    flood: List[int] = [_held_as(cl, ATTACKER, 'coloc:{"place":true,"shards":500}') for _ in range(25)]
    time.sleep(1)
    victim = submit_held(cl, 2)
    t0 = time.monotonic()
    counts = run_round(cl, PlacerState())
    took = time.monotonic() - t0
    assert counts["placed"] == 1 and counts["waiting"] == 25 and counts["errors"] == 0, counts
    cl.wait_state(victim, ("RUNNING",), 40)
    print(f"round with 25 waiting + 1 placed: {took:.1f} s")
    assert all(_rec(cl, j)["job_state"] == "PENDING" for j in flood)


def test_a_wait_note_slurm_refuses_is_tried_once_not_every_round(cl: Cluster) -> None:  # noqa: F811
    """Fourth campaign: a user comment of ~1,000 characters leaves no room for the placer's wait note (Slurm
    refuses a comment over 1,024 characters): before, the update was retried and warned about in every
    round."""
    job = _held_as(cl, ATTACKER, "x" * 960 + ' coloc:{"place":true,"shards":200}')
    state = PlacerState()
    first = run_round(cl, state)
    second = run_round(cl, state)
    assert first["errors"] == 1, first  # Slurm refused the note once
    assert first["waiting"] == 1 and second["waiting"] == 1 and second["errors"] == 0, (first, second)
    assert _rec(cl, job)["state_reason"] == "JobHeldAdmin"
