"""Estimator robustness: data-dependent reads, model outputs of many kinds, one-line errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from slurm_coloc.errors import EstimateError
from slurm_coloc.estimate import ModelSpec, estimate_peak

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "slurm_coloc.cli.estimate"]

USER_FILE = textwrap.dedent('''
    import torch

    def gpt2():
        from transformers import GPT2Config, GPT2LMHeadModel
        return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=500, n_positions=64,
                                          use_cache=False, bos_token_id=0, eos_token_id=0))

    class _Net(torch.nn.Module):
        def __init__(self, kind):
            super().__init__()
            self.kind = kind
            self.fc = torch.nn.Linear(8, 4)

        def forward(self, x):
            y = self.fc(x)
            if self.kind == "dict":
                return {"aux": None, "logits": y}
            if self.kind == "tuple":
                return ((y, y.detach()), x)
            if self.kind == "item":  # data-dependent reads of every kind
                if torch.isnan(y).any():
                    raise ValueError("nan")
                assert (x.abs() >= 0).all()
                return y * (1 + int(x.sum().item()))
            if self.kind == "none":
                return None
            raise RuntimeError("boom\\nsecond line")

    def net(kind="dict"):
        return _Net(kind)
''')


@pytest.fixture()
def user_dir(tmp_path: Path) -> Path:
    (tmp_path / "usermodels.py").write_text(USER_FILE)
    return tmp_path


def _spec(user_dir: Path, name: str, shape: tuple, kwargs: dict | None = None, **kw: object) -> ModelSpec:
    return ModelSpec(f"usermodels.py:{name}", shape, 4, kwargs=dict(kwargs or {}), base_dir=str(user_dir),
                     **kw)  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "amp-fp16"])
def test_hf_gpt2_user_file_reports_assumed_values(user_dir: Path, precision: str) -> None:
    pytest.importorskip("transformers")
    est = estimate_peak(_spec(user_dir, "gpt2", (32,), input_dtype="int64", optimizer="adamw",
                              precision=precision), "H100")
    assert 612 < est.mem_mib < 5000
    if precision == "fp32":  # the packed-sequence check: all() answered True, once per step
        assert est.detail["assumed_values"] == 2
        assert est.detail["assumed_values_by_kind"] == {"all": 2}
        assert "all() -> True" in est.detail["notes"]


@pytest.mark.parametrize("kind", ["dict", "tuple"])
def test_dict_and_tuple_outputs(user_dir: Path, kind: str) -> None:
    est = estimate_peak(_spec(user_dir, "net", (8,), {"kind": kind}), "H100")
    assert est.mem_mib > 612 and "assumed_values" not in est.detail


def test_model_output_logits_and_no_assumptions_for_plain_models(user_dir: Path) -> None:
    pytest.importorskip("transformers")
    import torch
    from transformers.modeling_outputs import SequenceClassifierOutput

    from slurm_coloc.estimate.gpulike import pick_output

    t = torch.empty(2, 3, device="meta")
    assert pick_output(torch, SequenceClassifierOutput(logits=t)) is t
    assert pick_output(torch, {"hidden": t}) is t and pick_output(torch, [(t,)]) is t
    assert pick_output(torch, "text") is None


def test_every_kind_of_assumed_read(user_dir: Path) -> None:
    est = estimate_peak(_spec(user_dir, "net", (8,), {"kind": "item"}), "H100")
    assert est.detail["assumed_values_by_kind"] == {"any": 2, "all": 2, "number": 2}


@pytest.mark.parametrize("kind,needle", [("none", "returned NoneType without a tensor"),
                                         ("raise", "RuntimeError: boom")])
def test_model_errors_are_one_line(user_dir: Path, kind: str, needle: str) -> None:
    with pytest.raises(EstimateError) as err:
        estimate_peak(_spec(user_dir, "net", (8,), {"kind": kind}), "H100")
    assert needle in err.value.one_line() and "\n" not in err.value.one_line()


@pytest.mark.slow
def test_cli_error_is_one_line_exit_2(user_dir: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run(CLI + ["--model", "usermodels.py:net", "--model-kwargs", '{"kind": "raise"}',
                                "--input-shape", "8", "--batch-size", "2", "--no-cache"],
                         capture_output=True, text=True, cwd=user_dir, env=env)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "RuntimeError: boom" in out.stderr
    ok = subprocess.run(CLI + ["--model", "usermodels.py:net", "--model-kwargs", '{"kind": "item"}',
                               "--input-shape", "8", "--batch-size", "2", "--no-cache", "--json"],
                        capture_output=True, text=True, cwd=user_dir, env=env)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["detail"]["assumed_values"] == 6
