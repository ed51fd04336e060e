"""Time of a cached ``coloc-sbatch --dry-run`` answer, per interpreter form (issue 29: <= 0.3 s cached).

Makes a small project in a temp dir: a venv that sees this environment's torch (``python3 -m venv
--without-pip`` + a ``.pth`` file), a 2-layer training program, and one batch script per form (plain
``python`` on the submitting PATH, ``export PATH=<venv>/bin:$PATH``, ``source <venv>/bin/activate``, a
sourced ``module`` function then the venv, ``--wrap``). Each form is submitted once (the probe runs and
fills the cache), then ``--repeat`` times more; the table gives the median wall time of those cached
answers and their median CPU time (user + system of the whole ``coloc-sbatch`` process tree), which on
a shared machine says more than wall time. ``--baseline PYTHON`` times the plain form with another
checkout's interpreter (e.g. ``/work/main/.venv/bin/python``) in the same run.

    .venv/bin/python -m benchmarks.probe_corpus.cached_submit [--repeat 7] [--baseline /work/main/.venv/bin/python]
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRAIN_PY = """\
import torch
m = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).cuda()
opt = torch.optim.Adam(m.parameters())
for _ in range(3):
    m(torch.randn(32, 256, device="cuda")).sum().backward()
    opt.step()
"""


def make_project(root: Path) -> dict:
    import torch

    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python3*/site-packages"))
    (site / "torch-here.pth").write_text(str(Path(torch.__file__).parent.parent) + "\n")
    (root / "train.py").write_text(TRAIN_PY)
    (root / "lmod.sh").write_text("module() { [ \"$1\" = load ] && export LMOD_LOADED=\"$2\"; true; }\n")
    forms = {
        "plain python (PATH)": "python train.py\n",
        "export PATH=venv/bin": f"export PATH={venv}/bin:$PATH\npython train.py --form 2\n",
        "source venv/bin/activate": f"source {venv}/bin/activate\npython train.py --form 3\n",
        "module load + venv": f"source {root}/lmod.sh\nmodule load python/3.11\nsource {venv}/bin/activate\n"
                              "srun --ntasks=1 python train.py --form 4\n",
    }
    scripts = {}
    for i, (name, body) in enumerate(forms.items()):
        p = root / f"job{i}.sh"
        p.write_text("#!/bin/bash\n#SBATCH --gres=gpu:1\n" + body)
        scripts[name] = [str(p)]
    scripts["--wrap"] = ["--wrap", "python train.py --form 5"]
    return {"venv": venv, "scripts": scripts}


def submit(python: str, argv: list, cwd: Path, env: dict) -> tuple:
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    out = subprocess.run([python, "-m", "slurm_coloc", "sbatch", "--dry-run", *argv], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return wall, cpu, out


def in_process(argv: list, root: Path, env: dict, repeat: int) -> float:
    """Median seconds of the cached ``probe_script`` call alone (what this checkout adds to a submission)."""
    from slurm_coloc.probe.probe import probe_script

    old = dict(os.environ)
    os.environ.update(env)
    try:
        times = []
        for _ in range(repeat):
            t0 = time.monotonic()
            if argv[0] == "--wrap":
                r = probe_script("--wrap", submit_dir=str(root), text=f"#!/bin/sh\n{argv[1]}\n", environ=env)
            else:
                r = probe_script(argv[0], submit_dir=str(root), environ=env)
            times.append(time.monotonic() - t0)
            assert r.cached, r.reason
        return statistics.median(times)
    finally:
        os.environ.clear()
        os.environ.update(old)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--baseline", help="another checkout's Python, for the plain form")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="coloc-cached-bench-") as tmp:
        root = Path(tmp)
        proj = make_project(root)
        (root / "coloc.yaml").write_text(f"state_dir: {root / 'state'}\n")
        env = {**os.environ, "COLOC_CONFIG": str(root / "coloc.yaml"),
               "PATH": f"{proj['venv']}/bin{os.pathsep}{os.environ.get('PATH', '')}"}
        runs = [(name, sys.executable, argv) for name, argv in proj["scripts"].items()]
        if args.baseline:
            runs.insert(1, ("plain python (PATH), baseline", args.baseline, proj["scripts"]["plain python (PATH)"]))
        print(f"load average at start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
        print("| form | first (probe) s | cached wall s (median) | cached CPU s (median) | probe_script cached s "
              "(in-process, median) | answer |")
        print("|---|---:|---:|---:|---:|---|")
        for name, python, argv in runs:
            run_env = dict(env, XDG_CACHE_HOME=str(root / ("cache-base" if "baseline" in name else "cache")))
            first, _, out = submit(python, argv, root, run_env)
            walls, cpus = [], []
            for _ in range(args.repeat):
                w, c, again = submit(python, argv, root, run_env)
                walls.append(w)
                cpus.append(c)
            line = next((ln for ln in again.stderr.splitlines() if "probe ran" in ln), again.stderr.strip()[-120:])
            cached = "cached" if "(cached)" in line else "NOT cached"
            shards = next((w for w in again.stdout.split() if w.startswith("--gres=")), "?")
            inproc = "-" if "baseline" in name else f"{in_process(argv, root, run_env, args.repeat):.3f}"
            print(f"| {name} | {first:.1f} | {statistics.median(walls):.3f} | {statistics.median(cpus):.3f} | "
                  f"{inproc} | {cached}, {shards} |")
        print(f"load average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
