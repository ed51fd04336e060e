#!/usr/bin/env python3
"""Load: N jobs submitted through ``coloc-sbatch`` by C parallel clients (as a user) on a real local cluster;
all must be accepted and each recorded exactly once (one ``jobs`` row, one Prolog and one Epilog row).

    .venv/bin/python -m benchmarks.load_submit            # 200 submissions, 8 clients (docs/reliability.md)
    .venv/bin/python -m benchmarks.load_submit -n 50 -c 4

Starts its own cluster (free ports, own directory) and stops it. Job scripts use ``#COLOC mem=1G`` (an override):
this measures the submission path, not the estimator (docs/estimator.md has its speed). Needs root.
Prints a table: submissions/s, p50/p99 coloc-sbatch latency, p99 hook duration, records found.
"""
from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List

from tests.slurm_cluster import Cluster, start_cluster, stop_cluster

FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


def pct(values: List[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    s = sorted(values)
    return s[max(0, min(len(s) - 1, int(round(q / 100 * len(s) + 0.5)) - 1))]


def hook_durations_ms(cluster: Cluster) -> Dict[str, List[float]]:
    """Whole-process durations of every hook from hooks.log (``<hook> done in N ms``)."""
    out: Dict[str, List[float]] = {}
    log = cluster.dir / "log" / "hooks.log"
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        if " done in " in line and " ms" in line:
            head, _, tail = line.partition(" done in ")
            out.setdefault(head.rsplit(" ", 1)[-1], []).append(float(tail.split()[0]))
    return out


def wait_final(cluster: Cluster, ids: List[int], timeout: float) -> Dict[int, str]:
    deadline = time.time() + timeout
    states: Dict[int, str] = {}
    while time.time() < deadline:
        states = {j["job_id"]: j["job_state"] for j in cluster.squeue() if j["job_id"] in set(ids)}
        if len(states) == len(ids) and all(s in FINAL for s in states.values()):
            break
        time.sleep(1.0)
    return states


def wait_hooks_done(cluster: Cluster, ids: List[int], hook: str = "epilog-slurmctld", timeout: float = 180) -> int:
    """Wait until every job's ``hook`` logged its end (EpilogSlurmctld runs after squeue shows the final state and
    can take seconds under load); return how many did."""
    want = set(ids)
    log = cluster.dir / "log" / "hooks.log"
    deadline = time.time() + timeout
    done: set = set()
    while time.time() < deadline:
        done = set()
        for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
            if f" {hook} done in " in line and "coloc[" in line:
                job = line.split("coloc[", 1)[1].split("]", 1)[0]
                if job.isdigit() and int(job) in want:
                    done.add(int(job))
        if done >= want:
            break
        time.sleep(1.0)
    return len(done & want)


def done_lines(cluster: Cluster, ids: List[int]) -> Dict[str, int]:
    """Per (job, root hook): how many ``done`` lines hooks.log holds. Every hook run must leave exactly one (a run
    SIGTERMed by the shim's timeout logs ``done ... (TERMINATED ...)``): returns the pairs with exactly one, and
    how many lines say TERMINATED (of which during start-up)."""
    hooks = ("prolog-slurmctld", "prolog", "epilog", "epilog-slurmctld")
    want = set(ids)
    counts: Dict[tuple, int] = {}
    terminated = start_up = 0
    log = cluster.dir / "log" / "hooks.log"
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        if " done in " not in line or "coloc[" not in line:
            continue
        job = line.split("coloc[", 1)[1].split("]", 1)[0]
        hook = line.split("] ", 1)[1].split(" ", 1)[0] if "] " in line else ""
        if job.isdigit() and int(job) in want and hook in hooks:
            counts[(int(job), hook)] = counts.get((int(job), hook), 0) + 1
            terminated += "TERMINATED" in line
            start_up += "TERMINATED during start-up" in line
    return {"hook_runs_one_line": sum(1 for j in want for h in hooks if counts.get((j, h)) == 1),
            "hook_runs_expected": 4 * len(want), "terminated": terminated, "terminated_in_start_up": start_up}


def pending_spool(cluster: Cluster) -> int:
    """Record sets still waiting in the spool (written when a database was unusable; replayed by the next hook)."""
    n = 0
    for d in (cluster.dir / "coloc" / "run" / "spool", cluster.state_dir / "spool"):
        if d.is_dir():
            n += sum(1 for p in d.iterdir() if p.name.endswith(".json"))
    return n


def pending_envs(cluster: Cluster) -> int:
    """Environments of hook runs that ended before recording (killed in start-up, hooks/pending.py), not yet
    replayed: the next hook run of the same database records them."""
    d = cluster.dir / "coloc" / "pending"
    return sum(1 for p in d.iterdir() if p.name.endswith(".env")) if d.is_dir() else 0


def flush_jobs(cluster: Cluster) -> None:
    """One more job per node (plain sbatch): its hooks replay what the burst's last killed runs left pending."""
    script = cluster.jobs_dir / "load_flush.sh"
    script.write_text("#!/bin/bash\ntrue\n")
    os.chmod(script, 0o644)
    ids = []
    for node in ("n1", "n2"):
        p = cluster.run(["sbatch", "--parsable", "-w", node, "-t", "1", "-o", "/dev/null", str(script)])
        if p.returncode == 0:
            ids.append(int(p.stdout.strip().split(";")[0]))
    wait_final(cluster, ids, timeout=120)
    wait_hooks_done(cluster, ids, timeout=60)


def records(cluster: Cluster, ids: List[int]) -> Dict[str, int]:
    """How many of ``ids`` have exactly one jobs row with an end, exactly one Prolog and one Epilog row."""
    want = set(ids)
    conn = sqlite3.connect(str(cluster.ctld_db))
    jobs = [r[0] for r in conn.execute("SELECT job_id FROM jobs WHERE end_ts IS NOT NULL")]
    completed = {r[0] for r in conn.execute("SELECT job_id FROM jobs WHERE state = 'COMPLETED'")}
    conn.close()
    hooks: Dict[tuple, int] = {}
    for n in ("n1", "n2"):
        if cluster.node_db(n).exists():
            c = sqlite3.connect(str(cluster.node_db(n)))
            for job_id, hook in c.execute("SELECT job_id, hook FROM hook_runs"):
                hooks[(job_id, hook)] = hooks.get((job_id, hook), 0) + 1
            c.close()
    odd = sorted(f"{j}:{h}x{hooks.get((j, h), 0)}" for j in want for h in ("prolog", "epilog")
                 if hooks.get((j, h), 0) != 1)
    if odd:  # which job ids lack a row or have two: the first place to look when a count is short
        print("hook rows not exactly once: " + " ".join(odd[:40]), file=sys.stderr)
    return {"jobs_rows": sum(1 for j in jobs if j in want), "jobs_completed": len(completed & want),
            "prolog_once": sum(1 for j in want if hooks.get((j, "prolog")) == 1),
            "epilog_once": sum(1 for j in want if hooks.get((j, "epilog")) == 1)}


def submit_burst(cluster: Cluster, n: int, clients: int) -> Dict[str, object]:
    """Submit ``n`` jobs from ``clients`` threads (each a coloc-sbatch process as colocuser); wait; count records."""
    script = cluster.jobs_dir / "load_submit.sh"
    script.write_text("#!/bin/bash\n#COLOC mem=1G\ntrue\n")
    os.chmod(script, 0o644)
    lat: List[float] = []
    ids: List[int] = []
    errors: List[str] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        t = time.monotonic()
        p = cluster.run(["coloc-sbatch", "--parsable", "-t", "1", "-J", f"load-{i}", "-o", "/dev/null",
                         str(script)], timeout=300)
        dt = time.monotonic() - t
        with lock:
            lat.append(dt)
            if p.returncode == 0:
                ids.append(int(p.stdout.strip().split(";")[0]))
            else:
                errors.append(p.stderr.strip()[:200])

    t0 = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, range(n)))
    wall = time.monotonic() - t0
    states = wait_final(cluster, ids, timeout=60 + 3 * n)
    ctld_done = wait_hooks_done(cluster, ids)
    rec = records(cluster, ids)
    left = pending_envs(cluster)
    if left:
        flush_jobs(cluster)
    after = records(cluster, ids)
    return {"pending_after_burst": left, "pending_after_flush": pending_envs(cluster),
            **{f"{k}_after_flush": v for k, v in after.items()},
            "n": n, "clients": clients, "accepted": len(ids), "errors": errors, "wall_s": wall,
            "subs_per_s": n / wall, "p50_s": pct(lat, 50), "p99_s": pct(lat, 99),
            "completed": sum(1 for s in states.values() if s == "COMPLETED"), "ids": ids,
            "epilog_slurmctld_done": ctld_done, "spool_pending": pending_spool(cluster), **rec,
            **done_lines(cluster, ids)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("-c", "--clients", type=int, default=8)
    a = ap.parse_args()
    cluster = start_cluster()
    try:
        r = submit_burst(cluster, a.n, a.clients)
        hooks = hook_durations_ms(cluster)
    finally:
        stop_cluster(cluster)
    from rich.console import Console
    from rich.table import Table
    t = Table(title=f"coloc-sbatch load: {a.n} submissions, {a.clients} parallel clients ({os.cpu_count()} CPUs)")
    for col in ("figure", "value"):
        t.add_column(col)
    rows = [("accepted", f"{r['accepted']}/{r['n']}"), ("wall time (s)", f"{r['wall_s']:.1f}"),
            ("submissions/s", f"{r['subs_per_s']:.2f}"), ("coloc-sbatch p50 (s)", f"{r['p50_s']:.2f}"),
            ("coloc-sbatch p99 (s)", f"{r['p99_s']:.2f}"), ("jobs COMPLETED", str(r["completed"])),
            ("jobs rows with an end", str(r["jobs_rows"])),
            ("jobs rows with state COMPLETED (every job runs `true`)", str(r["jobs_completed"])),
            ("exactly one Prolog row", str(r["prolog_once"])),
            ("exactly one Epilog row", str(r["epilog_once"])),
            ("EpilogSlurmctld finished", str(r["epilog_slurmctld_done"])),
            ("hook runs with exactly one done line", f"{r['hook_runs_one_line']}/{r['hook_runs_expected']}"),
            ("... of which TERMINATED (in start-up)", f"{r['terminated']} ({r['terminated_in_start_up']})"),
            ("record sets left in the spool", str(r["spool_pending"])),
            ("pending hook environments left after the burst", str(r["pending_after_burst"])),
            ("... after one more job per node: pending / jobs ends / Prolog / Epilog",
             f"{r['pending_after_flush']} / {r['jobs_rows_after_flush']} / {r['prolog_once_after_flush']} / "
             f"{r['epilog_once_after_flush']}")]
    for hook in sorted(hooks):
        rows.append((f"{hook} p50 / p99 (ms)", f"{pct(hooks[hook], 50):.0f} / {pct(hooks[hook], 99):.0f}"))
    for row in rows:
        t.add_row(*row)
    Console().print(t)
    if r["errors"]:
        print("errors:", *r["errors"][:5], sep="\n  ")
    ok = r["accepted"] == r["n"] == r["jobs_rows_after_flush"] == r["prolog_once_after_flush"] == r[
        "epilog_once_after_flush"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
