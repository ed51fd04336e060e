"""F2: the OOM rerun carries every confinement of the job's record or is refused with the reason.

Pure tests on ``squeue --json`` entries of the shapes Slurm prints: the 22.05 values below were read from a
real 22.05 cluster (a held job submitted with ``--reservation=rtres --exclude=n1 -C 'fa&fb' -L lic:1
--wckey=wk --exclusive --mem-per-cpu=100 --gres=shard:2``); 26.05's are its number objects and lists, with
``shared: []`` as a real 26.05 ``--exclusive`` job prints it (26.05's JSON does not say "exclusive"). The
cluster side (the rerun inside the reservation, never on the excluded node) is
``tests/cluster/reliability/test_rerun_confinement.py``.
"""
from __future__ import annotations

from typing import Any, Dict

import pytest

from slurm_coloc.config import Config
from slurm_coloc.errors import ColocError
from slurm_coloc.hooks import rerun
from slurm_coloc.slurm.jobinfo import confinement_of, job_info_from_json, refusal

CONFINED_2205: Dict[str, Any] = {
    "job_id": 1, "name": "wrap", "partition": "debug", "current_working_directory": "/w",
    "resv_name": "rtres", "excluded_nodes": "n1", "required_nodes": "", "qos": "", "features": "fa&fb",
    "licenses": "lic:1", "wckey": "wk", "shared": "none", "contiguous": False, "memory_per_cpu": 100,
    "memory_per_node": None, "tres_per_node": "gres:shard:2", "tres_per_task": "", "tres_per_job": "",
    "cpus_per_tres": "", "memory_per_tres": "", "burst_buffer": "", "het_job_id": 0, "account": "",
}


def _n(v: int) -> Dict[str, Any]:
    return {"set": True, "infinite": False, "number": v}


CONFINED_2605: Dict[str, Any] = {
    **CONFINED_2205, "job_id": _n(9), "shared": [], "memory_per_cpu": _n(100),
    "memory_per_node": {"set": False, "infinite": False, "number": 0}, "tres_per_node": "gres/shard:2",
    "het_job_id": _n(0), "qos": "normal", "account": "proj", "required_nodes": "n2", "prefer": "fb",
    "selinux_context": "", "container": "/c/bundle",
}


def _args(j: Dict[str, Any]) -> list:
    return rerun.retry_sbatch_args(job_info_from_json(j), Config(gpu_mem_gib=80))


def test_the_2205_record_of_a_confined_job_gives_every_confinement() -> None:
    args = _args(CONFINED_2205)
    for word in ("--reservation=rtres", "--exclude=n1", "--constraint=fa&fb", "--licenses=lic:1",
                 "--wckey=wk", "--exclusive", "--mem-per-cpu=100M", "--gres=shard:80"):
        assert word in args, (word, args)
    assert not any(a.startswith(("--qos", "--nodelist", "--account", "--prefer")) for a in args), args


def test_the_2605_record_carries_qos_account_nodes_prefer_and_container() -> None:
    args = _args(CONFINED_2605)
    for word in ("--reservation=rtres", "--exclude=n1", "--nodelist=n2", "--qos=normal", "--account=proj",
                 "--prefer=fb", "--container=/c/bundle", "--mem-per-cpu=100M", "--gres=shard:80"):
        assert word in args, (word, args)
    assert not any(a.startswith("--context") for a in args)
    assert "--exclusive" not in args  # the known gap: 26.05's record does not tell (docs/reliability.md A14)
    assert "--exclusive" in _args({**CONFINED_2605, "shared": ["user"]})  # a list that does say it


def test_other_gres_per_node_ride_along_with_the_whole_gpu() -> None:
    j = {**CONFINED_2205, "tres_per_node": "gres:shard:2,gres:nic:1,gres/fpga:xl:2"}
    assert [a for a in _args(j) if a.startswith("--gres")] == ["--gres=shard:80,nic:1,fpga:xl:2"]
    typed = {**CONFINED_2205, "tres_per_node": "gres/shard:g0:2"}
    assert [a for a in _args(typed) if a.startswith("--gres")] == ["--gres=shard:80"]


@pytest.mark.parametrize("field,value,words", [
    ("tres_per_task", "gres:gpu:1", "tres_per_task gpu:1"),
    ("tres_per_job", "gres/shard:4", "tres_per_job shard:4"),
    ("tres_per_socket", "gres:nic:1", "tres_per_socket nic:1"),
    ("cpus_per_tres", "gres:gpu:4", "cpus_per_tres gres:gpu:4"),
    ("memory_per_tres", "gres:shard:1000", "memory_per_tres gres:shard:1000"),
    ("burst_buffer", "#DW jobdw capacity=1GB", "a burst buffer"),
    ("het_job_id", 7, "heterogeneous job"),
])
def test_what_cannot_be_carried_refuses_the_rerun_with_the_reason(field: str, value: Any, words: str) -> None:
    job = job_info_from_json({**CONFINED_2205, field: value})
    why = rerun.rerun_refusal(job)
    assert why is not None and words in why and why.endswith("not rerun") and "\n" not in why
    with pytest.raises(ColocError, match="could not carry"):
        rerun.retry_sbatch_args(job, Config(gpu_mem_gib=80))


def test_unset_spellings_are_not_carried_and_cpu_per_task_is_not_a_refusal() -> None:
    j = {**CONFINED_2205, "resv_name": "(null)", "wckey": "*default", "features": None, "shared": None,
         "tres_per_task": "cpu:2", "licenses": "  "}
    c = confinement_of(j)
    assert c.options == ("--exclude=n1",) and refusal(c) is None


def test_values_stay_one_argv_word_whatever_they_hold() -> None:
    """A value Slurm recorded is passed as the option's value: spaces, ``=`` and a leading ``-`` stay
    inside the one word (no shell; sbatch reads ``--opt=value`` as one option)."""
    j = {**CONFINED_2205, "features": "a b --uid=0", "licenses": "-x"}
    args = _args(j)
    assert "--constraint=a b --uid=0" in args and "--licenses=-x" in args
    assert not any(a.startswith("--uid") for a in args)
