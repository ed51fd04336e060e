"""Time each device workload alone in one process (the placement benchmark's profile, ``placement_plan.py``).

Per model: per-step time after warm-up, peak reserved memory, and FLOPs of one training step
(``torch.utils.flop_counter``), one JSON line per model (``PROFILE {...}``); the placement benchmark sizes
its jobs from it and ``placement_fit.py`` uses the FLOPs. Names are ``workloads.py`` names (``pile:<name>``
for the pile of ``pile_workloads.py``, ``small_cnn``, ``tv:...``). On the GPU machine, from the repository
root::

    /opt/torch/.venv/bin/python3 -m benchmarks.device.workload_profile pile:resnet50 pile:gpt2 ...
"""
from __future__ import annotations

import json
import sys
import time
from typing import Any, Dict, List

import torch
from torch import nn

from benchmarks.device import workloads


def profile(name: str, time_s: float = 0.6) -> Dict[str, Any]:
    """Time one workload alone: 3 warm-up steps, then steps for ``time_s``; FLOPs of one step; peak memory.

    ``name`` is any ``workloads.py`` name (``pile:...``, ``small_cnn``, ``tv:...``). Returns ``{"workload",
    "step_s", "batch", "input_shape", "peak_reserved_mib", "gflop_per_step", "params_m"}``.
    """
    dev = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model, shape, batch, classes = workloads.build(name)
    model = model.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn((batch, *shape), device=dev)
    y = torch.randint(0, classes, (batch,), device=dev)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    n, t0 = 0, time.perf_counter()
    while n < 3 or time.perf_counter() - t0 < time_s:
        step()
        n += 1
        if n % 5 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    step_s = (time.perf_counter() - t0) / n
    gflop = None
    try:
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False) as fc:
            step()
        gflop = fc.get_total_flops() / 1e9
    except Exception as exc:  # noqa: BLE001 - an op the counter does not know: FLOPs unknown
        print(f"profile {name}: no FLOP count ({exc})", file=sys.stderr)
    out = {"workload": name, "step_s": step_s, "batch": batch, "input_shape": list(shape),
           "peak_reserved_mib": torch.cuda.max_memory_reserved() / 2**20, "gflop_per_step": gflop,
           "params_m": sum(p.numel() for p in model.parameters()) / 1e6}
    return out


def main(argv: List[str]) -> int:
    usage = "usage: python3 -m benchmarks.device.workload_profile WORKLOAD..."
    if argv[:1] in (["-h"], ["--help"]):
        print(usage + "\n" + __doc__)
        return 0
    if not argv:
        print(usage, file=sys.stderr)
        return 2
    for name in argv:
        try:
            print("PROFILE " + json.dumps(profile(name)), flush=True)
            torch.cuda.empty_cache()  # the model of the last profile is garbage now
        except Exception as exc:  # noqa: BLE001 - one bad model must not hide the others
            print("PROFILE " + json.dumps({"workload": name, "error": repr(exc)[:300]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
