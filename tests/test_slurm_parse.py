"""Parsers of Slurm 22.05.8 output, fed verbatim recordings from tests/data/slurm-22.05/ (README there)."""
from __future__ import annotations

from pathlib import Path
from typing import Dict

import pytest

from slurm_coloc.errors import SlurmError
from slurm_coloc.hooks.context import final_state, infer_final_state
from slurm_coloc.slurm.jobinfo import JobInfo, expand_std_path, job_info_from_json, parse_squeue_json
from slurm_coloc.slurm.parse import (
    decode_exit_code,
    expand_hostlist,
    gres_detail_counts,
    parse_index_list,
    parse_sbatch_parsable,
    parse_tres_per_node,
)

DATA = Path(__file__).parent / "data" / "slurm-22.05"


def _forged() -> Dict[int, JobInfo]:
    return {j.job_id: j
            for j in parse_squeue_json((DATA / "squeue_json_forged.json").read_text(), now=1795511000)}


def _scontrol_fields(line: str, *keys: str) -> Dict[str, str]:
    """Values of ``keys`` in a recorded scontrol line, cut at the next known key (test-side reading only)."""
    out = {}
    for key in keys:
        start = line.index(f" {key}=") + len(key) + 2
        ends = [line.index(f" {k}=", start) for k in ("StdErr", "StdIn", "StdOut", "Power")
                if f" {k}=" in line[start:]]
        out[key] = line[start:min(ends)] if ends else line[start:].split()[0]
    return out


def test_squeue_json_recording():
    jobs = parse_squeue_json((DATA / "squeue_json_running.json").read_text())
    by_id = {j.job_id: j for j in jobs}
    j1 = by_id[1]
    assert j1.comment == 'coloc={"a":1}' and j1.tres_per_node == "gres:shard:5" and j1.shards == 5
    assert gres_detail_counts(list(j1.gres_detail)) == [("shard", "", {0: 5})]
    assert j1.user_name == "colocuser" and j1.uid == 2001 and j1.gid == 2001 and j1.state == "RUNNING"
    assert j1.stdout_path == j1.stderr_path == "/tmp/coloc-cluster/jobs/1.out"  # scontrol's StdOut/StdErr
    assert j1.stdin_path == "/dev/null" and j1.time_limit_s == 365 * 86400 and j1.node_names == ("n1",)
    assert j1.array_job_id is None and j1.array_task_id is None and j1.slurm_ref == "1"


def test_forged_job_name_cannot_stand_for_tres_per_node():
    """``-J "x TresPerNode=gres:shard:79"`` on a 2-shard job: scontrol's line carries the text, JobInfo keeps
    it in the name and reads 2 shards."""
    line = (DATA / "scontrol_show_job_o_forged.txt").read_text().splitlines()[0]
    assert "JobName=x TresPerNode=gres:shard:79 UserId=" in line  # the attack as Slurm printed it
    job = _forged()[160]
    assert job.name == "x TresPerNode=gres:shard:79" and job.gres == {"shard": 2} and job.shards == 2
    assert job.state == "RUNNING"


def test_newline_and_forged_state_in_name_and_work_dir_stay_opaque():
    text = (DATA / "scontrol_show_job_o_forged.txt").read_text()
    assert "JobName=nl\nTresPerNode=gres:shard:80 JobState=FAILED UserId=" in text  # scontrol cut the line
    jobs = _forged()
    nl, d = jobs[161], jobs[162]
    assert (nl.name == "nl\nTresPerNode=gres:shard:80 JobState=FAILED" and nl.shards == 2
            and nl.state == "RUNNING")
    assert d.name == "D JobState=FAILED" and d.shards == 3 and d.state == "RUNNING" and d.exit_code == 0
    assert d.work_dir == "/tmp/h1-probe/jobs/w JobState=FAILED TresPerNode=gres:shard:79"


def test_expanded_paths_equal_scontrols():
    """%j, %x (a name with spaces), %u, %A/%a outside and inside an array, a relative -e: as scontrol
    printed."""
    jobs = _forged()
    lines = (DATA / "scontrol_show_job_o_forged.txt").read_text().split("\nJobId=")
    line_162 = next("JobId=" + ln if not ln.startswith("JobId=") else ln for ln in lines if "162 " in ln[:12])
    want = _scontrol_fields(line_162, "StdErr", "StdIn", "StdOut")
    got = jobs[162]
    assert (got.stderr_path, got.stdin_path, got.stdout_path) == (want["StdErr"], want["StdIn"],
                                                                  want["StdOut"])
    for line in (DATA / "scontrol_show_job_o_array.txt").read_text().splitlines():
        job_id = int(line.split()[0].split("=")[1])
        want = _scontrol_fields(line, "StdErr", "StdOut")
        job = jobs[job_id]
        assert (job.stderr_path, job.stdout_path) == (want["StdErr"], want["StdOut"])
        assert f"ArrayJobId={job.array_job_id} ArrayTaskId={job.array_task_id} " in line
    assert jobs[164].slurm_ref == "163_0" and jobs[163].slurm_ref == "163_1"  # 163 alone names both tasks


def test_array_task_fields_from_the_recording():
    job = _forged()[164]
    assert (job.array_job_id, job.array_task_id, job.mem_per_node_mib, job.min_cpus_per_node) == (163, 0, 100,
                                                                                                  2)
    assert job.time_limit_s is None  # no --time: the partition's (UNLIMITED)


def test_default_output_paths_as_slurm_names_them():
    base = {"job_id": 7, "current_working_directory": "/w", "user_name": "u", "name": "n"}
    assert job_info_from_json(base).stdout_path == "/w/slurm-7.out"
    arr = job_info_from_json({**base, "array_job_id": 5, "array_task_id": 2})
    assert arr.stdout_path == arr.stderr_path == "/w/slurm-5_2.out"
    assert expand_std_path("o-%A-%a-%j-%u-%x", 7, None, None, "u", "n", "/w") == "/w/o-7-4294967294-7-u-n"
    assert expand_std_path("/abs/%j", 7, None, None, "u", "n", "/w") == "/abs/7"


def test_run_time_and_final_state_from_json():
    j = {"job_id": 9, "job_state": "COMPLETING", "start_time": 100, "end_time": 166, "time_limit": 1,
         "exit_code": 15, "state_reason": "None"}
    job = job_info_from_json(j)
    assert (job.run_s, job.time_limit_s, job.exit_code, job.signal) == (66, 60, 0, 15)
    assert final_state(job) == ("TIMEOUT", "inferred")
    assert final_state(job_info_from_json({**j, "exit_code": 768})) == ("FAILED", "inferred")
    assert job_info_from_json({**j, "job_state": "RUNNING"}, now=130).run_s == 30
    assert job_info_from_json({**j, "time_limit": 4294967295}).time_limit_s is None  # INFINITE


@pytest.mark.parametrize("text, expected", [
    ("n1", ["n1"]), ("n1,n3", ["n1", "n3"]), ("n[1-2]", ["n1", "n2"]),
    ("gpu[01-02,05]", ["gpu01", "gpu02", "gpu05"]), ("a[1-2]b,c", ["a1b", "a2b", "c"]),
    ("n[1-3,5],gpu[01-02]", ["n1", "n2", "n3", "n5", "gpu01", "gpu02"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("/dev/nvidia[0-1]", ["/dev/nvidia0", "/dev/nvidia1"]),
    ("", []), ("gpu[08-10]", ["gpu08", "gpu09", "gpu10"]),
])
def test_expand_hostlist(text, expected):
    assert expand_hostlist(text) == expected


@pytest.mark.parametrize("bad", ["n[1-2", "n1-2]", "n[a-b]", "n[3-1]", "n[1-99999999]", "n[[1]]"])
def test_expand_hostlist_refuses_bad_lists(bad):
    with pytest.raises(SlurmError):
        expand_hostlist(bad)


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
    # the shell's child died of the SIGTERM first and the shell exited 128+15 (CI, 22.05 under load): a
    # time-out stays TIMEOUT (Slurm's final state), a cancel CANCELLED; an OOM-killed child (137) FAILED
    (("COMPLETING", 143, 0, 66, 60, "TimeLimit"), "TIMEOUT"),
    (("COMPLETING", 1, 0, 66, 60, "TimeLimit"), "TIMEOUT"),
    (("COMPLETING", 143, 0, 61, 60, "None"), "TIMEOUT"),
    (("COMPLETING", 143, 0, 5, 600, "None"), "CANCELLED"),
    (("COMPLETING", 130, 0, 5, 600, "None"), "CANCELLED"),
    (("COMPLETING", 137, 0, 5, 600, "None"), "FAILED"),
    (("COMPLETING", 142, 0, 5, 600, "None"), "FAILED"),
    (("COMPLETED", 0, 0, 5, 600, ""), "COMPLETED"),
])
def test_infer_final_state(args, expected):
    assert infer_final_state(*args) == expected
