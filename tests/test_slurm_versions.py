"""The Slurm-facing parsers on verbatim recordings of every supported release (tests/data/slurm-<version>/:
22.05.8's openapi v0.0.38, 24.11.5's data_parser v0.0.42, 26.05.5's v0.0.45; docs/slurm-versions.md)."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Dict

import pytest

from slurm_coloc.hooks.context import INFERRED, SLURM, final_state
from slurm_coloc.slurm.jobinfo import job_info_from_json, parse_job_json, parse_squeue_json
from slurm_coloc.slurm.parse import exit_pair, gres_detail_counts, job_state, number, parse_tres_per_node
from slurm_coloc.slurm.placement import gpu_holdings
from slurm_coloc.slurm.run import SlurmVersion, parse_release, version_from_meta

DATA = Path(__file__).parent / "data"
VERSIONS = ["22.05", "24.11", "26.05"]
NEWER = ["24.11", "26.05"]
RELEASES = {"22.05": "22.05.8", "24.11": "24.11.5", "26.05": "26.05.5"}
# What each recorded job did (scripts/record_slurm.sh) and the state Slurm gave it.
CASES = {"completed": "COMPLETED", "failed": "FAILED", "killed": "FAILED", "cancelled": "CANCELLED",
         "timeout": "TIMEOUT", "uid": "COMPLETED"}


def _kv(text: str, key: str) -> str:
    """The value of ``key`` in a recorded ``scontrol show job`` text (test-side reading of admin-set keys)."""
    m = re.search(rf"(?:^|\s){key}=(\S*)", text)
    assert m, key
    return m.group(1)


def _env(path: Path) -> Dict[str, str]:
    return dict(ln.split("=", 1) for ln in path.read_text().splitlines() if "=" in ln)


@pytest.mark.parametrize("version", VERSIONS)
def test_running_shard_job_reads_the_same_on_every_version(version: str) -> None:
    d = DATA / f"slurm-{version}"
    jobs, found = parse_job_json((d / "squeue_json_running.json").read_text(), now=1795511600)
    assert found is not None and found.release == RELEASES[version]
    j = next(x for x in jobs if x.job_id == 1)
    assert (j.state, j.state_flags, j.name, j.user_name, j.uid, j.gid) == ("RUNNING", (), "small",
                                                                           "colocuser",
                                                                           2001, 2001)
    assert j.gres == {"shard": 5} and j.shards == 5 and j.slurm_release == RELEASES[version]
    assert gres_detail_counts(list(j.gres_detail)) == [("shard", "", {0: 5})]
    assert gpu_holdings(j) == [("n1", 0, "shard", 5)]
    assert (j.exit_code, j.signal, j.time_limit_s, j.node_names) == (0, 0, 365 * 86400, ("n1",))
    assert j.comment == 'coloc={"a":1}' and j.array_job_id is None and j.array_task_id is None
    assert j.start_ts and j.submit_ts and j.start_ts >= j.submit_ts and isinstance(j.run_s,
                                                                                   int) and j.run_s >= 0
    assert j.stdout_path.endswith("/jobs/1.out") and "%" not in j.stdout_path + j.stderr_path


@pytest.mark.parametrize("version", NEWER)
def test_output_paths_equal_scontrols(version: str) -> None:
    """24.11 gives them expanded, 26.05 as the pattern (plus ``*_expanded``): both equal scontrol's."""
    d = DATA / f"slurm-{version}"
    j = next(x for x in parse_squeue_json((d / "squeue_json_running.json").read_text()) if x.job_id == 1)
    text = (d / "scontrol_show_job_o_running_shard.txt").read_text()
    assert (j.stdout_path, j.stderr_path) == (_kv(text, "StdOut"), _kv(text, "StdErr"))
    raw = dict(j.raw)
    for k in ("stdout_expanded", "stderr_expanded", "stdin_expanded"):
        raw.pop(k, None)  # without 26.05's expanded fields the 22.05 expansion gives the same paths
    again = job_info_from_json(raw)
    assert (again.stdout_path, again.stderr_path) == (j.stdout_path, j.stderr_path)


@pytest.mark.parametrize("version", NEWER)
def test_scontrol_json_equals_squeue_json(version: str) -> None:
    d = DATA / f"slurm-{version}"
    a = parse_squeue_json((d / "scontrol_show_job_json_running_shard.json").read_text(), now=1)
    b = [x for x in parse_squeue_json((d / "squeue_json_running.json").read_text(), now=1)
         if x.job_id == a[0].job_id]
    assert len(a) == 1 and a[0] == b[0]


@pytest.mark.parametrize("version", NEWER)
@pytest.mark.parametrize("hook", ["epilog", "epilog_slurmctld"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_epilogs_read_slurms_final_state(version: str, hook: str, case: str) -> None:
    """Inside both epilogs 24.11+ give the final state as ``job_state[0]`` (COMPLETING is a flag): recorded as
    Slurm's, not inferred; the exit pair matches the hook's ``SLURM_JOB_EXIT_CODE2`` where Slurm sets it."""
    d = DATA / f"slurm-{version}" / "hook_env"
    env = _env(d / f"{hook}-{case}.env")
    jobs = parse_squeue_json((d / f"{hook}-{case}.json").read_text())
    job = next(j for j in jobs if j.job_id == int(env["SLURM_JOB_ID"]))
    assert job.state_flags == ("COMPLETING",) and job.completing
    assert final_state(job, env) == (CASES[case], SLURM)
    if case in ("completed", "failed", "killed", "uid"):
        code, _, sig = env["SLURM_JOB_EXIT_CODE2"].partition(":")
        assert (job.exit_code, job.signal) == (int(code), int(sig))
    if case == "timeout":
        assert job.time_limit_s == 60 and job.reason == "TimeLimit"


def test_22_05_epilogs_still_infer() -> None:
    """22.05's JSON says COMPLETING in the epilogs: the state is inferred (and settled later)."""
    j = {"job_id": 9, "job_state": "COMPLETING", "start_time": 100, "end_time": 166, "time_limit": 1,
         "exit_code": 15, "state_reason": "None"}
    job = job_info_from_json(j)
    assert job.completing and job.state_flags == () and final_state(job) == ("TIMEOUT", INFERRED)


@pytest.mark.parametrize("version", NEWER)
def test_gres_detail_per_device_form(version: str) -> None:
    text = (DATA / f"slurm-{version}" / "scontrol_show_job_od_running_shard.txt").read_text()
    assert gres_detail_counts([_kv(text, "GRES")]) == [("shard", "", {0: 5})]
    assert parse_tres_per_node(_kv(text, "TresPerNode")) == {"shard": 5}
    for line in (DATA / f"slurm-{version}" / "shards.txt").read_text().splitlines():
        if line.startswith("JobId=") and " GRES=" in line:
            assert gres_detail_counts([_kv(line, "GRES")]) == [("shard", "", {0: 5})]


@pytest.mark.parametrize("entries, expected", [
    (["shard:5(IDX:0)"], [("shard", "", {0: 5})]),
    (["shard:5(5/80,0/80)"], [("shard", "", {0: 5})]),
    (["shard:80(0/80,80/80)"], [("shard", "", {1: 80})]),
    (["shard:10(5/80,5/80)"], [("shard", "", {0: 5, 1: 5})]),  # MULTIPLE_SHARING_GRES_PJ
    (["shard:g0:4(IDX:0),shard:g1:0(IDX:)"], [("shard", "g0", {0: 4}), ("shard", "g1", {})]),
    (["shard:g1:3(0/80,3/80)"], [("shard", "g1", {1: 3})]),
    (["gpu:2(IDX:0-1)"], [("gpu", "", {0: 2, 1: 2})]),
    (["gpu:1(IDX:0)", "nonsense", "shard:1(x)"], [("gpu", "", {0: 1})]),
])
def test_gres_detail_counts(entries, expected) -> None:
    assert gres_detail_counts(entries) == expected


@pytest.mark.parametrize("value, expected", [
    (5, 5), ({"set": True, "infinite": False, "number": 5}, 5),
    ({"set": False, "infinite": False, "number": 0},
                                                                  None),
    ({"set": True, "infinite": True, "number": 0}, None), (4294967295, None), (4294967294, None),
    (True, None),
    ("5", None), (None, None),
])
def test_number(value, expected) -> None:
    assert number(value) == expected


def test_exit_and_state_forms() -> None:
    assert exit_pair(768) == (3, 0) and exit_pair(9) == (0, 9) and exit_pair(None) == (None, None)
    killed = {"status": ["SIGNALED"], "return_code": {"set": False, "infinite": False, "number": 0},
              "signal": {"id": {"set": True, "infinite": False, "number": 9}, "name": "KILL"}}
    assert exit_pair(killed) == (0, 9) and exit_pair({"status": []}) == (None, None)
    assert job_state("RUNNING") == ("RUNNING", ()) and job_state(["FAILED", "COMPLETING"]) == ("FAILED",
                                                                                              ("COMPLETING",))
    assert job_state([]) == ("", ()) and job_state(7) == ("", ())
    # normalised once where JobInfo is built (first word, upper case): hooks compare JobInfo.state as it is
    assert job_state("timeout extra") == ("TIMEOUT", ()) and job_state([" failed", "completing"]) == \
        ("FAILED", ("COMPLETING",)) and job_state("  ") == ("", ())
    assert job_info_from_json({"job_id": 1, "job_state": "cancelled"}).final
    assert not job_info_from_json({"job_id": 1, "job_state": ["COMPLETING"]}).final


@pytest.mark.parametrize("version", VERSIONS)
def test_version_from_every_output(version: str) -> None:
    d = DATA / f"slurm-{version}"
    v = version_from_meta(json.loads((d / "squeue_json_running.json").read_text())["meta"])
    assert v is not None and v.release == RELEASES[version] and v.tested
    assert v.json_job_query == (version != "22.05")
    if (d / "scontrol_show_config.txt").exists():
        line = next(ln for ln in (d / "scontrol_show_config.txt").read_text().splitlines()
                    if ln.startswith("SLURM_VERSION"))
        assert parse_release(line.split("=", 1)[1]) == v


def test_parse_release() -> None:
    assert parse_release("slurm 22.05.8") == SlurmVersion(22, 5, 8)
    assert parse_release("slurm-wlm 24.11.5\n") == SlurmVersion(24, 11, 5)
    assert parse_release("nothing") is None
    assert not SlurmVersion(23, 11, 1).json_job_query and not SlurmVersion(23, 11, 1).tested
