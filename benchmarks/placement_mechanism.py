"""Which Slurm 22.05 operations can steer a shard job to ONE chosen GPU? Tries each on a real local cluster with
typed shards (scripts/cluster.sh, ``COLOC_GRES_TYPED=1``: GPU i of each node is ``gpu:g<i>``/``shard:g<i>``) and
prints a table: the operation, scontrol's exit status and message, and the GRES the job really got
(``scontrol show job -d``). Needs root. Usage: ``.venv/bin/python -m benchmarks.placement_mechanism``.
"""
from __future__ import annotations

import re
import time
from typing import List, Optional, Sequence, Tuple

from tests.slurm_cluster import Cluster, start_cluster, stop_cluster

PROBES: List[Tuple[str, List[str], List[str]]] = [
    # (label, sbatch options, scontrol update arguments applied while held)
    ("typed at submit", ["--gres=shard:g1:4"], []),
    ("untyped at submit (Slurm first-fit)", ["--gres=shard:4"], []),
    ("held untyped -> Gres=shard:g1:4", ["--hold", "--gres=shard:4"], ["Gres=shard:g1:4"]),
    ("held untyped -> TresPerNode=gres/shard:g1:4", ["--hold", "--gres=shard:4"], ["TresPerNode=gres/shard:g1:4"]),
    ("held typed g0 -> Gres=shard:g1:4", ["--hold", "--gres=shard:g0:4"], ["Gres=shard:g1:4"]),
    ("held typed g0 -> g0:0 then g1:4", ["--hold", "--gres=shard:g0:4"], ["Gres=shard:g0:0", "Gres=shard:g1:4"]),
    ("held no GRES -> Gres=shard:g1:4 NodeList=n2", ["--hold"], ["Gres=shard:g1:4 NodeList=n2"]),
    ("held no GRES -> Gres=shard:4 (memory-only)", ["--hold"], ["Gres=shard:4"]),
    ("held no GRES -> Gres=gpu:g1:1 NodeList=n2", ["--hold"], ["Gres=gpu:g1:1 NodeList=n2"]),
    ("begin=now+120 no GRES -> Gres=shard:g1:6 StartTime=now", ["--begin=now+120"],
     ["Gres=shard:g1:6", "StartTime=now"]),
]


def _run(cl: Cluster, argv: Sequence[str], user: Optional[str] = None) -> Tuple[int, str]:
    p = cl.run(list(argv), user=user)
    return p.returncode, " ".join((p.stdout + p.stderr).split())


def probe(cl: Cluster, label: str, opts: List[str], updates: List[str]) -> Tuple[str, str, str]:
    rc, out = _run(cl, ["sbatch", "--parsable", "-o", "/dev/null", "--wrap=sleep 30", *opts], user="colocuser")
    if rc != 0:
        return label, f"sbatch rc {rc}: {out[:60]}", "-"
    job = out.split(";")[0]
    results = []
    for upd in updates:
        rc, msg = _run(cl, ["scontrol", "update", f"jobid={job}", *upd.split()])
        results.append(f"rc {rc}" + (f" ({msg[:50]})" if msg else ""))
    if "--hold" in opts:
        _run(cl, ["scontrol", "release", job])
    deadline = time.time() + 20
    got = "not started"
    while time.time() < deadline:
        rc, detail = _run(cl, ["scontrol", "show", "job", "-d", job])
        if "JobState=RUNNING" in detail:
            m = re.findall(r"Nodes=(\S+) CPU_IDs=\S+ Mem=\S+ GRES=(\S+)", detail)
            got = "; ".join(f"{n} {g}" for n, g in m) or "running, no GRES"
            break
        time.sleep(0.5)
    _run(cl, ["scancel", job])
    return label, ", ".join(results) or "-", got


def main() -> None:
    cl = start_cluster({"COLOC_GRES_TYPED": "1"})
    try:
        _, version = _run(cl, ["sinfo", "-V"])
        rows = [probe(cl, *p) for p in PROBES]
    finally:
        stop_cluster(cl)
    print(f"Slurm: {version}; 2 nodes x 2 fake GPUs, typed shards g0/g1, 80 per GPU")
    print("| operation | update result | GRES the job ran with |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} |")


if __name__ == "__main__":
    main()
