"""SM activity of a replay's GPUs: mean GPM SM activity (%) over a span, overall and per GPU, of the replay's
nodes, from the sampler's node databases (``store/samples.py``) under ``cfg.state_dir``.
"""

from __future__ import annotations

import logging
from typing import Dict, List, Optional, Sequence

from slurm_coloc.config import Config
from slurm_coloc.replay.metrics import mean_smact
from slurm_coloc.slurm.parse import expand_hostlist

log = logging.getLogger("slurm_coloc.replay")


def sm_activity(cfg: Config, records: Sequence[object], t0: float, t1: float) -> Optional[float]:
    """Mean GPM SM activity (%) over [t0, t1] (Unix s) of ``records``' nodes' GPUs; None without samples;
    SlurmError: a bad host list.
    """
    return sm_activity_per_gpu(cfg, records, t0, t1)[0]


def sm_activity_per_gpu(cfg: Config, records: Sequence[object], t0: float,
                        t1: float) -> "tuple[Optional[float], Dict[str, Optional[float]]]":
    """(mean GPM SM activity %, {``node:gpu_index``: mean %}) over [t0, t1] (Unix s) of every GPU of
    ``records``' nodes (an idle GPU shows with its low mean); None where no sample covers the span.

    Raises:
        SlurmError: a record's ``nodes`` is not a valid host list.
    """
    from slurm_coloc.replay.metrics import mean_smact_per_gpu
    from slurm_coloc.store.db import open_readonly
    from slurm_coloc.store.samples import load_gpu_samples

    nodes = sorted({n for r in records for n in parse_index_nodes(getattr(r, "nodes", ""))})
    samples: List[dict] = []
    for node in nodes:
        try:
            db = open_readonly(cfg.node_db_path(node))
            samples += [{**row, "node": node} for row in load_gpu_samples(db, t0, t1, list(range(64)))]
        except Exception as exc:  # unreadable db: metric NULL
            log.info("no samples for %s: %s", node, exc)
    return mean_smact(samples), mean_smact_per_gpu(samples)


def parse_index_nodes(nodes: str) -> List[str]:
    """``n[1-2]`` / ``n1,n2`` -> node names; SlurmError: not a valid host list."""
    return expand_hostlist(nodes)
