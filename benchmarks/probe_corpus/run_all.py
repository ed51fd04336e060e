"""Probe every corpus script's job.sh and print a table: figure, wall time, cached wall time, reason.

Usage (from the repository root, the venv's bin first on PATH so the job's ``python`` is it)::

    PATH=$PWD/.venv/bin:$PATH .venv/bin/python -m benchmarks.probe_corpus.run_all [--timeout 60] [NAME ...]

Uses a fresh cache directory per run, so the first wall time is a real probe and the second the
cached repeat. The figure is what coloc-sbatch would request before ``headroom_mib`` (MiB).
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from slurm_coloc.probe.probe import probe_script

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*")
    ap.add_argument("--timeout", type=float, default=60.0)
    args = ap.parse_args()
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="probe-cache-")
    names = args.names or sorted(n for n in os.listdir(HERE) if os.path.isfile(os.path.join(HERE, n, "job.sh")))
    rows, walls = [], []
    for name in names:
        d = os.path.join(HERE, name)
        r = probe_script(os.path.join(d, "job.sh"), submit_dir=d, timeout_s=args.timeout)
        t0 = time.monotonic()
        again = probe_script(os.path.join(d, "job.sh"), submit_dir=d, timeout_s=args.timeout)
        cached_s = time.monotonic() - t0
        walls.append(r.wall_s)
        fig = f"{r.estimate.mem_mib:,}" if r.estimate else "-"
        reserved = r.detail.get("peak_reserved_b", 0) / 2**20 if r.estimate else 0
        what = r.reason or f"{r.estimate.detail['precision']}, {', '.join(r.detail.get('optimizers', []))}"
        rows.append((name, fig, f"{reserved:,.0f}", f"{r.wall_s:.1f}", f"{cached_s:.3f}{'' if again.cached else '*'}",
                     what[:110]))
    head = ("script", "probe MiB", "replayed reserved MiB", "wall s", "cached s", "precision/optimizer or reason")
    widths = [max(len(str(x[i])) for x in rows + [head]) for i in range(len(head))]
    for row in [head] + rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
    got = sum(1 for r in rows if r[1] != "-")
    print(f"\n{got}/{len(rows)} with a figure; probe wall time median {statistics.median(walls):.1f} s"
          " (* = repeat not served from the cache)")


if __name__ == "__main__":
    main()
