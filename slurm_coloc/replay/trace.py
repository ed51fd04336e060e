"""Read a CARMA trace and its workload catalog and turn each task into a runnable, scaled training job (pure).

Inputs (``shared/data/carma``, Apache-2.0): ``traces/*.csv`` (``task_index,submit_time_s,gap_from_previous_s,
task_rad``), ``workload_catalog_from_rad.csv`` (per ``.rad`` file: script, batch sizes, measured peak memory
in MB, GPUs) and ``exclusive_run_summary.csv`` (measured exclusive execution time of one epoch per script and
batch, A100 machine of the CARMA paper).

Mapping (``FAMILIES``): each script family becomes a torchvision model on synthetic inputs of the data set's
size (CIFAR-100 scripts: 3x32x32, 100 classes; ImageNet scripts: 3x224x224, Inception 3x299x299, 1000
classes); Xception (not in torchvision) becomes ResNeXt-50; tasks with no vision counterpart (BERT, GPT-2,
XLNet, DLRM, U-Net, Mask R-CNN) become ResNet-50/224 at batch 32 as compute stand-ins. The memory request is
always the catalog's measured peak (MB taken as MiB), so packing decisions follow the real trace.

Scaling: submit times x ``time_scale``; a task's work is its reference exclusive time (one-epoch time x epochs
in the .rad name, ``_20e_`` = 20) x ``work_scale`` seconds, turned into training steps with the expected
samples/s of the stand-in model (``RATES_SAMPLES_PER_S``; the same steps run in both modes, so the comparison
is fair even where a rate is off).
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from slurm_coloc.errors import ColocError

# script family -> (torchvision model or workloads.py name, input CxHxW, classes, note)
FAMILIES: Dict[str, Tuple[str, str, int, str]] = {
    "resnet18_cifar100": ("resnet18", "3x32x32", 100, ""),
    "resnet34_cifar100": ("resnet34", "3x32x32", 100, ""),
    "mobilenet_cifar100": ("mobilenet_v2", "3x32x32", 100, ""),
    "efficientNet_cifar100": ("efficientnet_b0", "3x32x32", 100, ""),
    "resnet50": ("resnet50", "3x224x224", 1000, ""),
    "mobilenet": ("mobilenet_v2", "3x224x224", 1000, ""),
    "efficientNet": ("efficientnet_b0", "3x224x224", 1000, ""),
    "Inception": ("inception_v3", "3x299x299", 1000, ""),
    "Xception": ("resnext50_32x4d", "3x224x224", 1000, "Xception -> ResNeXt-50 (not in torchvision)"),
    "vgg": ("vgg16", "3x224x224", 1000, ""),
    "mnist_train": ("small_cnn", "", 10, "MNIST -> the small CNN"),
}
STAND_IN = ("resnet50", "3x224x224", 1000)
STAND_IN_BATCH = 32
DEFAULT_REF_S = (
    600.0  # reference runtime of a script the run summary lacks (mnist_train), stated in Task.note
)

# Expected single-job samples/s on one H100 (measured there for small_cnn/resnet18/resnet50 in docs/facts.md
# §12 and
# benchmarks/device results; the rest are rough guesses: they only set how long a step count takes).
RATES_SAMPLES_PER_S: Dict[Tuple[str, str], float] = {
    ("small_cnn", ""): 31500,
    ("resnet18", "3x32x32"): 3900,
    ("resnet34", "3x32x32"): 2300,
    ("mobilenet_v2", "3x32x32"): 2500,
    ("efficientnet_b0", "3x32x32"): 1800,
    ("resnet50", "3x224x224"): 1500,
    ("mobilenet_v2", "3x224x224"): 2000,
    ("efficientnet_b0", "3x224x224"): 1400,
    ("inception_v3", "3x299x299"): 900,
    ("resnext50_32x4d", "3x224x224"): 1000,
    ("vgg16", "3x224x224"): 700,
}


@dataclass(frozen=True)
class Task:
    """One trace task as a runnable job: ``index`` in the trace, its ``.rad``, ``submit_s`` (scaled, s);
    ``workload``: the ``workloads.py`` argument (``small_cnn`` or ``tv:<model>:<CxHxW>:<batch>:<classes>``);
    ``batch`` samples per step, ``steps`` of the scaled work; ``mem_mib``: the catalog's measured peak (None:
    unknown -> whole GPU); ``ref_s``: reference exclusive runtime (s, unscaled), ``work_s`` = ref_s x
    work_scale; ``num_gpus`` in the catalog (the replay uses one); ``note``: how it was mapped when not one to
    one."""

    index: int
    rad: str
    submit_s: float
    workload: str
    batch: int
    steps: int
    mem_mib: Optional[int]
    ref_s: float
    work_s: float
    num_gpus: int
    note: str = ""


def _read_csv(path: Path) -> List[Dict[str, str]]:
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            return list(csv.DictReader(fh))
    except OSError as exc:
        raise ColocError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None


def _require(rows: List[Dict[str, str]], path: Path, cols: Tuple[str, ...]) -> None:
    missing = [c for c in cols if rows and c not in rows[0]]
    if not rows or missing:
        raise ColocError(
            f"{str(path)!r}: {'no rows' if not rows else 'missing column(s) ' + ', '.join(missing)}"
        )


def load_trace(path: Path) -> List[Tuple[int, float, str]]:
    """``(task_index, submit_time_s from the trace's origin, task_rad)`` rows in file order. ColocError:
    unreadable file, missing column, non-numeric time."""
    rows = _read_csv(path)
    _require(rows, path, ("task_index", "submit_time_s", "task_rad"))
    try:
        return [(int(r["task_index"]), float(r["submit_time_s"]), r["task_rad"].strip()) for r in rows]
    except ValueError as exc:
        raise ColocError(f"{str(path)!r}: bad number ({exc})") from None


def load_catalog(path: Path) -> Dict[str, Dict[str, str]]:
    """``.rad`` file name -> its catalog row (``measured_peak_mem_MB`` in MB, read as MiB). ColocError:
    unreadable file, no rows, missing column."""
    rows = _read_csv(path)
    _require(
        rows,
        path,
        ("rad_file", "script", "cli_batch_size", "rad_batch_size", "num_gpus", "measured_peak_mem_MB"),
    )
    return {r["rad_file"].strip(): r for r in rows}


def load_runtimes(path: Path) -> Dict[Tuple[str, Optional[int]], float]:
    """``(script stem, batch size or None)`` -> one epoch's exclusive time (s), rows without a numeric time
    skipped. ColocError: unreadable file, no rows, missing column."""
    rows = _read_csv(path)
    _require(rows, path, ("Script", "Run folder", "Execution time(s)"))
    out: Dict[Tuple[str, Optional[int]], float] = {}
    for r in rows:
        m = re.search(r"--batch_size_(\d+)", r["Run folder"])
        try:
            out[(Path(r["Script"]).stem, int(m.group(1)) if m else None)] = float(r["Execution time(s)"])
        except ValueError:
            continue
    return out


def epochs_of(rad: str) -> int:
    """Epochs encoded in a .rad name (``resnet18_cifar100_20e_3.rad`` -> 20), else 1."""
    m = re.search(r"_(\d+)e_", rad)
    return int(m.group(1)) if m else 1


def _int(text: str) -> Optional[int]:
    try:
        return int(float(text)) if text and text.strip() else None
    except ValueError:
        return None


def map_task(
    index: int,
    submit_s: float,
    rad: str,
    catalog: Dict[str, Dict[str, str]],
    runtimes: Dict[Tuple[str, Optional[int]], float],
    time_scale: float,
    work_scale: float,
    min_steps: int = 20,
) -> Task:
    """One trace row -> Task (rules: module docstring); ``submit_s`` unscaled from the first task; a script
    missing from ``runtimes`` costs ``DEFAULT_REF_S`` (``Task.note``). ColocError: the .rad is not in the
    catalog."""
    row = catalog.get(rad)
    if row is None:
        raise ColocError(f"task {index}: {rad!r} is not in the workload catalog")
    family = Path(row["script"]).stem
    batch = _int(row["cli_batch_size"]) or _int(row["rad_batch_size"]) or STAND_IN_BATCH
    ref = runtimes.get((family, batch), runtimes.get((family, None)))
    notes = []
    if ref is None:
        ref = DEFAULT_REF_S
        notes.append(f"no runtime in the summary: {DEFAULT_REF_S:.0f} s assumed")
    ref *= epochs_of(rad)
    if family in FAMILIES:
        model, shape, classes, note = FAMILIES[family]
        notes.append(note)
    else:
        (model, shape, classes), batch = STAND_IN, STAND_IN_BATCH
        notes.append(f"{family} -> ResNet-50/224 batch {STAND_IN_BATCH} (compute stand-in)")
    note = "; ".join(n for n in notes if n)
    workload = model if model == "small_cnn" else f"tv:{model}:{shape}:{batch}:{classes}"
    if model == "small_cnn":
        batch = 64
    rate = RATES_SAMPLES_PER_S.get((model, shape), 1000.0)
    work_s = ref * work_scale
    steps = max(min_steps, int(math.ceil(work_s * rate / batch)))
    return Task(
        index=index,
        rad=rad,
        submit_s=submit_s * time_scale,
        workload=workload,
        batch=batch,
        steps=steps,
        mem_mib=_int(row["measured_peak_mem_MB"]),
        ref_s=ref,
        work_s=work_s,
        num_gpus=_int(row["num_gpus"]) or 1,
        note=note,
    )


def build_tasks(
    trace: Path,
    catalog: Path,
    runtimes: Path,
    time_scale: float,
    work_scale: float,
    max_tasks: Optional[int] = None,
    first_task: int = 0,
) -> List[Task]:
    """All tasks of ``trace`` (or ``max_tasks`` from the 0-based row ``first_task``), submit offsets rebased
    to the first; ``time_scale``, ``work_scale`` > 0. ColocError: bad scales, no task, a loader's error or
    ``map_task``'s."""
    if not (time_scale > 0 and work_scale > 0):
        raise ColocError(f"time and work scales must be > 0 (got {time_scale}, {work_scale})")
    rows = load_trace(trace)[first_task:][:max_tasks]
    if not rows:
        raise ColocError(f"{str(trace)!r}: no task selected")
    cat, rt = load_catalog(catalog), load_runtimes(runtimes)
    t0 = rows[0][1]
    return [map_task(i, s - t0, rad, cat, rt, time_scale, work_scale) for i, s, rad in rows]
