"""The placement benchmark's jobs, fixed once for every pass: ``placement_plan.json`` (stdlib only, pure).

Every device call of ``placement_bench.py`` runs one pass over the same jobs, so each job's work (training steps)
is decided here, before any pass, from a profile measured on the H100
(``python3 -m benchmarks.device.workload_profile``: seconds per step and peak reserved memory of each model
alone; the one recorded in ``results/h100-placement-profile/placement_bench.json``). Each job trains ``train_s`` seconds alone (steps = train_s /
step time) after its start-up (Python, torch and the model, CUDA context: 15-35 s measured on the harness), so it
runs about 30-50 s alone; memory request = measured peak + CUDA context (``CONTEXT_MIB``).

Scenarios:
  pile    the issue's 14 mid-size jobs (13 models, ResNet-50 twice), all submitted at once
  stream  a mixed stream of small CNNs, ResNet-18/32, ResNet-50/224 and BERT-base arriving every ``gap_s``
Usage (here, once; the JSON is committed): ``python3 -m benchmarks.device.placement_plan [--train-s 15]
[--gap-s 6] [--profile results/h100-placement-profile/placement_bench.json] [--out placement_plan.json]``
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence, Tuple

HERE = Path(__file__).resolve().parent
PLAN_PATH = HERE / "placement_plan.json"
PROFILE_PATH = HERE / "results" / "h100-placement-profile" / "placement_bench.json"
PILE = ["pile:resnet50", "pile:resnet101", "pile:vit_b_16", "pile:swin_t", "pile:convnext_tiny",
        "pile:efficientnet_b0", "pile:densenet121", "pile:regnet_y_1_6gf", "pile:bert_base", "pile:gpt2",
        "pile:distilbert", "pile:mlp", "pile:transformer_encoder"]
PILE14 = PILE + ["pile:resnet50"]  # 14 jobs: the 13 models, ResNet-50 twice
STREAM = ["small_cnn", "resnet18_32", "resnet50_224", "pile:bert_base", "small_cnn", "resnet18_32", "resnet50_224",
          "small_cnn"]
# CUDA context on top of the measured peak: 896 MiB, not the replay's 1024, so that the 14 requests fit the 79 GiB
# (79 shards; 1024 gives 80, and one job of the blind pile waited in run 1). The peaks were measured with cuDNN
# autotuning on (larger workspaces); the passes run without it, and under an MPS fence cuDNN/cuBLAS pick smaller
# workspaces still (docs/benchmarks.md run 1: 2,562 MiB alone, 830 MiB under a 2 GiB fence).
CONTEXT_MIB = 896
GPU_SHARDS = 79  # shards (GiB) of the H100 in the harness (cluster_gpu.sh: 79 GiB)
DEFAULT_STEP_S = 0.1  # a model missing from the profile (never the case for the recorded one)
DEFAULT_PEAK_MIB = 6144


def make_jobs(names: Sequence[Tuple[str, float]], profile: Mapping[str, Mapping[str, Any]],
              train_s: float) -> List[Dict[str, Any]]:
    """``[{"index", "workload", "offset_s", "steps", "train_s", "mem_mib"}]`` for ``(workload, arrival offset s)``
    pairs: steps = round(train_s / the profile's step time) (at least 5), mem = peak + ``CONTEXT_MIB``. Pure."""
    out = []
    for i, (w, off) in enumerate(names):
        row = profile.get(w) or {}
        step_s = float(row.get("step_s") or DEFAULT_STEP_S)
        steps = max(5, int(round(train_s / step_s)))
        out.append({"index": i, "workload": w, "offset_s": round(float(off), 3), "steps": steps,
                    "train_s": round(steps * step_s, 2),
                    "mem_mib": int(row.get("peak_reserved_mib") or DEFAULT_PEAK_MIB) + CONTEXT_MIB})
    return out


def make_plan(profile: Mapping[str, Mapping[str, Any]], train_s: float = 15.0, gap_s: float = 6.0,
              source: str = "") -> Dict[str, Any]:
    """The plan: ``{"train_s", "gap_s", "source", "scenarios": {"pile": [...], "stream": [...]}}`` (``make_jobs``).

    Raises:
        ValueError: ``train_s`` or ``gap_s`` not > 0, or the pile's requests exceed the GPU's shards (then the
            blind pass could not start every job at once, as the issue's pile did).
    """
    if train_s <= 0 or gap_s < 0:
        raise ValueError(f"need train_s > 0 and gap_s >= 0 (got {train_s}, {gap_s})")
    pile = make_jobs([(w, 0.0) for w in PILE14], profile, train_s)
    stream = make_jobs([(w, k * gap_s) for k, w in enumerate(STREAM)], profile, train_s)
    shards = sum(-(-j["mem_mib"] // 1024) for j in pile)
    if shards > GPU_SHARDS:
        raise ValueError(f"the pile asks {shards} shards, more than the GPU's {GPU_SHARDS}")
    return {"train_s": train_s, "gap_s": gap_s, "source": source, "pile_shards": shards,
            "scenarios": {"pile": pile, "stream": stream}}


def load_profile(path: Path) -> Dict[str, Dict[str, Any]]:
    """Profile rows by workload from a ``placement_bench.json`` (key ``profile``) or a ``profile.json`` (``rows``)."""
    data = json.loads(path.read_text())
    rows = data.get("profile") or data.get("rows")
    if not isinstance(rows, dict) or not rows:
        raise ValueError(f"{path}: no profile rows")
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train-s", type=float, default=15.0, help="training seconds of each job alone")
    ap.add_argument("--gap-s", type=float, default=6.0, help="seconds between arrivals in the stream")
    ap.add_argument("--profile", default=str(PROFILE_PATH))
    ap.add_argument("--out", default=str(PLAN_PATH))
    a = ap.parse_args(argv)
    try:
        src = Path(a.profile).resolve()
        name = str(src.relative_to(HERE.parent.parent)) if src.is_relative_to(HERE.parent.parent) else str(src)
        plan = make_plan(load_profile(src), a.train_s, a.gap_s, source=f"profile: {name}")
    except (OSError, ValueError) as exc:
        print(f"placement_plan: error: {exc}", file=sys.stderr)
        return 1
    Path(a.out).write_text(json.dumps(plan, indent=1) + "\n")
    for scen, jobs in plan["scenarios"].items():
        print(f"{scen}: " + ", ".join(f"{j['workload']} x{j['steps']} ({j['mem_mib']} MiB)" for j in jobs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
