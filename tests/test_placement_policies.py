"""The placement-policy seam (``placement/policies.py``): a policy is one object with a name and a pure
``decide(Evidence) -> Decision``, and every list of policy names (the config's ``placement_policy`` choices,
the placer's round, coloc-replay's modes, the placement simulator) reads the registry. A test-only policy,
registered here, goes through each of them; an unknown name is one ConfigError line listing the registered
ones; a wait says why in a typed field (``Decision.hold``), never only in words."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest
from click.testing import CliRunner

from slurm_coloc import config as config_mod
from slurm_coloc.config import sections
from slurm_coloc.errors import ConfigError
from slurm_coloc.placement import intensity, policies
from slurm_coloc.placement.policies import (
    Activity,
    Decision,
    Evidence,
    Gate,
    GpuState,
    Hold,
    Limits,
    Policy,
    Profile,
    Tenant,
    no_room,
)
from slurm_coloc.placement.rounds import PlacerState, Round
from slurm_coloc.slurm.jobinfo import parse_squeue_json

NOW = 1000.0
DATA = Path(__file__).parent / "data" / "carma"


class MostFree(Policy):
    """Test only: the first GPU with the most free shards (memory alone)."""

    name = "most-free"

    def decide(self, ev: Evidence) -> Decision:
        fits = [g for g in ev.gpus if g.shards_free >= ev.shards]
        if not fits:
            return no_room(ev.gpus, ev.shards)
        best = max(fits, key=lambda g: g.shards_free)  # max keeps the first of equals
        return Decision(best.node, best.index, f"{best.node}/gpu{best.index} (most free)", "most-free")


@pytest.fixture
def most_free() -> Iterator[Policy]:
    policy = policies.register(MostFree())
    try:
        yield policy
    finally:
        policies.unregister(policy.name)


def _gpus() -> List[GpuState]:
    """GPU 0 busy (40 of 80 shards), GPU 1 emptier (8 used), GPU 2 as empty as GPU 1 but later."""
    return [GpuState("n1", 0, 80, 40, 2, Activity(0.2), 1.0), GpuState("n1", 1, 80, 8, 1, Activity(0.9), 1.0),
            GpuState("n1", 2, 80, 8, 1, Activity(0.1), 1.0)]


def test_the_builtin_policies_are_the_config_s_names() -> None:
    assert set(policies.names()) == {"gate", "throughput"} == set(sections.PLACEMENT_POLICIES)
    assert policies.get("gate").sharing_model is False and policies.get("throughput").sharing_model is True


def test_config_accepts_a_registered_policy_and_names_the_registered_ones_for_an_unknown(
        tmp_path: Path, most_free: Policy) -> None:
    path = tmp_path / "coloc.yaml"
    path.write_text("placement_policy: most-free\n")
    assert config_mod.load(str(path), environ={}).placement_policy == "most-free"
    path.write_text("placement_policy: fastest\n")
    with pytest.raises(ConfigError) as err:
        config_mod.load(str(path), environ={})
    line = str(err.value)
    assert "\n" not in line and "placement_policy" in line and "'fastest'" in line
    assert all(n in line for n in ("throughput", "gate", "most-free")), line
    with pytest.raises(ConfigError, match="'fastest' is not one of gate, throughput, most-free"):
        policies.get("fastest")


def test_an_unregistered_policy_is_no_longer_valid(tmp_path: Path) -> None:
    policies.register(MostFree())
    policies.unregister("most-free")
    path = tmp_path / "coloc.yaml"
    path.write_text("placement_policy: most-free\n")
    with pytest.raises(ConfigError, match="placement_policy"):
        config_mod.load(str(path), environ={})
    assert "most-free" not in policies.names() and "most-free" not in sections.PLACEMENT_POLICIES


def _held_job() -> Any:
    comment = "coloc:" + json.dumps({"mode": "shard", "shards": 4, "v": 1, "place": True, "sha256": "c" * 64})
    return parse_squeue_json(json.dumps({"jobs": [{"job_id": 9, "job_state": "PENDING", "user_id": 2001,
                                                  "submit_time": NOW - 5, "comment": comment}]}))[0]


def test_the_placer_s_round_decides_and_steers_with_the_configured_policy(
        monkeypatch: pytest.MonkeyPatch, most_free: Policy) -> None:
    from slurm_coloc.placement import rounds

    cfg = config_mod.Config(placement_policy="most-free")
    rnd = Round(cfg, PlacerState(), intensity.load_calibration(), Gate(), _gpus(), [], True, NOW)
    assert rnd.policy is most_free
    d = rnd.decide(_held_job(), 4).decision
    assert (d.node, d.index, d.basis) == ("n1", 1, "most-free")
    steered: List[tuple] = []
    monkeypatch.setattr(rounds.sp, "steer",
                        lambda job_id, node, index, *_a: steered.append((job_id, node, index)))
    counts: Dict[str, int] = {"placed": 0, "waiting": 0, "memory_only": 0, "errors": 0}
    rnd.handle(_held_job(), 4, counts)
    assert counts["placed"] == 1 and steered == [(9, "n1", 1)]
    # the steered job counts on its GPU for the rest of the round: next, GPU 2 has the most free shards
    assert rnd.decide(_held_job(), 4).decision.index == 2
    # the gate on the same GPUs spreads by load instead: GPU 2 (SMACT 0.1 live), not GPU 1 (0.9)
    gate_rnd = Round(config_mod.Config(placement_policy="gate"), PlacerState(), intensity.load_calibration(),
                     Gate(), _gpus(), [], True, NOW)
    assert gate_rnd.decide(_held_job(), 4).decision.index == 2


def test_a_wait_says_why_in_a_typed_field() -> None:
    full = [GpuState("n1", 0, 80, 78, 3, Activity(0.9, 0.9, 0.9), 1.0)]
    gate = Gate()
    ev = Evidence(full, [[]], 4, Activity(0.5), Activity(0.5), lambda _m: Profile(0.5, 60.0, 5.0), True,
                  None, NOW, Limits(gate, max_slowdown=1.5, capacity=lambda _m: 1.0))
    for name in ("gate", "throughput"):
        d = policies.get(name).decide(ev)
        assert not d.placed and d.hold is Hold.NO_ROOM and d.reason.startswith("no GPU has 4 free shards")
    room = [GpuState("n1", 0, 80, 8, 1, Activity(0.9, 0.9, 0.9), 1.0)]
    tenant = Tenant(Profile(0.9, 600.0, 5.0), NOW - 100, 0.9, 1)
    ev = Evidence(room, [[tenant]], 4, Activity(0.9, 0.5, 0.5), Activity(0.9), lambda _m: Profile(0.9),
                  True, None, NOW, Limits(gate, max_slowdown=1.5, capacity=lambda _m: 1.0, floor=0.7))
    assert policies.get("gate").decide(ev).hold is Hold.SATURATED
    assert policies.get("throughput").decide(ev).hold is Hold.AT_BOUND
    nodata = Evidence(ev.gpus, ev.tenants, 4, ev.demand, ev.counted, ev.profile, False, None, NOW, ev.limits)
    assert policies.get("throughput").decide(nodata).hold is Hold.UNKNOWN_AT_BOUND


def test_coloc_replay_runs_a_registered_policy(monkeypatch: pytest.MonkeyPatch, most_free: Policy,
                                               tmp_path: Path) -> None:
    from slurm_coloc.cli import replay as cli_replay
    from slurm_coloc.placement.heartbeat import write_heartbeat
    from slurm_coloc.replay import runner
    from slurm_coloc.replay.metrics import summarize
    from slurm_coloc.replay.trace import build_tasks

    assert "most-free" in runner.modes() and runner.placer_policy("most-free") == "most-free"
    assert runner.placer_policy("aware") == "gate" and runner.placer_policy("blind") is None
    task = build_tasks(DATA / "traces" / "philly_mix-first-12.csv", DATA / "workload_catalog_from_rad.csv",
                       DATA / "exclusive_run_summary.csv", 1.0, 0.001)[0]
    assert runner.sbatch_argv(task, "most-free", "/j.sh", "/o/%j.out")[-1] == f"replay-most-free-{task.index}"
    cfg = config_mod.Config(state_dir=str(tmp_path / "s"), run_dir=str(tmp_path / "r"))
    write_heartbeat(cfg, {"placed": 0, "policy": "gate"})
    assert runner._placer_problems("most-free", cfg) == [
        "the running coloc-placer's placement_policy is gate, not most-free: this pass measured the former"]
    ran: List[str] = []

    def fake_replay(tasks: Any, mode: str, *_a: Any, **_k: Any) -> runner.ReplayRun:
        ran.append(mode)
        return runner.ReplayRun(summarize(mode, len(tasks), [], None, None), [], {})

    monkeypatch.setattr(runner, "run_replay", fake_replay)
    monkeypatch.setattr(config_mod, "load", lambda *_a, **_k: cfg)
    args = ["run", "--trace", str(DATA / "traces" / "philly_mix-first-12.csv"),
            "--catalog", str(DATA / "workload_catalog_from_rad.csv"),
            "--runtimes", str(DATA / "exclusive_run_summary.csv"), "--max-tasks", "2",
            "--job-script", str(Path(__file__)), "--out-dir", str(tmp_path), "--json"]
    out = CliRunner().invoke(cli_replay.cli, [*args, "--mode", "most-free"])
    assert out.exit_code == 0, out.output
    assert ran == ["most-free"] and json.loads(out.output)["most-free"]["tasks"] == 2
    ran.clear()
    out = CliRunner().invoke(cli_replay.cli, [*args, "--mode", "all"])
    assert out.exit_code == 0, out.output
    assert ran == ["exclusive", "blind", "gate", "throughput", "most-free"]
    assert "change_most-free" in json.loads(out.output)
    assert "most-free" in CliRunner().invoke(cli_replay.cli, ["run", "--help"]).output


def test_the_placement_simulator_runs_a_registered_policy(most_free: Policy) -> None:
    from benchmarks import placement_sim as sim

    assert sim.all_policies() == ("exclusive", "blind", "gate", "throughput", "most-free")
    jobs = [sim.Job(i, "w", 0.0, 20, 0.4, 1.0, 5.0) for i in range(4)]
    r = sim.simulate("most-free", jobs, 2, 80, 1.0, 2.0, (0.0, 0.0))
    assert r["policy"] == "most-free" and sorted(r["placement"].values()) == [0, 0, 1, 1]
