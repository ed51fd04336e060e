#!/usr/bin/env python3
"""Load: N jobs starting at once on ONE node of a real local cluster; every Prolog/Epilog row must be present
(WAL and busy timeouts: no lost write), every job recorded exactly once.

    .venv/bin/python -m benchmarks.load_start            # 50 jobs on n1 (docs/reliability.md)
    .venv/bin/python -m benchmarks.load_start -n 20

How "at once": the N jobs are submitted held (``sbatch -H``), then released by one ``scontrol release``; the
partition is set ``OverSubscribe=FORCE:4`` at run time (this benchmark's own cluster only) so 50 one-CPU jobs fit
the node's 32 CPUs together. Each job holds 2 shards and sleeps 3 s, so all Prologs overlap. Needs root.
"""
from __future__ import annotations

import argparse
import os
import sqlite3
import sys
from typing import Dict, List

from benchmarks.load_submit import hook_durations_ms, pct, pending_spool, records, wait_final, wait_hooks_done
from tests.slurm_cluster import Cluster, start_cluster, stop_cluster


def start_burst(cluster: Cluster, n: int, node: str = "n1", sleep_s: float = 3.0) -> Dict[str, object]:
    """Submit ``n`` held jobs on ``node``, release them together, wait, and count rows and overlap."""
    cluster.scontrol("update", "partitionname=debug", "oversubscribe=FORCE:4")
    script = cluster.jobs_dir / "load_start.sh"
    script.write_text(f"#!/bin/bash\nsleep {sleep_s}\n")
    os.chmod(script, 0o644)
    ids: List[int] = []
    for i in range(n):
        p = cluster.run(["sbatch", "--parsable", "-H", "-w", node, "-c", "1", "--gres=shard:2", "-t", "2",
                         "-J", f"start-{i}", "-o", "/dev/null", str(script)])
        if p.returncode != 0:
            raise RuntimeError(p.stderr)
        ids.append(int(p.stdout.strip().split(";")[0]))
    cluster.scontrol("release", ",".join(map(str, ids)))
    states = wait_final(cluster, ids, timeout=120 + 2 * n)
    ctld_done = wait_hooks_done(cluster, ids)
    rec = records(cluster, ids)
    conn = sqlite3.connect(str(cluster.node_db(node)))
    q = ",".join(map(str, ids))
    starts = [r[0] for r in conn.execute(f"SELECT ts FROM hook_runs WHERE hook = 'prolog' AND job_id IN ({q})")]
    durs = [r[0] for r in conn.execute(f"SELECT duration_ms FROM hook_runs WHERE job_id IN ({q})")]
    spans = {}
    for job_id, hook, ts in conn.execute(f"SELECT job_id, hook, ts FROM hook_runs WHERE job_id IN ({q})"):
        spans.setdefault(job_id, {})[hook] = ts
    edges = sorted([(v["prolog"], 1) for v in spans.values() if "prolog" in v and "epilog" in v] +
                   [(v["epilog"], -1) for v in spans.values() if "prolog" in v and "epilog" in v])
    max_running = level = 0
    for _, step in edges:  # most jobs between their Prolog start and Epilog start at one instant
        level += step
        max_running = max(max_running, level)
    failed_rows = [f"{h}: {d}" for h, d in conn.execute(
        f"SELECT hook, detail_json FROM hook_runs WHERE ok = 0 AND job_id IN ({q})")]
    failed = len(failed_rows)
    runs = conn.execute(f"SELECT count(*) FROM job_runs WHERE end_ts IS NOT NULL AND job_id IN ({q})").fetchone()[0]
    conn.close()
    return {"n": n, "max_running": max_running, "completed": sum(1 for s in states.values() if s == "COMPLETED"),
            "prolog_spread_s": (max(starts) - min(starts)) if starts else None, "job_runs": runs,
            "hook_rows_failed": failed, "failed_rows": failed_rows,
            "own_work_p99_ms": pct(durs, 99) if durs else None, "ids": ids,
            "epilog_slurmctld_done": ctld_done, "spool_pending": pending_spool(cluster), **rec}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=50)
    a = ap.parse_args()
    cluster = start_cluster()
    try:
        r = start_burst(cluster, a.n)
        hooks = hook_durations_ms(cluster)
    finally:
        stop_cluster(cluster)
    from rich.console import Console
    from rich.table import Table
    t = Table(title=f"{a.n} jobs starting at once on one node ({os.cpu_count()} CPUs)")
    t.add_column("figure")
    t.add_column("value")
    rows = [("jobs COMPLETED", f"{r['completed']}/{r['n']}"),
            ("most jobs running together (Prolog..Epilog)", str(r["max_running"])),
            ("Prolog start spread (s)", f"{r['prolog_spread_s']:.1f}"),
            ("job_runs rows with an end", str(r["job_runs"])), ("exactly one Prolog row", str(r["prolog_once"])),
            ("exactly one Epilog row", str(r["epilog_once"])), ("jobs rows with an end", str(r["jobs_rows"])),
            ("hook rows with ok=0", str(r["hook_rows_failed"])),
            ("EpilogSlurmctld finished", str(r["epilog_slurmctld_done"])),
            ("record sets left in the spool", str(r["spool_pending"])),
            ("node hooks' own work p99 (ms)", f"{r['own_work_p99_ms']:.0f}")]
    for hook in sorted(hooks):
        rows.append((f"{hook} process p50 / p99 (ms)", f"{pct(hooks[hook], 50):.0f} / {pct(hooks[hook], 99):.0f}"))
    for row in rows:
        t.add_row(*row)
    Console().print(t)
    for line in r["failed_rows"][:5]:
        print("failed hook row:", line[:300])
    ok = r["n"] == r["completed"] == r["prolog_once"] == r["epilog_once"] == r["job_runs"] == r["jobs_rows"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
