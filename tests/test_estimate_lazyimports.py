"""fp32 traces run without importing torch._dynamo (loader.py) and give the same trace as with it."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # real probe/torch/subprocess work: left out of the fast command

REPO = Path(__file__).resolve().parents[1]

# In a fresh interpreter: trace with the stand-ins, check dynamo stayed out and everything was put back,
# then import the real torch._dynamo and trace again without them.
CODE = textwrap.dedent("""
    import dataclasses, json, sys
    import torch
    from slurm_coloc.estimate.spec import ModelSpec
    from slurm_coloc.estimate.trace import trace_spec, _trace
    out = {}
    for name, spec in [
        ("resnet18", ModelSpec("torchvision.models:resnet18", (3, 32, 32), 16, optimizer="adam")),
        ("lm", ModelSpec("benchmarks/estimator/zoo.py:transformer_lm", (64,), 4, input_dtype="int64",
                         optimizer="adamw")),
    ]:
        fast = dataclasses.asdict(trace_spec(spec))
        out[name + "_dynamo_after_fast"] = "torch._dynamo" in sys.modules or "_dynamo" in torch.__dict__
        out[name + "_fast"] = fast
    out["roi_align_stand_in_bound"] = sys.modules["torchvision.ops.roi_align"].is_compile_supported.__module__
    import torch._dynamo  # the real one, as if the stand-ins had never been there
    out["real_dynamo"] = type(torch._dynamo).__name__ == "module" and hasattr(torch._dynamo, "optimize")
    for name, spec in [
        ("resnet18", ModelSpec("torchvision.models:resnet18", (3, 32, 32), 16, optimizer="adam")),
        ("lm", ModelSpec("benchmarks/estimator/zoo.py:transformer_lm", (64,), 4, input_dtype="int64",
                         optimizer="adamw")),
    ]:
        out[name + "_plain"] = dataclasses.asdict(_trace(spec))
    out["supported"] = sys.modules["torchvision.ops.roi_align"].is_compile_supported("cpu")
    print(json.dumps(out))
""")


def test_fp32_trace_without_dynamo_is_identical() -> None:
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", CODE], capture_output=True, text=True,
                          timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["resnet18_dynamo_after_fast"] is False and out["lm_dynamo_after_fast"] is False
    assert out["roi_align_stand_in_bound"] == "slurm_coloc.estimate.loader"
    assert out["real_dynamo"] is True
    assert out["resnet18_fast"] == out["resnet18_plain"]
    assert out["lm_fast"] == out["lm_plain"]
    assert out["supported"] is True  # the stand-in function forwards to the real one


def test_model_needing_dynamo_submodule_still_traces(tmp_path: Path) -> None:
    """A model file importing a torch._dynamo submodule: the stand-in cannot serve it, the plain trace
    does."""
    (tmp_path / "m.py").write_text(
        "import torch\nimport torch._dynamo.config\n"
        "def build():\n"
        "    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))\n")
    code = ("import json, sys, dataclasses; from slurm_coloc.estimate.spec import ModelSpec; "
            "from slurm_coloc.estimate.trace import trace_spec; "
            f"t = trace_spec(ModelSpec('m.py:build', (8,), 4, optimizer='sgd', base_dir={str(tmp_path)!r})); "
            "print(json.dumps([t.peak_reserved_b, 'torch._dynamo' in sys.modules]))")
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True,
                          timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    reserved, dynamo = json.loads(proc.stdout.strip().splitlines()[-1])
    assert reserved > 0 and dynamo is True


def test_may_need_real_dynamo() -> None:
    """Only the estimator's own error, with no ``_dynamo`` anywhere in its chain, skips the retry."""
    from slurm_coloc.errors import EstimateError
    from slurm_coloc.estimate.loader import may_need_real_dynamo

    assert may_need_real_dynamo(RuntimeError("anything unexpected")) is True
    assert may_need_real_dynamo(EstimateError("model m: forward on input (5,) failed: shape")) is False
    inner = ModuleNotFoundError("No module named 'torch._dynamo.config'; 'torch._dynamo' is not a package")
    wrapped = EstimateError("model m.py:build: import failed")
    wrapped.__cause__ = inner
    assert may_need_real_dynamo(wrapped) is True


# Callers other than torch._disable_dynamo get the real dynamo.disable; the identity cache on
# fn is gone after the block; a model's own error is raised at once (no second, plain trace).
CODE_LEAKS = textwrap.dedent("""
    import json, sys
    import torch
    from slurm_coloc.errors import EstimateError
    from slurm_coloc.estimate.loader import deferred_imports
    from slurm_coloc.estimate.spec import ModelSpec
    from slurm_coloc.estimate.trace import trace_spec
    out = {}
    try:
        trace_spec(ModelSpec("torchvision.models:resnet18", (5, 32, 32), 2, optimizer="sgd"))
    except EstimateError as exc:
        out["error"] = str(exc).splitlines()[0]
    out["dynamo_after_error"] = "torch._dynamo" in sys.modules
    def f():
        return 1
    wrapped = torch._disable_dynamo(f)
    with deferred_imports():
        out["inner_call"] = wrapped()
        out["identity_cached"] = getattr(f, "__dynamo_disable", None) is f
        # no hasattr: it imports
        out["dynamo_inside"] = type(sys.modules["torch._dynamo"]).__name__ != "_StandIn"
    out["cache_cleared"] = getattr(f, "__dynamo_disable", None) is None
    def g():
        return 2
    with deferred_imports():
        dg = torch.compiler.disable(g)
    out["compiler_disable_real"] = dg is not g and dg() == 2
    dynamo = sys.modules["torch._dynamo"]
    out["real_dynamo_after"] = hasattr(dynamo, "optimize") and torch._dynamo is dynamo
    print(json.dumps(out))
""")


def test_no_leak_and_no_retry_on_model_error() -> None:
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", CODE_LEAKS], capture_output=True, text=True,
                          timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "resnet18" in out["error"] and out["dynamo_after_error"] is False
    assert out["inner_call"] == 1 and out["identity_cached"] is True and out["dynamo_inside"] is False
    assert out["cache_cleared"] is True
    assert out["compiler_disable_real"] is True and out["real_dynamo_after"] is True
