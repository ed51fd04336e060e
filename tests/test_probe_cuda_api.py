"""The probe's fake CUDA device answers every ``torch.cuda`` function it stands in for, with the real
signatures.

Each stand-in is called in a child Python (the patches change ``torch.cuda`` for the whole process) with every
parameter of the real function passed by keyword: its default where it has one, a documented example value
otherwise. A keyword the real function refuses must be refused the same way (``TypeError``).
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import inspect, json, sys
    import torch
    real = {n: getattr(torch.cuda, n) for n in dir(torch.cuda)}
    from slurm_coloc.estimate.tracker import make_tracker
    from slurm_coloc.probe.inject import cudaapi, fakecuda
    st = fakecuda.ProbeState(make_tracker(torch))
    names = list(cudaapi.cuda_api_table(torch, st))
    cudaapi.patch_cuda_api(torch, st)
    EXAMPLES = {"device": 0, "seed": 0, "fraction": 0.5, "new_state": torch.get_rng_state(),
                "new_states": [torch.get_rng_state()], "stream": None, "obj": None, "mode": 0,
                "peer_device": 0, "debug_mode": 0, "abbreviated": False}
    out = {"called": [], "failed": {}, "refused_unknown": [], "accepted_unknown": []}
    for name in names:
        r = real.get(name)
        if r is None or isinstance(r, type) or not callable(r):
            continue
        try:
            sig = inspect.signature(r)
        except (TypeError, ValueError):
            continue
        kwargs = {}
        for p in sig.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            if p.default is not p.empty:
                kwargs[p.name] = p.default
            elif p.name in EXAMPLES:
                kwargs[p.name] = EXAMPLES[p.name]
            else:
                kwargs = None
                break
        if kwargs is None:
            out["failed"][name] = "no example value for a required parameter"
            continue
        fake = getattr(torch.cuda, name)
        try:
            if any(p.kind is p.POSITIONAL_ONLY for p in sig.parameters.values()):
                fake(*kwargs.values())
            else:
                fake(**kwargs)
            out["called"].append(name)
        except Exception as exc:
            out["failed"][name] = f"{type(exc).__name__}: {exc}"
        if not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
            try:
                fake(no_such_keyword=1)
                out["accepted_unknown"].append(name)
            except TypeError:
                out["refused_unknown"].append(name)
    # what real programs read from them
    out["props"] = torch.cuda.get_device_properties(device=0).total_memory
    out["name"] = torch.cuda.get_device_name(device=torch.device("cuda", 0))
    out["sync"] = torch.cuda.synchronize(device="cuda") is None
    out["max_alloc"] = torch.cuda.max_memory_allocated(device=torch.device("cuda"))
    sig = inspect.signature
    out["signature_kept"] = str(sig(torch.cuda.memory_allocated)) == str(sig(real["memory_allocated"]))
    print(json.dumps(out))
""")


def test_every_cuda_stand_in_takes_the_real_keywords():
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["failed"] == {}
    # the functions real programs call with keywords (timm's train.py: device=)
    for name in ("synchronize", "memory_allocated", "max_memory_allocated", "max_memory_reserved",
                 "get_device_properties", "get_device_name", "reset_peak_memory_stats", "mem_get_info",
                 "memory_stats", "manual_seed", "is_bf16_supported", "set_per_process_memory_fraction"):
        assert name in out["called"], name
    assert len(out["called"]) >= 40
    assert "memory_allocated" in out["refused_unknown"] and not out["accepted_unknown"]
    assert out["props"] == 81559 * (1 << 20) and out["name"].startswith("NVIDIA H100")
    assert out["sync"] and out["max_alloc"] == 0 and out["signature_kept"]
