"""The 18 real models of GPUMemNet's paper table, for ``benchmarks/estimator_eval.py``.

Two data sets, both scored with the estimator AS SHIPPED (``combine.traced_estimate``: the
repository's ``weights/`` and ``calibration.json``; the learned ensemble never saw these models):

* ``PAPER_A100``: the paper's measured peaks (A100 40GB, column 'Actual GPU memory', MiB;
  GPUMemNet, Yousefzadeh-Asl-Miandoab et al., ITU Copenhagen, CC BY 4.0,
  ``shared/data/gpumemnet/paper_results_actual_vs_estimators.csv``) against our estimates with
  ``--gpu A100`` semantics (``spec.py``: A100 context derived from GPUMemNet's MLP data). The
  paper's runs used the CARMA workload scripts (``zoo_paper.py`` lists the settings: sequences
  padded to 512, XLNet dynamically padded, GPT-2 large over 2 GPUs with DataParallel, device-wide
  ``memory.used``), so differences are not all estimator error.
* ``PAPER_H100``: the same 18 configs re-measured on our H100 by
  ``benchmarks/estimator_hopper_gen.py --set paper18`` (``data/hopper/paper18_runs.csv``, NVML
  per-process peak), skipped with a note while that file is missing.

Each configuration is traced once (memoised) and scored for both GPUs.
"""
from __future__ import annotations

import contextlib
import csv
import json
import os
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

from benchmarks.estimator.zoo import model_ref
from benchmarks.estimator.zoo_paper import paper18
from slurm_coloc.estimate.spec import ModelSpec

PAPER_A100 = "18 real models (paper, A100 actuals)"
PAPER_H100 = "18 real models re-measured on H100"
AddFn = Callable[[str, str, Sequence[float], Sequence[Optional[float]]], None]


def spec_of(cfg: Dict[str, Any]) -> ModelSpec:
    """The ModelSpec of one ``zoo_paper.paper18()`` entry."""
    return ModelSpec(model=model_ref(cfg["model"]), kwargs=dict(cfg["kwargs"]), input_shape=tuple(cfg["shape"]),
                     batch_size=int(cfg["batch_size"]), input_dtype=cfg["input_dtype"],
                     optimizer=cfg["optimizer"], precision=cfg["precision"])


@contextlib.contextmanager
def memo_traces() -> Iterator[None]:
    """Within the block, ``trace.trace_spec`` returns the same result for the same spec."""
    from slurm_coloc.estimate import trace

    orig = trace.trace_spec
    memo: Dict[str, Any] = {}

    def cached(spec: ModelSpec, workspace: Any = None) -> Any:
        key = json.dumps(spec.to_json(), sort_keys=True) + f"|{id(getattr(workspace, '__self__', None))}"
        if key not in memo:
            memo[key] = orig(spec, workspace=workspace)
        return memo[key]

    trace.trace_spec = cached  # type: ignore[assignment]
    try:
        yield
    finally:
        trace.trace_spec = orig  # type: ignore[assignment]


# The 18 models' own convolution calls are in the shipped workspace table (measured with the rest);
# scoring them as unseen models leaves those calls out (workspace.py, "paper18" source).
UNSEEN = ("paper18",)


def shipped(spec: ModelSpec, gpu: str, exclude: Sequence[str] = UNSEEN) -> Dict[str, Optional[float]]:
    """Our estimators' figures (MiB) for ``spec`` on ``gpu``: the shipped estimate's detail (with the
    workspace table minus the calls measured only for ``exclude``) and the learned ensemble's
    (``learned.py``, on the same trace when inside :func:`memo_traces`)."""
    from benchmarks.estimator import learned
    from slurm_coloc.estimate import trace, workspace
    from slurm_coloc.estimate.combine import load_calibration, traced_estimate

    est = traced_estimate(spec, gpu, workspace_exclude=exclude)
    d = est.detail
    ws = workspace.load(exclude)
    lrn = learned.predict(spec, trace.trace_spec(spec, workspace=ws.bytes_for if ws else None), gpu)
    lb = round(lrn["bound_mib"] * float(load_calibration()["learned_mult"]), 1)
    return {"analytic": d.get("analytic_mib"), "bound": float(est.mem_mib),
            "learned": round(lrn["mean_mib"], 1), "learned_bound": lb,
            "max_bounds": None if lb is None else max(float(est.mem_mib), float(lb)),
            "faketensor": d.get("peak_allocated_mib")}


NAMES = (("analytic", "analytic (uncalibrated)"), ("bound", "analytic bound = shipped estimate"),
         ("learned", "learned mean"), ("learned_bound", "learned bound"),
         ("max_bounds", "max(analytic, learned) bounds (rejected)"),
         ("faketensor", "FakeTensor-style (traced allocated only)"))


def _add_all(add: AddFn, ds: str, actual: Sequence[float], figs: List[Dict[str, Optional[float]]]) -> None:
    for key, name in NAMES:
        add(ds, name, actual, [f[key] for f in figs])


def _measured(hopper_dir: str) -> Dict[tuple, Dict[str, str]]:
    """The H100 re-measurement (``paper18_runs.csv``), ok rows keyed by (model, kwargs JSON, batch size)."""
    with open(os.path.join(hopper_dir, "paper18_runs.csv"), newline="") as fh:
        return {(r["model"], r["kwargs_json"], int(r["batch_size"])): r for r in csv.DictReader(fh)
                if r["status"] == "ok" and r["family"] == "paper18"}


def add_paper18(add: AddFn, gdir: str, hopper_dir: str) -> None:
    """Append the rows of both data sets through ``add(data_set, estimator, actual, estimates)``."""
    cfgs = paper18()
    with open(os.path.join(gdir, "paper_results_actual_vs_estimators.csv"), newline="") as fh:
        prow = list(csv.reader(fh))[1:]
    assert [int(r[1]) for r in prow] == [c["batch_size"] for c in cfgs], "paper table order changed"
    specs = [spec_of(c) for c in cfgs]
    with memo_traces():
        _add_all(add, PAPER_A100, [float(r[2]) for r in prow], [shipped(s, "A100") for s in specs])
        runs = os.path.join(hopper_dir, "paper18_runs.csv")
        if not os.path.isfile(runs):
            print(f"note: {runs} missing: data set '{PAPER_H100}' skipped "
                  "(benchmarks/estimator_hopper_gen.py --set paper18 on the H100 writes it)")
            return
        meas = _measured(hopper_dir)
        act: List[float] = []
        figs: List[Dict[str, Optional[float]]] = []
        oracle: List[Optional[float]] = []
        for c, s in zip(cfgs, specs):
            r = meas.get((c["model"], json.dumps(c["kwargs"], sort_keys=True), c["batch_size"]))
            if r is None:
                continue
            act.append(float(r["nvml_mib"]))
            figs.append(shipped(s, "H100"))
            oracle.append(float(r["torch_max_reserved_mib"]) + 612)
        _add_all(add, PAPER_H100, act, figs)
        add(PAPER_H100, "torch max reserved + 612 MiB (oracle-ish)", act, oracle)


def per_row_markdown(gdir: str, hopper_dir: str) -> str:
    """The per-row table of docs/estimator.md (MiB): paper A100 actual, our A100 bound, H100 measured, our H100
    analytic / shipped bound / learned mean, one line per paper18 config."""
    cfgs = paper18()
    with open(os.path.join(gdir, "paper_results_actual_vs_estimators.csv"), newline="") as fh:
        prow = list(csv.reader(fh))[1:]
    meas = _measured(hopper_dir)
    lines = ["| model | batch | A100 actual (paper) | ours, A100 | H100 measured | ours H100 analytic "
             "| ours H100 shipped | learned mean |", "|---|---|---|---|---|---|---|---|"]
    name = ""
    with memo_traces():
        for c, p in zip(cfgs, prow):
            name = p[0] or name  # the paper's table leaves a repeated model name blank
            s = spec_of(c)
            a, h = shipped(s, "A100"), shipped(s, "H100")
            m = meas.get((c["model"], json.dumps(c["kwargs"], sort_keys=True), c["batch_size"]))
            cells = [name, str(c["batch_size"]), p[2], f"{a['bound']:.0f}",
                     f"{float(m['nvml_mib']):.0f}" if m else "-", f"{h['analytic']:.0f}", f"{h['bound']:.0f}",
                     f"{h['learned']:.0f}" if h["learned"] is not None else "-"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m benchmarks.estimator_eval_paper18: the per-row table
    from benchmarks.estimator import train

    print(per_row_markdown(train.GPUMEMNET_DIR, train.HOPPER_DIR))
