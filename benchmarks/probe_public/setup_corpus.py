"""Build the public probe corpus: export upstream scripts at pinned commits, generate stand-in data, write jobs.

For each repo of ``manifest.yaml``: ``git --git-dir=<mirror-dir>/<mirror>/repo archive <commit> <paths> | tar -x``
into ``<out>/<repo key>/`` (``ours``: copied from this folder). Then, for each script, the stand-in data its
``data`` entries name (``standin.py``; skipped where already made) and ``<out>/<repo>/<dir>/job_<name>.sh``::

    #!/bin/bash
    #SBATCH --job-name=<name>
    #SBATCH --gres=gpu:1
    #SBATCH --time=<time>
    source <venv>/bin/activate
    <pre lines>
    <command>

Writes ``<out>/corpus.json`` (the scripts with their job paths, repo, commit, command and data), read by
``run_probe.py`` and ``fenced_device.py``.

Usage (repository root)::

    .venv/bin/python -m benchmarks.probe_public.setup_corpus --mirror-dir /work/.mirror --out .pub
    # GPU machine, over a carried export (no mirrors there): data and job files only
    /opt/torch/.venv/bin/python3 -m benchmarks.probe_public.setup_corpus --no-export --out .pub \
        --venv /opt/torch/.venv

``--no-data`` exports and writes jobs only; ``--kinds site`` makes only the data of those kinds (the folder to
carry to the GPU machine: ``--out .pubcarry --kinds site``, 17 MiB; the rest is generated there, where no pip
works); ``--skip-big`` leaves out the data marked ``big`` (VGG-16 weights, 528 MiB). Exit 1 with one line on a
missing mirror or commit.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from typing import Any, Dict, List, Optional

import yaml

from benchmarks.probe_public import standin

HERE = os.path.dirname(os.path.abspath(__file__))


def load_manifest(path: str = os.path.join(HERE, "manifest.yaml")) -> Dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def export_repo(key: str, spec: Dict[str, Any], mirror_dir: str, out: str) -> None:
    """Export ``spec['paths']`` of the pinned commit into ``out/key`` (replacing what was there)."""
    dest = os.path.join(out, key)
    if spec.get("origin") == "ours":
        os.makedirs(dest, exist_ok=True)
        for p in spec["paths"]:
            shutil.copy2(os.path.join(HERE, spec["local"], p), os.path.join(dest, p))
        return
    git_dir = os.path.join(mirror_dir, spec["mirror"], "repo")
    if not os.path.isdir(git_dir):
        raise SystemExit(f"setup_corpus: no mirror {git_dir} for {spec['repo']} (fetch it first)")
    arch = subprocess.run(["git", f"--git-dir={git_dir}", "archive", spec["commit"], *spec["paths"]],
                          capture_output=True)
    if arch.returncode != 0:
        raise SystemExit(f"setup_corpus: git archive {spec['repo']}@{spec['commit'][:10]}: "
                         f"{arch.stderr.decode(errors='replace').strip().splitlines()[-1:]}")
    os.makedirs(dest, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", dest], input=arch.stdout, check=True)
    with open(os.path.join(dest, "UPSTREAM.json"), "w") as fh:
        json.dump({k: spec[k] for k in ("repo", "commit", "paths")}, fh, indent=1)


def fetch_wheels(wheel_dir: str) -> None:
    """``pip download`` the pure-Python wheels ``standin.site`` unpacks (once; kept in ``wheel_dir``)."""
    if os.path.isdir(wheel_dir) and len(os.listdir(wheel_dir)) >= len(standin.SITE_WHEELS):
        return
    os.makedirs(wheel_dir, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "-d", wheel_dir, *standin.SITE_WHEELS], check=True)


def make_data(out: str, script: Dict[str, Any], skip_big: bool, wheel_dir: str,
              kinds: Optional[List[str]] = None) -> List[str]:
    """Generate each stand-in of ``script`` not yet made (only ``kinds`` when given); return those made now."""
    made = []
    base = os.path.join(out, script["repo"], script["dir"])
    for d in script.get("data") or []:
        if (d.get("big") and skip_big) or (kinds and d["kind"] not in kinds):
            continue
        dest = os.path.normpath(os.path.join(base, d["dest"]))
        marker = (dest if d["kind"] in ("sine_wave", "char_text") else os.path.join(dest, f".standin-{d['kind']}"))
        if os.path.exists(marker):
            continue
        if d["kind"] == "site":
            fetch_wheels(wheel_dir)
            standin.site(dest, wheel_dir)
        else:
            standin.GENERATORS[d["kind"]](dest, **{k: v for k, v in d.items() if k not in ("kind", "dest", "big")})
        if marker != dest:
            with open(marker, "w") as fh:
                fh.write(d["kind"] + "\n")
        made.append(dest)
    return made


def job_text(script: Dict[str, Any], venv: str, time_limit: str, activate: str = "source") -> str:
    """The job script: ``source <venv>/bin/activate`` (or, with ``activate="path"``, ``export PATH=<venv>/bin:$PATH``
    for a venv without an activate script), the script's ``pre`` lines, its command."""
    lines = ["#!/bin/bash", f"#SBATCH --job-name={script['name']}", "#SBATCH --gres=gpu:1",
             f"#SBATCH --time={time_limit}"]
    if venv:
        lines.append(f"source {venv}/bin/activate" if activate == "source" else f"export PATH={venv}/bin:$PATH")
    lines += list(script.get("pre") or []) + [script["command"]]
    return "\n".join(lines) + "\n"


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mirror-dir", default="/work/.mirror")
    ap.add_argument("--out", default=".pub")
    ap.add_argument("--venv", default=os.path.dirname(os.path.dirname(os.path.abspath(sys.executable))),
                    help="the venv the job scripts activate (default: this interpreter's)")
    ap.add_argument("--time", default="12:00:00", help="#SBATCH --time of each job")
    ap.add_argument("--activate", choices=["source", "path"], default="source",
                    help="how a job enters the venv: source its activate script, or put its bin first on PATH")
    ap.add_argument("--no-export", action="store_true", help="use the export already in --out")
    ap.add_argument("--no-data", action="store_true")
    ap.add_argument("--skip-big", action="store_true")
    ap.add_argument("--kinds", default="", help="only these data kinds (comma-separated), e.g. site")
    ap.add_argument("--wheels", default="", help="folder of the site wheels (default: <out>/wheels)")
    ap.add_argument("--manifest", default=os.path.join(HERE, "manifest.yaml"),
                    help="another corpus of the same form (benchmarks/probe_unseen/manifest.yaml)")
    ap.add_argument("names", nargs="*", help="only these scripts")
    args = ap.parse_args(argv)
    man = load_manifest(args.manifest)
    out = os.path.abspath(args.out)
    wheel_dir = args.wheels or os.path.join(out, "wheels")
    scripts = [s for s in man["scripts"] if not args.names or s["name"] in args.names]
    if not args.no_export:
        for key in sorted({s["repo"] for s in scripts}):
            export_repo(key, man["repos"][key], args.mirror_dir, out)
            spec = man["repos"][key]
            print(f"exported {key}: {spec.get('repo', 'ours')}@{spec.get('commit', '-')[:10]}")
    rows = []
    for s in scripts:
        base = os.path.join(out, s["repo"], s["dir"])
        if not os.path.isdir(base):
            raise SystemExit(f"setup_corpus: {base} missing (export first)")
        if not args.no_data:
            for dest in make_data(out, s, args.skip_big, wheel_dir, [k for k in args.kinds.split(',') if k]):
                print(f"  data {s['name']}: {os.path.relpath(dest, out)}")
        job = os.path.join(base, f"job_{s['name']}.sh")
        with open(job, "w") as fh:
            fh.write(job_text(s, args.venv, args.time, args.activate))
        os.chmod(job, 0o755)
        spec = man["repos"][s["repo"]]
        rows.append({"name": s["name"], "job": os.path.relpath(job, out), "submit_dir": os.path.relpath(base, out),
                     "repo": spec.get("repo", "ours (benchmarks/probe_public/ours)"), "commit": spec.get("commit"),
                     "origin": spec.get("origin", "upstream"), "command": s["command"],
                     "cpu_only": bool(s.get("cpu_only")), "expect_fail": s.get("expect_fail", ""),
                     "data": [d["kind"] for d in s.get("data") or []]})
    path = os.path.join(out, "corpus.json")
    if args.names and os.path.exists(path):  # keep the other scripts' rows, in manifest order
        with open(path) as fh:
            kept = {r["name"]: r for r in json.load(fh)["scripts"]}
        kept.update({r["name"]: r for r in rows})
        rows = [kept[s["name"]] for s in man["scripts"] if s["name"] in kept]
    with open(path, "w") as fh:
        json.dump({"scripts": rows, "left_out": man.get("left_out", {})}, fh, indent=1)
    print(f"{len(rows)} job scripts under {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
