"""Device benchmark driver (issue 8): runs the scenarios through coloc-sbatch on the cluster that
``cluster_gpu.sh`` started, collects every job's ``COLOC_BENCH`` line and writes results + a table.

Usage (root, on the machine with the cluster, from the source tree the cluster runs, ``/opt/coloc/src``, whose
``slurm_coloc`` it imports):
  python3 -m benchmarks.device.bench [--out DIR] collocate --workload small_cnn --k 7 --measure-s 15
  python3 -m benchmarks.device.bench oom | two-users | report
Scenarios:
  collocate  k jobs each on a whole GPU one after another (``--exclusive-gpu``), then the same k jobs through
             coloc-sbatch's estimate (shards, MPS); speedup = aggregate samples/s of the collocated jobs over
             the window where all k overlap, divided by the mean samples/s of one job alone.
  oom        a healthy ResNet-18 shard job; 5 s later an offender (ResNet-50/224) with ``--coloc-mem 2G``: the
             MPS fence makes it OOM, EpilogSlurmctld reruns it once on a whole GPU; the neighbour's timeline
             shows whether its throughput dipped.
  two-users  colocuser and colocuser2 each submit a ResNet-18 shard job at once (multi-user MPS).
Results: <out>/results.json (one entry per scenario, appended), job outputs under <root>/jobs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from slurm_coloc.slurm.jobs import squeue_all
from slurm_coloc.slurm.parse import FINAL_STATES

ROOT = Path(os.environ.get("COLOC_BENCH_ROOT", "/opt/coloc"))
HERE = ROOT / "src" / "benchmarks" / "device"
JOBS = ROOT / "jobs"

FINAL = FINAL_STATES


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def user_env(user: str) -> Dict[str, str]:
    """The submit environment of a job user: the machine's own LD_LIBRARY_PATH, never the bundle's."""
    env = {
        "PATH": f"{ROOT}/venv/bin:{ROOT}/bin:/usr/local/nvidia/bin:/usr/bin:/bin",
        "HOME": f"/home/{user}",
        "USER": user,
        "LOGNAME": user,
        "SLURM_CONF": f"{ROOT}/etc/slurm.conf",
        "COLOC_CONFIG": f"{ROOT}/etc/coloc.yaml",
        "COLOC_BENCH_DIR": str(HERE),
        "COLOC_BENCH_PY": os.environ.get("COLOC_BENCH_PYTHON", "/opt/torch/.venv/bin/python3"),
        "PYTHONUNBUFFERED": "1",
    }
    if os.environ.get("COLOC_BENCH_LD_LIBRARY_PATH"):
        env["LD_LIBRARY_PATH"] = os.environ["COLOC_BENCH_LD_LIBRARY_PATH"]
    return env


def submit(user: str, script: str, opts: Sequence[str] = (), args: Sequence[str] = (), tag: str = "") -> int:
    """``coloc-sbatch --parsable [opts] script [args]`` as ``user``; returns the job id."""
    cmd = [
        "runuser",
        "-u",
        user,
        "--",
        "env",
        "-i",
        *[f"{k}={v}" for k, v in user_env(user).items()],
        f"{ROOT}/venv/bin/coloc-sbatch",
        "--parsable",
        "-o",
        f"{JOBS}/{tag or 'job'}-%j.out",
        *opts,
        str(HERE / script),
        *args,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=str(JOBS), timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"coloc-sbatch failed ({proc.returncode}): {proc.stderr.strip()}")
    job = int(proc.stdout.strip().split(";")[0])
    log(f"submitted {job} as {user}: {script} {' '.join(opts)} -> {proc.stderr.strip()}")
    return job


def submit_many(calls: Sequence[Tuple[str, str, Sequence[str], Sequence[str], str]]) -> List[int]:
    """Submit several jobs at once (coloc-sbatch estimates on the meta device: ~seconds each)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(lambda c: submit(*c), calls))


def slurm_env() -> Dict[str, str]:
    return {**os.environ, "SLURM_CONF": f"{ROOT}/etc/slurm.conf"}


def jobs_now() -> Dict[int, Any]:
    return {r.job_id: r for r in squeue_all(str(ROOT / "bin"), slurm_env())}


def wait(job_ids: Sequence[int], timeout_s: float, follow_retries: bool = True) -> Dict[int, Any]:
    """Wait until every job (and every OOM retry whose comment names one of them) is final."""
    deadline = time.time() + timeout_s
    while True:
        recs = jobs_now()
        want = set(job_ids)
        if follow_retries:
            want |= {j for j, r in recs.items() if any(f"oom-retry-of-{i}" in r.comment for i in job_ids)}
        pending = [j for j in want if j not in recs or recs[j].state not in FINAL]
        if not pending:
            return {j: recs[j] for j in want}
        if time.time() > deadline:
            log(f"timeout waiting for {pending}")
            return {j: recs[j] for j in want if j in recs}
        time.sleep(1.0)


def bench_line(job_id: int, tag: str) -> Optional[Dict[str, Any]]:
    """The job's COLOC_BENCH record, searched in every ``<tag>-*.out`` (an OOM rerun appends to its
    original's)."""
    for path in sorted(JOBS.glob(f"{tag}-*.out")):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("COLOC_BENCH "):
                rec = json.loads(line[len("COLOC_BENCH ") :])
                if str(rec.get("job_id")) == str(job_id):
                    return rec
    return None


def samples_at(timeline: List[List[float]], t: float) -> float:
    """Cumulative samples at time ``t`` by linear interpolation of a job's ``[t, samples]`` timeline."""
    if t <= timeline[0][0]:
        return timeline[0][1]
    for (ta, sa), (tb, sb) in zip(timeline, timeline[1:]):
        if ta <= t <= tb:
            return sa + (sb - sa) * (t - ta) / (tb - ta) if tb > ta else sb
    return timeline[-1][1]


def overlap_throughput(recs: List[Dict[str, Any]]) -> Tuple[float, float, float]:
    """(aggregate samples/s, window start, window length s) over the window where every job is measuring."""
    a = max(r["timeline"][0][0] for r in recs)
    b = min(r["timeline"][-1][0] for r in recs)
    if b <= a:
        return 0.0, a, 0.0
    total = sum(samples_at(r["timeline"], b) - samples_at(r["timeline"], a) for r in recs)
    return total / (b - a), a, b - a


def job_summary(j: int, r: Any, rec: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    return {
        "job_id": j,
        "state": r.state if r else None,
        "user": r.user_name if r else None,
        "tres": r.tres_per_node if r else None,
        "comment": (r.comment[:200] if r else None),
        "submit": r.submit_ts if r else None,
        "start": r.start_ts if r else None,
        "end": r.end_ts if r else None,
        "bench": {k: v for k, v in (rec or {}).items() if k != "timeline"} or None,
    }


def collocate(a: argparse.Namespace) -> Dict[str, Any]:
    script = f"job_{a.workload}.sh"
    out: Dict[str, Any] = {
        "scenario": "collocate",
        "workload": a.workload,
        "k": a.k,
        "measure_s": a.measure_s,
    }
    runs = {}
    for mode in ["exclusive", "coloc"] if not a.coloc_only else ["coloc"]:
        tag = f"{a.workload}-{mode}-k{a.k}"
        opts = ["--exclusive-gpu"] if mode == "exclusive" else list(a.coloc_opts or [])
        measure = a.measure_s if mode == "exclusive" else (a.coloc_measure_s or a.measure_s)
        margs = ["--warmup-s", str(a.warmup_s), "--measure-s", str(measure)]
        t_sub = time.time()
        n = a.k if mode == "coloc" else (a.exclusive_k or a.k)
        ids = submit_many([("colocuser", script, opts, [*margs, "--tag", tag], tag)] * n)
        recs = wait(ids, a.timeout_s)
        t_done = time.time()
        benches = {j: bench_line(j, tag) for j in recs}
        ok = [b for j, b in benches.items() if b and recs[j].state == "COMPLETED"]
        lost = [j for j in ids if recs.get(j) is None or recs[j].state != "COMPLETED"]
        retries = [j for j in recs if j not in ids]
        run: Dict[str, Any] = {
            "jobs": [job_summary(j, recs.get(j), benches.get(j)) for j in recs],
            "completed": len(ok),
            "not_completed": lost,
            "oom_retries": retries,
            "makespan_s": max(r.end_ts or 0 for r in recs.values()) - min(r.submit_ts or 0 for r in recs.values())
            if recs
            else None,
            "wall_s": t_done - t_sub,
        }
        rates = [b["samples_per_s"] for b in ok]
        run["per_job_samples_per_s"] = rates
        if mode == "exclusive":
            run["single_job_samples_per_s"] = statistics.mean(rates) if rates else None
            run["single_job_spread"] = [min(rates), max(rates)] if rates else None
        else:
            agg, w0, wlen = overlap_throughput(ok) if len(ok) == a.k else (0.0, 0.0, 0.0)
            run["aggregate_samples_per_s"] = agg
            run["overlap_window_s"] = wlen
            run["mps_jobs"] = sum(1 for b in ok if (b.get("env") or {}).get("COLOC_SHARE") == "mps")
        runs[mode] = run
        log(f"{tag}: {json.dumps({k: v for k, v in run.items() if k != 'jobs'})}")
    out["runs"] = runs
    if (
        "exclusive" in runs
        and runs["exclusive"]["single_job_samples_per_s"]
        and runs["coloc"].get("aggregate_samples_per_s")
    ):
        out["speedup"] = (
            runs["coloc"]["aggregate_samples_per_s"] / runs["exclusive"]["single_job_samples_per_s"]
        )
        out["makespan_ratio"] = runs["exclusive"]["makespan_s"] / max(1, runs["coloc"]["makespan_s"])
    log(f"RESULT collocate {a.workload} k={a.k}: speedup {out.get('speedup')}")
    return out


def dip(neighbour: Dict[str, Any], t_a: float, t_b: float) -> Dict[str, Any]:
    """The neighbour's rate before ``t_a``, during [t_a, t_b] and after ``t_b`` (samples/s)."""
    tl = neighbour["timeline"]

    def rate(x: float, y: float) -> Optional[float]:
        x, y = max(x, tl[0][0]), min(y, tl[-1][0])
        return (samples_at(tl, y) - samples_at(tl, x)) / (y - x) if y - x > 0.5 else None

    return {"before": rate(tl[0][0], t_a), "during": rate(t_a, t_b), "after": rate(t_b, tl[-1][0])}


def oom(a: argparse.Namespace) -> Dict[str, Any]:
    tag = "oom"
    healthy = submit(
        "colocuser",
        "job_resnet18_32.sh",
        [],
        ["--warmup-s", "3", "--measure-s", str(a.measure_s), "--tag", "oom-neighbour"],
        tag,
    )
    time.sleep(a.offset_s)
    offender = submit(
        "colocuser",
        "job_generic.sh",
        ["--coloc-mem", a.offender_mem],
        ["resnet50_224", "--warmup-s", "2", "--measure-s", "8", "--tag", "oom-offender"],
        tag,
    )
    recs = wait([healthy, offender], a.timeout_s)
    retries = [j for j in recs if j not in (healthy, offender)]
    out: Dict[str, Any] = {
        "scenario": "oom",
        "healthy": healthy,
        "offender": offender,
        "retries": retries,
        "jobs": [job_summary(j, recs.get(j), bench_line(j, tag)) for j in recs],
    }
    off_rec = recs.get(offender)
    out_text = (
        (JOBS / f"{tag}-{offender}.out").read_text(errors="replace")
        if (JOBS / f"{tag}-{offender}.out").exists()
        else ""
    )
    out["offender_oom_line"] = next(
        (ln for ln in out_text.splitlines() if "out of memory" in ln.lower()), None
    )
    hb = bench_line(healthy, tag)
    if hb and off_rec and off_rec.start_time:
        out["neighbour_rate"] = dip(hb, off_rec.start_time, off_rec.end_time or off_rec.start_time)
    out["lost"] = [
        j for j in (healthy,) + tuple(retries) if recs.get(j) is None or recs[j].state != "COMPLETED"
    ]
    out["ok"] = (
        recs.get(healthy) is not None
        and recs[healthy].state == "COMPLETED"
        and len(retries) == 1
        and recs[retries[0]].state == "COMPLETED"
        and off_rec is not None
        and off_rec.state != "COMPLETED"
    )
    log(f"RESULT oom: {json.dumps({k: v for k, v in out.items() if k != 'jobs'})}")
    return out


def two_users(a: argparse.Namespace) -> Dict[str, Any]:
    tag = "users"
    users = ("colocuser", "colocuser2")
    ids = dict(
        zip(
            users,
            submit_many(
                [
                    (
                        u,
                        "job_resnet18_32.sh",
                        [],
                        ["--warmup-s", "3", "--measure-s", str(a.measure_s), "--tag", f"user-{u}"],
                        tag,
                    )
                    for u in users
                ]
            ),
        )
    )
    recs = wait(list(ids.values()), a.timeout_s)
    benches = {u: bench_line(j, tag) for u, j in ids.items()}
    out: Dict[str, Any] = {
        "scenario": "two-users",
        "jobs": [job_summary(j, recs.get(j), bench_line(j, tag)) for j in recs],
    }
    if all(benches.values()):
        b = list(benches.values())
        out["overlap_s"] = min(x["t1"] for x in b) - max(x["t0"] for x in b)
        out["mps_both"] = all((x.get("env") or {}).get("COLOC_SHARE") == "mps" for x in b)
        out["users_seen_by_slurm"] = {u: recs[j].user_name for u, j in ids.items()}
    log(f"RESULT two-users: {json.dumps({k: v for k, v in out.items() if k != 'jobs'})}")
    return out


def summary(path: Path) -> int:
    """Print a markdown table of every result in ``results.jsonl`` (speedups use the k-job exclusive rate
    of the same workload when a collocation run had no exclusive part)."""
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    single: Dict[str, float] = {}
    for r in rows:
        ex = r.get("runs", {}).get("exclusive")
        if ex and ex.get("single_job_samples_per_s"):
            single[r["workload"]] = ex["single_job_samples_per_s"]
    print(
        "| scenario | k | one job alone (samples/s) | collocated aggregate (samples/s) | speedup | "
        "overlap s | MPS jobs | completed | OOM retries | makespan excl / coloc (s) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["scenario"] != "collocate":
            continue
        co, ex = r["runs"].get("coloc", {}), r["runs"].get("exclusive", {})
        one = single.get(r["workload"])
        agg = co.get("aggregate_samples_per_s")
        sp = agg / one if agg and one else None
        print(
            f"| {r['workload']} | {r['k']} | {one and round(one)} | {agg and round(agg)} | "
            f"{sp and round(sp, 2)} | {co.get('overlap_window_s') and round(co['overlap_window_s'], 1)} | "
            f"{co.get('mps_jobs')} | {co.get('completed')}/{r['k']} | {len(co.get('oom_retries') or [])} | "
            f"{ex.get('makespan_s')} / {co.get('makespan_s')} |"
        )
    for r in rows:
        if r["scenario"] in ("oom", "two-users"):
            print(f"{r['scenario']}: " + json.dumps({k: v for k, v in r.items() if k not in ("jobs", "t")}))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="slurm-coloc device benchmarks (issue 8)")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collocate")
    c.add_argument("--workload", required=True)
    c.add_argument("--k", type=int, default=7)
    c.add_argument("--warmup-s", type=float, default=4.0)
    c.add_argument("--measure-s", type=float, default=15.0)
    c.add_argument(
        "--coloc-measure-s", type=float, help="steady window of the collocated jobs (default --measure-s)"
    )
    c.add_argument("--timeout-s", type=float, default=400.0)
    c.add_argument("--coloc-only", action="store_true")
    c.add_argument(
        "--exclusive-k", type=int, help="jobs of the exclusive baseline (default --k; only its rate counts)"
    )
    c.add_argument("--coloc-opts", nargs="*")
    o = sub.add_parser("oom")
    o.add_argument("--measure-s", type=float, default=40.0)
    o.add_argument("--offset-s", type=float, default=8.0)
    o.add_argument("--offender-mem", default="2G")
    o.add_argument("--timeout-s", type=float, default=240.0)
    u = sub.add_parser("two-users")
    u.add_argument("--measure-s", type=float, default=12.0)
    u.add_argument("--timeout-s", type=float, default=120.0)
    sub.add_parser("summary")
    a = ap.parse_args(argv)
    if a.cmd == "summary":
        return summary(Path(a.out) / "results.jsonl")
    fn = {"collocate": collocate, "oom": oom, "two-users": two_users}[a.cmd]
    res = fn(a)
    res["t"] = time.time()
    with open(Path(a.out) / "results.jsonl", "a") as fh:
        fh.write(json.dumps(res) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
