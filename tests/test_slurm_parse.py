"""Parsers of Slurm 22.05.8 output, fed verbatim recordings from tests/data/slurm-22.05/."""
from __future__ import annotations

from pathlib import Path

import pytest

from slurm_coloc.errors import SlurmError
from slurm_coloc.hooks.state import infer_final_state, parse_exit_pair, parse_slurm_duration_s
from slurm_coloc.slurm.parse import (
    decode_exit_code, parse_gres_detail, parse_index_list, parse_sbatch_parsable, parse_scontrol_kv,
    parse_squeue_json, parse_tres_per_node,
)

DATA = Path(__file__).parent / "data" / "slurm-22.05"


def test_scontrol_running_shard_job():
    kv = parse_scontrol_kv((DATA / "scontrol_show_job_o_running_shard.txt").read_text())
    assert kv["JobId"] == "1" and kv["JobState"] == "RUNNING"
    assert kv["TresPerNode"] == "gres:shard:5"
    assert kv["StdErr"] == "/tmp/coloc-cluster/jobs/1.out"
    assert kv["UserId"] == "colocuser(2001)"


def test_scontrol_planted_fields_in_comment_do_not_override():
    line = ("JobId=5 JobName=x JobState=COMPLETING Reason=None ExitCode=0:0 WorkDir=/w "
            "Comment=hi JobState=COMPLETED StdErr=/etc/shadow StdErr=/home/u/e.txt StdIn=/dev/null "
            "StdOut=/home/u/o.txt TresPerNode=gres:shard:2")
    kv = parse_scontrol_kv(line)
    assert kv["JobState"] == "COMPLETING"  # before Comment: first wins
    assert kv["StdErr"] == "/home/u/e.txt"  # after Comment: last wins


def test_squeue_json_recording():
    jobs = parse_squeue_json((DATA / "squeue_json_running.json").read_text())
    by_id = {j.job_id: j for j in jobs}
    j1 = by_id[1]
    assert j1.comment == 'coloc={"a":1}' and j1.tres_per_node == "gres:shard:5"
    assert parse_gres_detail(list(j1.gres_detail)) == [("shard", 5, [0])]
    assert j1.user_name == "colocuser" and j1.state == "RUNNING"


def test_squeue_json_garbage():
    with pytest.raises(SlurmError, match="invalid JSON"):
        parse_squeue_json("not json")
    with pytest.raises(SlurmError, match="no 'jobs'"):
        parse_squeue_json("{}")


def test_sbatch_parsable():
    assert parse_sbatch_parsable((DATA / "sbatch_parsable.txt").read_text()) == (6, None)
    assert parse_sbatch_parsable("12;cluster\n") == (12, "cluster")
    with pytest.raises(SlurmError):
        parse_sbatch_parsable("Submitted batch job 12")


@pytest.mark.parametrize("text, expected", [("0", [0]), ("0-2,5", [0, 1, 2, 5]), ("", []), ("N/A", [])])
def test_index_list(text, expected):
    assert parse_index_list(text) == expected


def test_tres_per_node():
    assert parse_tres_per_node("gres:shard:5") == {"shard": 5}
    assert parse_tres_per_node("gres:gpu:a100:2,gres:shard:3") == {"gpu": 2, "shard": 3}
    assert parse_tres_per_node("") == {}


def test_exit_codes_from_facts():
    assert decode_exit_code(768) == (3, 0)
    assert decode_exit_code(9) == (0, 9)
    assert parse_exit_pair("0:15") == (0, 15) and parse_exit_pair("x") == (None, None)


def test_epilog_recording_shows_completing():
    """The recording that motivates infer_final_state: every epilog saw COMPLETING."""
    text = (DATA / "epilog_states.txt").read_text()
    states = [ln.split("=")[1] for ln in text.splitlines() if ln.startswith("JobState=")]
    assert states and set(states) == {"COMPLETING"}
    assert "Reason=TimeLimit" in text


@pytest.mark.parametrize("args, expected", [
    (("COMPLETING", 0, 0, 10, 600, "None"), "COMPLETED"),
    (("COMPLETING", 3, 0, 10, 600, "None"), "FAILED"),
    (("COMPLETING", 0, 15, 3, 600, "None"), "CANCELLED"),
    (("COMPLETING", 0, 0, 66, 60, "TimeLimit"), "TIMEOUT"),
    (("COMPLETING", 0, 15, 61, 60, "None"), "TIMEOUT"),
    # 22.05 under load: the Prolog's delay counts in RunTime; Slurm records COMPLETED (jobcomp), so do we
    (("COMPLETING", 0, 0, 60, 60, "None"), "COMPLETED"),
    (("COMPLETING", 0, 0, 68, 60, "None"), "COMPLETED"),
    (("COMPLETING", 0, 9, 5, 600, "None"), "FAILED"),
    (("COMPLETED", 0, 0, 5, 600, ""), "COMPLETED"),
])
def test_infer_final_state(args, expected):
    assert infer_final_state(*args) == expected


def test_durations():
    assert parse_slurm_duration_s("00:01:06") == 66
    assert parse_slurm_duration_s("365-00:00:00") == 365 * 86400
    assert parse_slurm_duration_s("UNLIMITED") is None
