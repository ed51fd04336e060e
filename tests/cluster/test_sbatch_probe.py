"""coloc-sbatch's one decision: override, script probe, #COLOC model estimate, history, whole GPU.

Pure tests stub each source's figure through ``build_plan``'s seams (``estimate_fn``, ``probe_fn``,
``history_fn``; no Slurm involved). The command-line tests run the real probe on a corpus-style script (this
venv's torch on the CPU); the cluster tests submit it as ``colocuser`` to the real local cluster.
"""
from __future__ import annotations

import os
import pwd
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_coloc.comment import parse_comment
from slurm_coloc.config import Config
from slurm_coloc.estimate.decision import DISAGREE_FRACTION, ProbeAnswer, explain_lines
from slurm_coloc.estimate.spec import Estimate
from slurm_coloc.submit.directives import parse_script
from slurm_coloc.submit.plan import NO_INFORMATION, build_plan
from slurm_coloc.submit.request import split_command_line

pytestmark = pytest.mark.slurm  # starts a real Slurm cluster

CFG = Config(gpu_mem_gib=80, headroom_mib=256, gpu_model_by_partition={"a100": "A100"})
MODEL = "#COLOC model=m:f input=3 batch=2\n"
REPO = Path(__file__).resolve().parents[2]

# A training script in the style of the public examples: argparse, prints at import (like nanoGPT's model
# file), "cuda if available", a few Adam steps. Under the probe it sees one CUDA device; in a job on the
# test cluster (no GPU) it trains on the CPU.
TRAIN_PY = '''\
import argparse
import torch
import torch.nn as nn

print("number of parameters: 0.21M")
p = argparse.ArgumentParser()
p.add_argument("--batch-size", type=int, default=64)
p.add_argument("--hidden", type=int, default=256)
p.add_argument("--steps", type=int, default=3)
args = p.parse_args()
device = "cuda" if torch.cuda.is_available() else "cpu"
model = nn.Sequential(nn.Linear(784, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10)).to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(args.steps):
    x = torch.randn(args.batch_size, 784, device=device)
    y = torch.randint(0, 10, (args.batch_size,), device=device)
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.3f}")
print("done")
'''
JOB_SH = '''\
#!/bin/bash
#SBATCH --time=00:05:00
#SBATCH --gres=gpu:1
cd "$SLURM_SUBMIT_DIR"
python train.py --batch-size 64 "$@"
'''


def est(mib, method="analytic", gpu="H100", floor=None):
    detail = {"trace_floor_mib": floor} if floor is not None else {}
    return Estimate(mib, method, detail=detail, gpu_model=gpu)


def plan_with(tmp_path, *, text="#!/bin/sh\n" + MODEL + "true\n", argv=("SCRIPT",), directive=None,
              probe=None,
              history=(), calls=None):
    """``build_plan`` with stub sources: ``directive``/``probe`` are MiB (None: no figure) or a callable of
    the GPU model; ``calls`` collects ``(source, GPU model)`` asked."""
    p = tmp_path / "job.sh"
    p.write_text(text)
    calls = [] if calls is None else calls

    def figure(value, gpu):
        return value(gpu) if callable(value) else value

    def estimate_fn(spec, gpu):
        calls.append(("directives", gpu))
        v = figure(directive, gpu)
        return est(v, gpu=gpu) if v is not None else None

    def probe_fn(gpu):
        calls.append(("probe", gpu))
        v = figure(probe, gpu)
        if v is None:
            return ProbeAnswer(None, "probe ran `train.py`",
                               "the program ended before its first optimizer step")
        return ProbeAnswer(est(v, "probe", gpu, floor=int(v * 0.8)), "probe ran `train.py`", log_tail=("hi",))

    def history_fn():
        calls.append(("history", None))
        return list(history)

    cmd = split_command_line([a.replace("SCRIPT", str(p)) for a in argv])
    return build_plan(cmd, parse_script(str(p)), CFG, estimate_fn, probe_fn=probe_fn, history_fn=history_fn)


def test_override_wins_and_nothing_else_runs(tmp_path):
    calls = []
    plan = plan_with(tmp_path, argv=("--coloc-mem", "3G", "SCRIPT"), directive=1000, probe=2000, calls=calls)
    assert calls == [] and plan.comment["method"] == "override" and plan.shards == 3
    assert [s.name for s in plan.decision.sources] == ["override", "probe", "directives", "history",
                                                       "whole-gpu"]


def test_probe_ranks_above_close_directives(tmp_path):
    plan = plan_with(tmp_path, directive=2200, probe=2000)  # +10%: no warning
    assert plan.comment["method"] == "probe" and plan.comment["mem_mib"] == 2000 and plan.shards == 3
    assert plan.decision.warnings == () and "within 20%" in plan.decision.why


@pytest.mark.parametrize("directive", [2500, 1500])  # +25% and -25%: both warn; the probe's figure is used
def test_disagreement_over_20_percent_warns_and_uses_the_probe(tmp_path, directive):
    plan = plan_with(tmp_path, directive=directive, probe=2000)
    assert abs(directive - 2000) / 2000 > DISAGREE_FRACTION
    assert plan.comment["method"] == "probe" and plan.comment["mem_mib"] == 2000
    (warning,) = plan.decision.warnings
    assert f"({directive} MiB)" in warning and "(2000 MiB)" in warning and "\n" not in warning


def test_probe_without_figure_falls_to_directives(tmp_path):
    plan = plan_with(tmp_path, directive=1500, probe=None)
    assert plan.comment["method"] == "analytic" and plan.comment["mem_mib"] == 1500
    assert "before its first optimizer step" in plan.decision.why
    assert plan.decision.sources[1].note == "the program ended before its first optimizer step"


def test_history_raises_a_probe_figure_and_lowers_it_only_to_its_floor(tmp_path):
    raised = plan_with(tmp_path, text="#!/bin/sh\npython train.py\n", probe=2000, history=[3000])
    assert raised.comment["method"] == "history" and raised.comment["mem_mib"] == 3214  # 3000 * 1.05 + 64
    assert "raised the probe figure (2000 MiB)" in raised.decision.why
    lowered = plan_with(tmp_path, text="#!/bin/sh\npython train.py\n", probe=2000, history=[100])
    assert lowered.comment["mem_mib"] == 1600  # the probe's trace floor (the stub's 80%), not 169


def test_history_alone_and_no_information(tmp_path):
    alone = plan_with(tmp_path, text="#!/bin/sh\npython train.py\n", probe=None, history=[1000])
    assert alone.comment["method"] == "history" and alone.comment["mem_mib"] == 1114
    none = plan_with(tmp_path, text="#!/bin/sh\npython train.py\n", probe=None)
    assert none.mode == "whole-gpu" and none.reason == NO_INFORMATION
    for step in ("#COLOC mem=6G", "--explain", "docs/user.md"):
        assert step in NO_INFORMATION


def test_each_gpu_model_asked_and_the_largest_counts(tmp_path):
    calls = []
    plan = plan_with(tmp_path, argv=("-p", "a100,gpu", "SCRIPT"), directive=1000,
                     probe=lambda gpu: 3000 if gpu == "A100" else 2800, calls=calls)
    assert [c for c in calls if c[0] == "probe"] == [("probe", "A100"), ("probe", "H100")]
    assert plan.comment["mem_mib"] == 3000 and plan.comment["gpu_model"] == "A100"


def test_a_timed_out_directive_estimate_leaves_the_probe_figure(tmp_path):
    plan = plan_with(tmp_path, directive=None, probe=2000)
    assert plan.comment["method"] == "probe" and plan.mode == "shard"
    assert "did not finish within estimate_timeout_s" in plan.decision.sources[2].note


def test_explain_lines_name_every_source_and_the_probe(tmp_path):
    plan = plan_with(tmp_path, directive=2600, probe=2000, history=[])
    text = "\n".join(explain_lines(plan.decision))
    assert re.search(r"2\. probe\s+2,000 MiB", text) and re.search(r"3\. directives\s+2,600 MiB", text)
    assert "4. history" in text and "no earlier run" in text and "chosen: probe 2,000 MiB" in text
    assert "probe ran `train.py`" in text and "| hi" in text and "outside its scratch directory: none" in text


# -- the command line, with the real probe (this venv's torch on the CPU)
# -------------------------------------

def _project(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "train.py").write_text(TRAIN_PY)
    (d / "job.sh").write_text(JOB_SH)
    for p in (d, d / "train.py", d / "job.sh"):
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    return d / "job.sh"


def _env(tmp_path: Path) -> dict:
    cfg = tmp_path / "coloc.yaml"
    cfg.write_text(f"state_dir: {tmp_path / 'state'}\n")
    return {**os.environ, "COLOC_CONFIG": str(cfg), "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def test_explain_shows_sources_probe_output_and_keeps_stdout_clean(tmp_path):
    script = _project(tmp_path / "proj")
    script.write_text(JOB_SH + "#COLOC mem=1G\n")  # after the first command: ignored, with a warning
    out = subprocess.run([sys.executable, "-m", "slurm_coloc", "sbatch", "--explain", "--dry-run",
                          str(script),
                          "--hidden", "512"], cwd=script.parent, env=_env(tmp_path), capture_output=True,
                          text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("sbatch ") and out.stdout.count("\n") == 1  # nothing of the program's
    assert "number of parameters" not in out.stdout
    err = out.stderr
    assert re.search(r"explain:   2\. probe\s+[\d,]+ MiB  probe on H100 \(fp32\)", err), err
    assert "explain:   3. directives           -  no #COLOC model= line" in err
    assert "probe ran `train.py --batch-size 64 --hidden 512`" in err and "step(s) of Adam" in err
    assert "| number of parameters: 0.21M" in err  # the program's output, shown by --explain only
    assert "warning: #COLOC line(s) 6 come after the script's first command and are ignored" in err
    comment = parse_comment(next(w for w in shlex.split(out.stdout) if w.startswith("--comment=")))
    assert comment["method"] == "probe" and comment["spec"] is None and 700 < comment["mem_mib"] < 1500


def test_without_explain_one_line_says_what_the_probe_ran(tmp_path):
    script = _project(tmp_path / "proj")
    env = _env(tmp_path)
    argv = [sys.executable, "-m", "slurm_coloc", "sbatch", "--dry-run", str(script)]
    first = subprocess.run(argv, cwd=script.parent, env=env, capture_output=True, text=True, timeout=300)
    again = subprocess.run(argv, cwd=script.parent, env=env, capture_output=True, text=True, timeout=300)
    for out in (first, again):
        assert out.returncode == 0, out.stderr
        probe_lines = [ln for ln in out.stderr.splitlines() if "probe ran" in ln]
        assert (len(probe_lines) == 1 and "explain" not in out.stderr
                and "number of parameters" not in out.stderr)
    assert "(cached)" in again.stderr and first.stdout == again.stdout


# -- the real cluster
# -------------------------------------------------------------------------------------------

def _job_comment(cluster, job_id: int) -> dict:
    text = cluster.scontrol("show", "job", str(job_id))
    m = re.search(r"Comment=(.*coloc:\{.*?\})\s", text)
    assert m, text
    return parse_comment(m.group(1))


def _give_to_colocuser(d: Path) -> None:
    """The job's directory belongs to the submitting user (the job writes its output there)."""
    pw = pwd.getpwnam("colocuser")
    for p in (d, *d.iterdir()):
        os.chown(p, pw.pw_uid, pw.pw_gid)


@pytest.mark.slurm
def test_a_plain_script_gets_shards_from_the_probe_and_completes(slurm_cluster, tmp_path):
    cluster = slurm_cluster
    script = _project(cluster.jobs_dir / f"probe-{os.getpid()}")
    _give_to_colocuser(script.parent)
    env = {"XDG_CACHE_HOME": str(script.parent / ".cache")}
    out = cluster.run(["coloc-sbatch", "--parsable", str(script), "--steps", "2"], cwd=script.parent,
                      env={**env, "COLOC_PROBE": "true"},
                      timeout=300)
    assert out.returncode == 0, out.stderr
    assert re.fullmatch(r"\d+\n", out.stdout), out.stdout  # the job id alone: --dependency chains work
    job_id = int(out.stdout)
    assert "probe ran `train.py --batch-size 64 --steps 2`" in out.stderr
    comment = _job_comment(cluster, job_id)
    assert comment["method"] == "probe" and comment["mode"] == "shard" and comment["shards"] == 2
    job = cluster.wait_job(job_id, timeout=240)
    assert job["job_state"] == "COMPLETED", (job, (script.parent / f"slurm-{job_id}.out").read_text())
    log = (script.parent / f"slurm-{job_id}.out").read_text()
    assert "number of parameters" in log and "done" in log


@pytest.mark.slurm
@pytest.mark.parametrize("program, env, why", [
    ("print('loading', flush=True)\nraise SystemExit('no data')\n", {},
     "exited (code no data) before its first"),
    ("import time\nprint('waiting for data', flush=True)\ntime.sleep(600)\n", {"COLOC_PROBE_TIMEOUT_S": "3"},
     "time limit of 3 s"),
])
def test_parsable_is_the_job_id_alone_when_the_probe_falls_back(slurm_cluster, program, env, why):
    cluster = slurm_cluster
    d = cluster.jobs_dir / f"fallback-{os.getpid()}-{len(program)}"
    script = _project(d)
    (d / "train.py").write_text(program)
    _give_to_colocuser(d)
    out = cluster.run(["coloc-sbatch", "--parsable", str(script)], cwd=d,
                      env={**env, "XDG_CACHE_HOME": str(d), "COLOC_PROBE": "true"},
                      timeout=300)
    assert out.returncode == 0, out.stderr
    assert re.fullmatch(r"\d+\n", out.stdout), out.stdout
    assert why in out.stderr and "#COLOC mem=6G" in out.stderr  # the fallback's reason and the next step
    assert _job_comment(cluster, int(out.stdout))["mode"] == "whole-gpu"
    cluster.run(["scancel", out.stdout.strip()])
