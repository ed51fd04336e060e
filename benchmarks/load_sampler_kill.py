#!/usr/bin/env python3
"""The sampler SIGKILLed at N random moments under write load: ``PRAGMA integrity_check`` must be ``ok`` after
every kill, and the samples lost per kill (read but not yet committed) must stay within one flush interval.

    .venv/bin/python -m benchmarks.load_sampler_kill           # 50 kills (docs/reliability.md)
    .venv/bin/python -m benchmarks.load_sampler_kill -k 10 --seed 7

Each round starts ``coloc-sampler run`` (replaying the H100 NVML recording of tests/data/nvml, labelled there,
every 0.1 s, flushing every ``--batch-s``) on a node database that another process keeps writing to (a hook-like
writer: one ``hook_runs`` row every 20 ms, each its own transaction), waits ~1 s of start-up plus one flush interval
plus a random 0.3..2.0 s, SIGKILLs it, and
checks the file. Lost samples of a kill = frames whose time lies between the last committed frame and the kill
(frame times are the sampler's read times, one per interval). No GPU and no Slurm needed.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parents[1]
REC = REPO / "tests" / "data" / "nvml" / "h100_mps_2jobs.jsonl"
INTERVAL_S = 0.1


def _writer(db_path: str, stop_at: float) -> None:
    from slurm_coloc.store import jobs as store_jobs
    from slurm_coloc.store.db import open_node_db
    db = open_node_db(db_path, busy_timeout_s=5)
    i = 0
    while time.time() < stop_at:
        try:
            store_jobs.record_hook_run(db, store_jobs.HookRun(job_id=i, node="k1", hook="prolog", ts=time.time(),
                                                              duration_ms=1.0, ok=True, detail={"load": i}))
        except sqlite3.Error:
            pass
        i += 1
        time.sleep(0.02)


def kill_campaign(workdir: Path, kills: int, seed: int, batch_s: float = INTERVAL_S) -> Dict[str, object]:
    """Run the campaign in ``workdir``; return per-kill results and totals (see the module docstring)."""
    rnd = random.Random(seed)
    state, conf = workdir / "state", workdir / "coloc.yaml"
    conf.write_text(json.dumps({"state_dir": str(state), "run_dir": str(workdir / "run"),
                                "log_dir": str(workdir / "log"), "sampler_interval_s": INTERVAL_S,
                                "sampler_batch_s": batch_s}))
    db_path = state / "nodes" / "k1.db"
    env = {**os.environ, "COLOC_CONFIG": str(conf)}
    argv = [sys.executable, "-m", "slurm_coloc.cli.sampler", "run", "--node", "k1", "--replay", str(REC),
            "--interval-s", str(INTERVAL_S), "--foreground-log"]
    writer = multiprocessing.Process(target=_writer, args=(str(db_path), time.time() + 3600), daemon=True)
    results: List[Dict[str, object]] = []
    try:
        subprocess.run(argv + ["--duration-s", "0.3"], env=env, cwd=REPO, capture_output=True, timeout=60)
        writer.start()
        for k in range(kills):
            p = subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            t_start = time.time()
            time.sleep(1.0 + batch_s + rnd.uniform(0.3, 2.0))  # start-up, a first flush, then a random moment
            t_kill = time.time()
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
            conn = sqlite3.connect(str(db_path), timeout=10)
            check = conn.execute("PRAGMA integrity_check").fetchone()[0]
            frames = [r[0] for r in conn.execute("SELECT DISTINCT ts FROM gpu_samples WHERE ts >= ? ORDER BY ts",
                                                 [t_start])]
            conn.close()
            last = frames[-1] if frames else None
            lost = int((t_kill - last) / INTERVAL_S) if last else None
            results.append({"kill": k, "integrity": check, "frames_committed": len(frames), "lost_frames": lost,
                            "gap_s": round(t_kill - last, 3) if last else None})
    finally:
        if writer.is_alive():
            writer.terminate()
            writer.join()
    hook_rows = sqlite3.connect(str(db_path)).execute("SELECT count(*) FROM hook_runs").fetchone()[0]
    lost = [r["lost_frames"] for r in results if r["lost_frames"] is not None]
    return {"kills": kills, "batch_s": batch_s, "integrity_ok": sum(r["integrity"] == "ok" for r in results),
            "rounds_with_frames": len(lost), "lost_max": max(lost) if lost else None,
            "lost_mean": sum(lost) / len(lost) if lost else None, "writer_rows": hook_rows,
            "allowed_frames": int(round(batch_s / INTERVAL_S)) + 1, "results": results}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-k", "--kills", type=int, default=50)
    ap.add_argument("--seed", type=int, default=20261122)
    ap.add_argument("--batch-s", type=float, default=INTERVAL_S)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="coloc-kill-") as tmp:
        r = kill_campaign(Path(tmp), a.kills, a.seed, a.batch_s)
    from rich.console import Console
    from rich.table import Table
    t = Table(title=f"coloc-sampler SIGKILLed {a.kills} times under write load (interval {INTERVAL_S} s, "
                    f"flush every {a.batch_s} s)")
    t.add_column("figure")
    t.add_column("value")
    for row in (("integrity_check ok", f"{r['integrity_ok']}/{r['kills']}"),
                ("rounds with committed frames", f"{r['rounds_with_frames']}/{r['kills']}"),
                ("frames lost per kill: max / mean", f"{r['lost_max']} / {r['lost_mean'] or 0:.2f}"),
                ("allowed (one flush interval + the frame in flight)", str(r["allowed_frames"])),
                ("concurrent writer rows committed", str(r["writer_rows"]))):
        t.add_row(*row)
    Console().print(t)
    ok = r["integrity_ok"] == r["kills"] == r["rounds_with_frames"] and r["lost_max"] <= r["allowed_frames"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
