"""The per-user estimate cache: a hit skips torch, a corrupt file is ignored, keys separate specs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_coloc.estimate import cache
from slurm_coloc.estimate.spec import Estimate, ModelSpec

REPO = Path(__file__).resolve().parents[1]
SCRIPT = ("#!/bin/sh\n#COLOC model=torch.nn:Linear kwarg.in_features=32 kwarg.out_features=4\n"
          "#COLOC input=32 batch=8 optimizer=sgd\ntrue\n")


def _estimate_json(script: Path, env: dict) -> dict:
    code = ("import json, sys; from slurm_coloc.submit.directives import parse_script; "
            "from slurm_coloc.estimate import estimate_peak; e = "
            "estimate_peak(parse_script(sys.argv[1]).spec); "
            "print(json.dumps({'mib': e.mem_mib, 'torch': 'torch' in sys.modules}))")
    out = subprocess.run([sys.executable, "-c", code, str(script)], env=env, capture_output=True, text=True,
                         timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_hit_does_not_import_torch_and_corrupt_cache_is_ignored(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text(SCRIPT)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    cold = _estimate_json(script, env)
    assert cold["torch"] is True
    warm = _estimate_json(script, env)
    assert warm == {"mib": cold["mib"], "torch": False}
    path = tmp_path / "xdg" / "slurm-coloc" / "estimates.json"
    assert path.exists()
    path.write_text("{not json")
    again = _estimate_json(script, env)
    assert again["mib"] == cold["mib"] and again["torch"] is True  # recomputed, no error
    off = _estimate_json(script, {**env, "COLOC_ESTIMATE_CACHE": "off"})
    assert off["torch"] is True and off["mib"] == cold["mib"]


def test_keys_differ_by_spec_and_gpu(tmp_path: Path) -> None:
    a = ModelSpec(model="torch.nn:Linear", input_shape=(32,), batch_size=8, kwargs={"in_features": 32,
                                                                                      "out_features": 4})
    b = ModelSpec(model="torch.nn:Linear", input_shape=(32,), batch_size=16, kwargs={"in_features": 32,
                                                                                       "out_features": 4})
    ka, kb = cache.cache_key(a, "H100"), cache.cache_key(b, "H100")
    assert ka and kb and ka != kb and cache.cache_key(a, "H200") != ka
    assert ka == cache.cache_key(a, "H100")


def test_store_and_lookup_roundtrip(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    est = Estimate(mem_mib=1234, method="analytic", detail={"x": 1}, gpu_model="H100")
    cache.store("k1", est)
    got = cache.lookup("k1")
    assert got is not None and got.mem_mib == 1234 and got.method == "analytic"
    assert cache.lookup("missing") is None


def test_estimate_json_roundtrip_and_refusals() -> None:
    """``Estimate.to_json``/``from_json`` are the one way an estimate crosses a file or a process."""
    est = Estimate(mem_mib=1234, method="analytic", detail={"x": 1}, gpu_model="H100", flops_per_step=99)
    assert Estimate.from_json(json.loads(json.dumps(est.to_json()))) == est
    old = {"mem_mib": 5, "method": "history"}  # an entry written before FLOPs and details were kept
    assert Estimate.from_json(old) == Estimate(5, "history")
    assert Estimate.from_json({**old, "flops_per_step": -1}).flops_per_step is None
    for bad in ([], {"method": "x"}, {**old, "mem_mib": 0}, {**old, "mem_mib": True}, {**old, "method": 3},
                {**old, "detail": [1]}):
        with pytest.raises(ValueError):
            Estimate.from_json(bad)


@pytest.mark.slow
def test_coloc_estimate_script_option(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "coloc-estimate"
    good = tmp_path / "good.sh"
    good.write_text(SCRIPT)
    out = subprocess.run([str(exe), "--script", str(good), "--json"], capture_output=True, text=True,
                         timeout=120,
                         env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["estimate_mib"] > 0 and isinstance(data["method"], str)
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/bin/sh\n#COLOC model=no_such_mod_q:build input=4 batch=2\ntrue\n")
    out = subprocess.run([str(exe), "--script", str(bad), "--json"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and "no_such_mod_q" in out.stderr
    assert "Traceback" not in out.stderr
