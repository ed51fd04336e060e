"""``benchmarks/placement_split_estimate.py``: the two-GPU split of a blind pass, and bad input files."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import placement_split_estimate as pse


def blind_pass(ready_s: float, ends_s: list) -> dict:
    return {"jobs": [{"submit_ts": 100.0, "end_ts": 100.0 + e, "bench": {"t0": 100.0 + ready_s}}
                     for e in ends_s]}


def test_split_is_start_up_plus_half_of_blind_computing() -> None:
    makespan, ready, split = pse.split_estimate(blind_pass(20.0, [100.0, 120.0]))
    assert (makespan, ready, split) == (120.0, 20.0, 70.0)


@pytest.mark.parametrize("text", ["not json", json.dumps({"jobs": []}), json.dumps({"jobs": [{"x": 1}]}),
                                  json.dumps([1, 2])])
def test_bad_pass_file_is_one_line_and_exit_1_and_writes_nothing(tmp_path: Path, text: str,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "mix-blind.json"
    bad.write_text(text)
    good = tmp_path / "good-blind.json"
    good.write_text(json.dumps(blind_pass(20.0, [100.0, 120.0])))
    assert pse.main([str(bad), str(good)]) == 1
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and str(bad) in err
    assert "| 120 | 20.0 | 70.0 | 0.58 |" in out  # the good file still gets its row
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good-blind.json", "mix-blind.json"]
