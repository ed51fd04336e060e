#!/usr/bin/env python3
"""Each script of a corpus through ``coloc-sbatch --dry-run --explain`` as a user would submit it (issue 45).

    .venv/bin/python -m benchmarks.probe_public.setup_corpus --manifest benchmarks/probe_unseen/manifest.yaml \\
        --out /tmp/unseen
    .venv/bin/python -m benchmarks.probe_unseen.run --root /tmp/unseen [--out results.json] [names...]

Reads ``<root>/corpus.json`` (``setup_corpus.py``), runs ``coloc-sbatch --dry-run --explain job_<name>.sh`` in
each script's directory one at a time with a fresh per-user cache, and prints a table: the request
(``shard:N``/whole GPU), the probe's figure (MiB) or the one-line reason it gave none, seconds. Needs no cluster.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List


def probe_one(root: str, row: Dict[str, Any], sbatch: str, cache: str) -> Dict[str, Any]:
    """One ``coloc-sbatch --dry-run --explain`` of ``row`` (a ``corpus.json`` row): what it asked for and why."""
    cwd = os.path.join(root, row["submit_dir"])
    env = dict(os.environ, XDG_CACHE_HOME=cache)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    t0 = time.monotonic()
    proc = subprocess.run([sbatch, "--dry-run", "--explain", os.path.basename(row["job"])], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - t0
    mem = re.search(r'"mem_mib":(\d+),"method":"probe"', proc.stdout)
    gres = re.search(r"--gres=(\S+)", proc.stdout)
    reason = next((ln.split("probe: no figure: ", 1)[1] for ln in proc.stderr.splitlines()
                   if "probe: no figure: " in ln), "")
    ran = next((ln.split("probe: ", 1)[1] for ln in proc.stderr.splitlines()
                if "explain: probe: probe ran" in ln), "")
    notes = [ln.split("explain: ", 1)[1] for ln in proc.stderr.splitlines() if "explain: probe: note" in ln]
    return {"name": row["name"], "repo": row["repo"], "commit": row["commit"], "command": row["command"],
            "rc": proc.returncode, "gres": gres.group(1) if gres else "", "probe_mib": int(mem.group(1)) if mem
            else None, "reason": reason or ("" if mem else proc.stderr.strip().splitlines()[-1:]),
            "ran": ran, "notes": notes, "wall_s": round(wall, 1)}


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default="/tmp/unseen")
    ap.add_argument("--out", default="", help="write the records as JSON here")
    ap.add_argument("names", nargs="*")
    args = ap.parse_args(argv)
    with open(os.path.join(args.root, "corpus.json")) as fh:
        rows = [r for r in json.load(fh)["scripts"] if not args.names or r["name"] in args.names]
    sbatch = os.path.join(os.path.dirname(sys.executable), "coloc-sbatch")
    out = []
    with tempfile.TemporaryDirectory(prefix="coloc-unseen-cache-") as cache:
        for row in rows:
            rec = probe_one(args.root, row, sbatch, cache)
            out.append(rec)
            fig = f"{rec['probe_mib']:,} MiB" if rec["probe_mib"] else "fallback"
            print(f"{rec['name']:<16} {rec['gres']:<10} {fig:>11} {rec['wall_s']:6.1f} s  {rec['reason']}"[:400],
                  flush=True)
    est = sum(1 for r in out if r["probe_mib"])
    print(f"estimated {est} of {len(out)}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
