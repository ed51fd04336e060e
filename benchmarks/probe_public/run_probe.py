"""Probe every script of the public corpus (``setup_corpus.py``), one at a time; print and keep the results.

For each job of ``<root>/corpus.json``, in a fresh ``XDG_CACHE_HOME`` (an empty probe cache):

1. ``probe_script(job, submit_dir=<its folder>, use_cache=True, keep_log=True, python=--python)``: a cache
   miss, so a full probe (the uncached wall time); it stores the answer;
2. the same call again: the cached repeat (wall time of a cache hit).

Keeps each ``--explain``-like record (ran line, notes, reason, figure, the log's last 30 lines) in ``--out``
(JSON), prints a table (script, figure MiB, probe wall s, cached s, reason) and the summary against the issue's
targets (>= 90% estimated, uncached p90 <= 15 s, cached <= 0.3 s), and writes the table, the summary and, for
each script without a figure, its reason and last 30 log lines to ``--md`` after every script.

The probe comes from whatever ``slurm_coloc`` is first on ``PYTHONPATH`` (this repository's only as a last
resort), so another worktree's probe can be measured::

    PYTHONPATH=/work/wt/t29fake /work/wt/t29fake/.venv/bin/python -m benchmarks.probe_public.run_probe \
        --root .pub --python /work/wt/t29fake/.venv/bin/python --md /work/wt/t29corpus-results.md [NAME...]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))

TARGETS = {"estimated_pct": 90.0, "p90_uncached_s": 15.0, "cached_s": 0.3}


def _pctl(xs: List[float], q: float) -> Optional[float]:
    """Nearest-rank percentile ``q`` (0-100) of ``xs``; None when empty."""
    if not xs:
        return None
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, int(-(-q * len(s) // 100)) - 1))]


def probe_one(root: str, row: Dict[str, Any], python: Optional[str], timeout_s: Optional[float]) -> Dict[str, Any]:
    from slurm_coloc.probe.probe import probe_script

    job = os.path.join(root, row["job"])
    kw: Dict[str, Any] = {"submit_dir": os.path.join(root, row["submit_dir"]), "keep_log": True, "python": python}
    if timeout_s:
        kw["timeout_s"] = timeout_s
    old = os.environ.get("XDG_CACHE_HOME")
    with tempfile.TemporaryDirectory(prefix="pubcache-") as cache_home:
        os.environ["XDG_CACHE_HOME"] = cache_home
        try:
            load1 = os.getloadavg()[0]
            t0 = time.monotonic()
            r = probe_script(job, use_cache=True, **kw)
            wall = time.monotonic() - t0
            t1 = time.monotonic()
            again = probe_script(job, use_cache=True, **kw)
            cached_s = time.monotonic() - t1
        finally:
            if old is None:
                os.environ.pop("XDG_CACHE_HOME", None)
            else:
                os.environ["XDG_CACHE_HOME"] = old
    est = r.estimate
    detail = r.detail or {}
    return {
        "script": row["name"], "repo": row["repo"], "commit": row["commit"], "origin": row["origin"],
        "command": row["command"], "cpu_only": row.get("cpu_only", False), "expect_fail": row.get("expect_fail", ""),
        "figure_mib": est.mem_mib if est else None,
        "flops_per_step": getattr(est, "flops_per_step", None) if est else None,
        "probe_wall_s": round(wall, 2), "first_call_cached": r.cached, "load1_before": round(load1, 1),
        "cached_s": round(cached_s, 3), "cached_hit": again.cached,
        "cached_same": (again.estimate.mem_mib if again.estimate else None) == (est.mem_mib if est else None),
        "second_figure_mib": again.estimate.mem_mib if again.estimate else None, "second_reason": again.reason,
        "reason": r.reason, "ran": r.ran, "notes": detail.get("notes", []),
        "peak_reserved_mib": round((detail.get("peak_reserved_b") or 0) / 2**20, 1),
        "torch": detail.get("torch"), "scratch_files": len(detail.get("scratch_files") or []),
        "log_tail": "\n".join((r.log_text or "").splitlines()[-30:]),
    }


def summary(rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    walls = [r["probe_wall_s"] for r in rows]
    hits = [r["cached_s"] for r in rows if r["cached_hit"]]
    n_est = sum(1 for r in rows if r["figure_mib"] is not None)
    runnable = [r for r in rows if not r.get("expect_fail")]
    return {"scripts": len(rows), "estimated": n_est, "runnable": len(runnable),
            "estimated_of_runnable": sum(1 for r in runnable if r["figure_mib"] is not None),
            "estimated_pct": round(100.0 * n_est / len(rows), 1) if rows else None,
            "p50_uncached_s": _pctl(walls, 50), "p90_uncached_s": _pctl(walls, 90),
            "max_uncached_s": max(walls) if walls else None,
            "cached_hits": len(hits), "max_cached_s": max(hits) if hits else None,
            "p50_cached_s": _pctl(hits, 50), "targets": TARGETS}


def table(rows: List[Dict[str, Any]]) -> str:
    head = "| script | figure MiB | probe wall s | load | cached s | reason |\n|---|---:|---:|---:|---:|---|"
    lines = [head]
    for r in rows:
        fig = "-" if r["figure_mib"] is None else str(r["figure_mib"])
        cached = f"{r['cached_s']:.3f}" + ("" if r["cached_hit"] else " (miss)")
        if not r.get("cached_same", True):
            cached += f" (2nd: {r.get('second_figure_mib') or '-'} MiB {(r.get('second_reason') or '')[:60]})"
        reason = (r["reason"] or "").replace("|", "/").replace("\n", " ")[:160]
        load = r.get("load1_before", "-")
        lines.append(f"| {r['script']} | {fig} | {r['probe_wall_s']:.1f} | {load} | {cached} | {reason} |")
    return "\n".join(lines)


def summary_lines(s: Dict[str, Any]) -> str:
    def f(x: Optional[float]) -> str:
        return "-" if x is None else f"{x:.2f}"
    return (f"estimated {s['estimated']}/{s['scripts']} ({s['estimated_pct']}%; target >= 90%; "
            f"{s['estimated_of_runnable']}/{s['runnable']} of the scripts that run at all); "
            f"uncached wall p50 {f(s['p50_uncached_s'])} s, p90 {f(s['p90_uncached_s'])} s (target <= 15 s), "
            f"max {f(s['max_uncached_s'])} s; cached max {f(s['max_cached_s'])} s over {s['cached_hits']} hits "
            f"(target <= 0.3 s)")


def write_md(path: str, rows: List[Dict[str, Any]], meta: Dict[str, Any], done: bool) -> None:
    s = summary(rows)
    out = [f"# Public corpus probe results ({'complete' if done else 'in progress'})", "",
           f"{meta['when']} UTC; probe from `{meta['slurm_coloc']}` ({meta['probe_commit']}); "
           f"interpreter `{meta['python']}`; corpus `{meta['root']}`; command: `{meta['argv']}`", "",
           table(rows), "", summary_lines(s), ""]
    if meta.get("notes") and os.path.exists(meta["notes"]):
        with open(meta["notes"], encoding="utf-8") as fh:
            out += [fh.read(), ""]
    fails = [r for r in rows if r["figure_mib"] is None]
    if fails:
        out.append("## Scripts without a figure")
    for r in fails:
        out += ["", f"### {r['script']}", "", f"- command: `{r['command']}`", f"- ran: {r['ran']}",
                f"- reason: {r['reason']}",
                f"- expected to fail: {r['expect_fail']}" if r.get("expect_fail") else "- expected to run: yes",
                f"- notes: {r['notes']}", "", "```", r["log_tail"] or "(no log)", "```"]
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write("\n".join(out) + "\n")
    os.replace(tmp, path)


def _probe_commit(pkg_dir: str) -> str:
    """``<commit> <time>`` of the probe's checkout, or a copy's ``SNAPSHOT`` file (what it was copied from)."""
    import subprocess
    snap = os.path.join(pkg_dir, "SNAPSHOT")
    if os.path.exists(snap):
        with open(snap) as fh:
            return "snapshot of " + fh.read().strip()
    try:
        head = subprocess.run(["git", "-C", pkg_dir, "log", "-1", "--format=%h %cd", "--date=format:%H:%M"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", pkg_dir, "status", "--short", "--", "slurm_coloc/probe"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head + (" + uncommitted probe changes" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "?"


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=".pub")
    ap.add_argument("--python", default=None, help="the job's interpreter (default: what the script names)")
    ap.add_argument("--timeout-s", type=float, default=None, help="probe time limit (default: the probe's)")
    ap.add_argument("--out", default=None, help="results JSON (default: <root>/probe_results.json)")
    ap.add_argument("--md", default=None, help="markdown report, rewritten after every script")
    ap.add_argument("--notes", default=None, help="a markdown file appended to --md (observations)")
    ap.add_argument("--render", action="store_true", help="only rewrite --md from --out's JSON (with --notes)")
    ap.add_argument("names", nargs="*")
    args = ap.parse_args(argv)
    root = os.path.abspath(args.root)
    if args.render:
        with open(args.out or os.path.join(root, "probe_results.json")) as fh:
            saved = json.load(fh)
        saved["meta"]["notes"] = args.notes
        with open(os.path.join(root, "corpus.json")) as fh:
            expect = {c["name"]: c.get("expect_fail", "") for c in json.load(fh)["scripts"]}
        for r in saved["rows"]:
            r.setdefault("expect_fail", expect.get(r["script"], ""))
        write_md(args.md, saved["rows"], saved["meta"], done=True)
        print(table(saved["rows"]))
        print(summary_lines(summary(saved["rows"])))
        return 0
    with open(os.path.join(root, "corpus.json")) as fh:
        corpus = json.load(fh)["scripts"]
    corpus = [r for r in corpus if not args.names or r["name"] in args.names]
    import slurm_coloc
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(slurm_coloc.__file__)))
    meta = {"when": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "slurm_coloc": pkg,
            "probe_commit": _probe_commit(pkg), "python": args.python or "(script's)", "root": root,
            "argv": " ".join(sys.argv[1:]), "notes": args.notes}
    out = args.out or os.path.join(root, "probe_results.json")
    rows: List[Dict[str, Any]] = []
    for row in corpus:
        print(f"probing {row['name']} ...", flush=True)
        try:
            res = probe_one(root, row, args.python, args.timeout_s)
        except Exception as exc:  # noqa: BLE001 - a benchmark row, not a crash of the whole run
            res = {"script": row["name"], "repo": row["repo"], "commit": row["commit"], "origin": row["origin"],
                   "command": row["command"], "cpu_only": row.get("cpu_only", False), "figure_mib": None,
                   "probe_wall_s": 0.0, "cached_s": 0.0, "cached_hit": False, "first_call_cached": False,
                   "reason": f"probe_script raised {type(exc).__name__}: {exc}", "ran": "", "notes": [],
                   "log_tail": ""}
        rows.append(res)
        print(f"  {res['figure_mib']} MiB, {res['probe_wall_s']} s, cached {res['cached_s']} s"
              f"{'' if res['cached_hit'] else ' (miss)'}; {res['reason']}", flush=True)
        with open(out, "w") as fh:
            json.dump({"meta": meta, "summary": summary(rows), "rows": rows}, fh, indent=1)
        if args.md:
            write_md(args.md, rows, meta, done=False)
    if args.md:
        write_md(args.md, rows, meta, done=True)
    print()
    print(table(rows))
    print()
    print(summary_lines(summary(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
