"""Truth under the fence (issue 29, item 9): every public corpus script through ``coloc-sbatch`` on the device harness.

Runs as root on the machine where ``benchmarks/device/cluster_gpu.sh start`` runs the one-node cluster (or here,
with ``COLOC_BENCH_FAKE_GPUS=1``, to check the Slurm parts on CPU). For each script of ``<corpus>/corpus.json``
(``setup_corpus.py``, data already generated):

1. the corpus is copied to ``<root>/jobs/pub`` and handed to ``colocuser``;
2. ``coloc-sbatch --parsable --time=<limit> -o ... job_<name>.sh`` as ``colocuser`` in the job's folder (the
   probe on, as configured: it finds the job's interpreter from the script's ``source <venv>/bin/activate``),
   ``--parallel`` submissions at a time; a job that got a whole GPU (the probe fell back) is cancelled at once:
   it is not an estimated script;
3. a job whose output shows its first evaluation pass after training (``eval_markers`` of manifest.yaml) is
   cancelled ``--grace-s`` later; the others end at the limit (TIMEOUT) or by themselves;
4. per job: final state, grant (shards x 1 GiB), the sampler's NVML peak (``store.summaries.job_peak_mem_mib``, summed
   over the job's processes per sample), whether it died of CUDA OOM (state OUT_OF_MEMORY, an OOM line in its
   output, or an Epilog retry ``oom-retry-of-<id>``), the retry's state, the output's last lines when not OK.
5. ``--unfenced NAME``: that script once more with ``--exclusive-gpu`` (a whole GPU, no fence) for its NVML peak,
   submitted first (it runs while the other submissions probe; they start when it ends).

Writes ``--out`` (JSON) and prints a table: script, grant MiB, NVML peak MiB, peak/grant %, state, outcome.

Usage (GPU machine, root; after cluster_gpu.sh start and setup_corpus.py)::

    /opt/coloc/venv/bin/python3 -m benchmarks.probe_public.fenced_device --corpus .pubcarry --out $OUT/fenced.json
"""
from __future__ import annotations

import argparse
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Optional

from slurm_coloc import config as config_mod
from slurm_coloc.comment import parse_comment
from slurm_coloc.slurm.jobs import squeue_all
from slurm_coloc.slurm.parse import FINAL_STATES
from slurm_coloc.store.summaries import job_peak_mem_mib

ROOT = Path(os.environ.get("COLOC_BENCH_ROOT", "/opt/coloc"))
JOBS = ROOT / "jobs"
HERE = os.path.dirname(os.path.abspath(__file__))

OOM_RE = re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|CUBLAS_STATUS_ALLOC_FAILED")
USER = "colocuser"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def user_env(user: str = USER) -> Dict[str, str]:
    """The submit environment of the job user (as ``benchmarks/device/bench.py`` gives it)."""
    env = {"PATH": f"{ROOT}/venv/bin:{ROOT}/bin:/usr/local/nvidia/bin:/usr/bin:/bin", "HOME": f"/home/{user}",
           "USER": user, "LOGNAME": user, "SLURM_CONF": f"{ROOT}/etc/slurm.conf",
           "COLOC_CONFIG": f"{ROOT}/etc/coloc.yaml", "PYTHONUNBUFFERED": "1",
           "COLOC_PROBE": "true"}  # the harness's coloc.yaml turns the probe off for its own #COLOC jobs
    if os.environ.get("COLOC_PROBE_TIMEOUT_S"):
        env["COLOC_PROBE_TIMEOUT_S"] = os.environ["COLOC_PROBE_TIMEOUT_S"]
    if os.environ.get("COLOC_BENCH_LD_LIBRARY_PATH"):
        env["LD_LIBRARY_PATH"] = os.environ["COLOC_BENCH_LD_LIBRARY_PATH"]
    return env


def slurm_env() -> Dict[str, str]:
    return {**os.environ, "SLURM_CONF": f"{ROOT}/etc/slurm.conf"}


def job_user(index: int) -> str:
    """A user of its own for the ``index``-th job (``--user-per-job``), created on this disposable machine.

    Not needed since the harness runs slurmstepd as its own program (its title attributes each job's processes);
    kept to show attribution by the one-job-per-uid rule (node/attribution.py, rule 3). The users share the
    corpus folder, so one user's outputs (``model.pt``, timm's ``./output``) can block another's.
    """
    name = f"cpub{index:02d}"
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "-m", "-U", name], check=True, capture_output=True)
    return name


def submit(row: Dict[str, Any], pub: Path, limit_min: int, extra: List[str], tag: str,
           user: str = USER) -> Dict[str, Any]:
    """``coloc-sbatch`` one job as the job user in its folder; the job id and what coloc-sbatch said."""
    job = pub / row["job"]
    cmd = ["runuser", "-u", user, "--", "env", "-i", *[f"{k}={v}" for k, v in user_env(user).items()],
           f"{ROOT}/venv/bin/coloc-sbatch", "--parsable", f"--time={limit_min}", "-o", f"{JOBS}/{tag}-%j.out",
           *extra, str(job)]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=str(job.parent), timeout=300)
    out: Dict[str, Any] = {"script": row["name"], "submit_s": round(time.monotonic() - t0, 1),
                           "coloc_sbatch": proc.stderr.strip()[-1500:], "tag": tag}
    try:
        out["job_id"] = int(proc.stdout.strip().split(";")[0])
    except ValueError:
        out["job_id"] = None
        out["submit_error"] = f"coloc-sbatch exit {proc.returncode}: {proc.stderr.strip()[-300:]}"
    log(f"submitted {row['name']}: {out.get('job_id')} in {out['submit_s']} s")
    return out


def output_of(tag: str, job_id: int) -> str:
    try:
        return (JOBS / f"{tag}-{job_id}.out").read_text(errors="replace")
    except OSError:
        return ""


def scancel(job_id: int) -> None:
    subprocess.run([f"{ROOT}/bin/scancel", str(job_id)], env=slurm_env(), capture_output=True, timeout=30)


def whole_gpu(r: Any) -> bool:
    """The job got a whole GPU: coloc-sbatch's comment says ``mode: whole-gpu`` (all shards of a GPU), or it asked
    for ``gpu`` GRES and no shards."""
    coloc = parse_comment(r.comment) or {}
    return coloc.get("mode") == "whole-gpu" or ("gpu" in r.gres and "shard" not in r.gres)


def watch(subs: List[Dict[str, Any]], markers: Dict[str, str], grace_s: float, wait_s: float) -> Dict[int, Any]:
    """Poll squeue until every job (and each OOM retry) is final; cancel whole-GPU jobs and jobs past their eval."""
    ids = {s["job_id"]: s for s in subs if s.get("job_id")}
    seen_eval: Dict[int, float] = {}
    deadline = time.time() + wait_s
    while True:
        recs = {r.job_id: r for r in squeue_all(str(ROOT / "bin"), slurm_env())}
        for j, s in ids.items():
            r = recs.get(j)
            if r is None or r.state in FINAL_STATES:
                continue
            if whole_gpu(r) and not s.get("unfenced"):
                if not s.get("cancelled"):
                    s["cancelled"] = "whole GPU (probe fell back): not run"
                    scancel(j)
                continue
            pat = markers.get(s["script"])
            if pat and j not in seen_eval and re.search(pat, output_of(s["tag"], j)):
                seen_eval[j] = time.time()
                s["reached_eval"] = True
                log(f"{s['script']} ({j}) passed its first evaluation")
            if j in seen_eval and time.time() - seen_eval[j] >= grace_s and not s.get("cancelled"):
                s["cancelled"] = "after its first evaluation pass"
                scancel(j)
        retries = {r.job_id: r for r in recs.values()
                   if any(f"oom-retry-of-{j}" in (r.comment or "") for j in ids)}
        want = list(ids) + list(retries)
        if all(recs.get(j) is not None and recs[j].state in FINAL_STATES for j in want):
            return recs
        if time.time() > deadline:
            log("wait limit reached; cancelling what is left")
            for j in want:
                scancel(j)
            time.sleep(5)
            return {r.job_id: r for r in squeue_all(str(ROOT / "bin"), slurm_env())}
        time.sleep(2.0)


def result_row(s: Dict[str, Any], recs: Dict[int, Any], cfg: Any) -> Dict[str, Any]:
    j = s.get("job_id")
    r = recs.get(j) if j else None
    text = output_of(s["tag"], j) if j else ""
    retry = next((x for x in recs.values() if f"oom-retry-of-{j}" in (x.comment or "")), None) if j else None
    shards = (r.gres.get("shard") if r else None) or 0
    peak = job_peak_mem_mib(cfg, j, ",".join(r.node_names)) if r and r.node_names else None
    if peak is None and j and cfg.node_db_dir.is_dir():  # the record lost its node list: every node database
        peak = job_peak_mem_mib(cfg, j, ",".join(sorted(p.stem for p in cfg.node_db_dir.glob("*.db"))))
    oom = bool(r and (r.state == "OUT_OF_MEMORY" or OOM_RE.search(text) or retry))
    state = r.state if r else "NOT_SUBMITTED"
    if s.get("cancelled", "").startswith("whole GPU"):
        outcome = "whole GPU (not run)"
    elif oom:
        outcome = "OOM"
    elif state in ("COMPLETED", "TIMEOUT") or (state == "CANCELLED" and s.get("reached_eval")):
        outcome = "OK"
    else:
        outcome = "FAILED"
    coloc = (parse_comment(r.comment) or {}) if r else {}
    row = {"script": s["script"], "job_id": j, "state": state, "outcome": outcome,
           "estimate_mib": coloc.get("mem_mib"), "estimate_method": coloc.get("method"), "mode": coloc.get("mode"),
           "reached_eval": bool(s.get("reached_eval")), "cancelled": s.get("cancelled"),
           "grant_mib": shards * 1024 if shards else None, "gres": dict(r.gres) if r else {},
           "nvml_peak_mib": peak, "run_s": r.run_s if r else None, "submit_s": s.get("submit_s"),
           "comment": (r.comment or "")[:400] if r else None, "coloc_sbatch": s.get("coloc_sbatch"),
           "oom_retry": {"job_id": retry.job_id, "state": retry.state} if retry else None,
           "unfenced": bool(s.get("unfenced"))}
    if peak is not None and row["grant_mib"]:
        row["peak_over_grant_pct"] = round(100.0 * peak / row["grant_mib"], 1)
    if outcome != "OK" or s.get("unfenced"):
        row["output_tail"] = "\n".join(text.splitlines()[-30:])
    if s.get("submit_error"):
        row["submit_error"] = s["submit_error"]
    return row


def table(rows: List[Dict[str, Any]]) -> str:
    lines = ["| script | estimate MiB | grant MiB | NVML peak MiB | peak/grant % | state | eval seen | outcome |",
             "|---|---:|---:|---:|---:|---|---|---|"]
    for r in rows:
        name = r["script"] + (" (unfenced)" if r["unfenced"] else "")
        peak = "-" if r["nvml_peak_mib"] is None else r["nvml_peak_mib"]
        lines.append(f"| {name} | {r.get('estimate_mib') or '-'} | {r['grant_mib'] or '-'} | {peak}"
                     f" | {r.get('peak_over_grant_pct', '-')} | {r['state']}"
                     f" | {'yes' if r['reached_eval'] else 'no'} | {r['outcome']} |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    import yaml
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default=".pubcarry", help="setup_corpus.py's output (data generated)")
    ap.add_argument("--out", default="fenced.json")
    ap.add_argument("--limit-min", type=int, default=2, help="each job's time limit (minutes)")
    ap.add_argument("--parallel", type=int, default=6, help="coloc-sbatch calls (probes) at a time")
    ap.add_argument("--grace-s", type=float, default=10.0)
    ap.add_argument("--wait-s", type=float, default=300.0, help="give up waiting this long after the submissions")
    ap.add_argument("--unfenced", default="", help="one script to run first on a whole GPU (no fence)")
    ap.add_argument("--user-per-job", action="store_true",
                    help="each job as a user of its own (cpubNN, created here): every job's NVML samples attributed")
    ap.add_argument("names", nargs="*")
    a = ap.parse_args(argv)
    with open(os.path.join(HERE, "manifest.yaml")) as fh:
        markers = yaml.safe_load(fh).get("eval_markers") or {}
    corpus = json.loads(Path(a.corpus, "corpus.json").read_text())["scripts"]
    rows = [r for r in corpus if not a.names or r["name"] in a.names]
    pub = JOBS / "pub"
    if pub.exists():
        shutil.rmtree(pub)
    shutil.copytree(a.corpus, pub, symlinks=True)
    pw = pwd.getpwnam(USER)
    subprocess.run(["chown", "-R", f"{pw.pw_uid}:{pw.pw_gid}", str(pub)], check=True)
    cfg = config_mod.load(f"{ROOT}/etc/coloc.yaml")
    t0 = time.time()
    first: List[Dict[str, Any]] = []
    if a.unfenced:  # first: it holds the whole GPU while the others' probes run, then they start
        row = next(r for r in corpus if r["name"] == a.unfenced)
        first = [submit(row, pub, a.limit_min, ["--exclusive-gpu"], f"pub-unfenced-{row['name']}")]
        first[0]["unfenced"] = True
    with ThreadPoolExecutor(max_workers=max(1, a.parallel)) as pool:
        users = [job_user(i) if a.user_per_job else USER for i in range(len(rows))]
        if a.user_per_job:  # the corpus and the outputs are shared by the per-job users (disposable machine)
            subprocess.run(["chmod", "-R", "a+rwX", str(pub)], check=True)
            JOBS.chmod(0o1777)
        subs = list(pool.map(lambda ru: submit(ru[0], pub, a.limit_min, [], f"pub-{ru[0]['name']}", ru[1]),
                             zip(rows, users)))
    log(f"submitted {len(subs) + len(first)} in {time.time() - t0:.0f} s")
    recs = watch(first + subs, markers, a.grace_s, a.wait_s)
    time.sleep(4.0)  # the sampler's last batch
    time.sleep(20.0)  # the samplers write their buffered samples to the node databases every few seconds
    results = [result_row(s, recs, cfg) for s in subs + first]
    fenced = [r for r in results if not r["unfenced"] and r["outcome"] != "whole GPU (not run)"]
    summary = {"fenced_jobs": len(fenced), "ok": sum(r["outcome"] == "OK" for r in fenced),
               "oom": sum(r["outcome"] == "OOM" for r in fenced),
               "failed": sum(r["outcome"] == "FAILED" for r in fenced),
               "whole_gpu_not_run": sum(r["outcome"] == "whole GPU (not run)" for r in results),
               "wall_s": round(time.time() - t0)}
    Path(a.out).write_text(json.dumps({"summary": summary, "rows": results}, indent=1))
    print(table(results))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
