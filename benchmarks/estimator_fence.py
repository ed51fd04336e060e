#!/usr/bin/env python3
"""What the MPS fence sees: the shipped estimate vs the fence coloc-sbatch actually requests (issue 3/4).

coloc-sbatch asks for ``max(min_shards, mib_to_shards(estimate + headroom_mib))`` GiB shards and the Prolog
fences the job at that many GiB (``submit/plan.py``, ``node/jobenv.py``). This prints, per data set, how many
measured H100 peaks exceed the estimate and how many exceed the fence, and the median over-reservation of both:

    .venv/bin/python benchmarks/estimator_fence.py

Data: ``data/hopper`` (H100, this project) incl. the 18 real models of GPUMemNet's paper table re-measured
(``paper18_*.csv``; GPUMemNet, CC BY 4.0). Uses the shipped calibration and the default config.
"""
from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
from typing import Any, Dict, List, Sequence

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from slurm_coloc.config import Config  # noqa: E402
from slurm_coloc.estimate import margins, train  # noqa: E402
from slurm_coloc.estimate.combine import load_calibration  # noqa: E402
from slurm_coloc.units import mib_to_shards  # noqa: E402


def fence_mib(estimate_mib: float, cfg: Config) -> int:
    """The fence (MiB) coloc-sbatch's shard request gives a job with this estimate."""
    return max(cfg.min_shards, mib_to_shards(int(round(estimate_mib)) + cfg.headroom_mib)) * 1024


def row(name: str, rows: Sequence[Dict[str, Any]], cal: Dict[str, Any], cfg: Config) -> List[str]:
    """Table cells: data set, rows, under estimate, under fence, median over of both."""
    est = [margins._bound(cal, r, train.H100_CONTEXT_MIB) for r in rows]
    fen = [fence_mib(e, cfg) for e in est]
    act = [r["actual_mib"] for r in rows]
    n = len(rows)

    def under(xs: Sequence[float]) -> str:
        k = sum(1 for x, a in zip(xs, act) if x < a)
        return f"{k} ({100 * k / n:.1f}%)"

    def med(xs: Sequence[float]) -> str:
        return f"{100 * statistics.median((x - a) / a for x, a in zip(xs, act)):+.1f}%"

    return [name, str(n), under(est), under(fen), med(est), med(fen)]


def main() -> int:
    cal, cfg = load_calibration(), Config()
    hopper = train.load_hopper()
    _, test = train.split(hopper, train.TEST_FAMILIES)
    tmp = tempfile.mkdtemp()
    try:
        for src, dst in (("paper18_runs.csv", "hopper_runs.csv"), ("paper18_traces.csv", "hopper_traces.csv")):
            shutil.copy(os.path.join(train.HOPPER_DIR, src), os.path.join(tmp, dst))
        paper = train.load_hopper(tmp)
    finally:
        shutil.rmtree(tmp)
    t = Table(title=f"estimate vs fence (headroom {cfg.headroom_mib} MiB, 1 shard = 1 GiB)")
    for c in ("data set", "rows", "peak > estimate", "peak > fence", "median over (estimate)", "median over (fence)"):
        t.add_column(c)
    t.add_row(*row("Hopper held-out families", test, cal, cfg))
    t.add_row(*row("18 real models, H100", paper, cal, cfg))
    t.add_row(*row("generated small CNNs (cnn family)", [r for r in hopper if r["family"] == "cnn"], cal, cfg))
    t.add_row(*row("all Hopper rows", hopper, cal, cfg))
    Console(width=160).print(t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
