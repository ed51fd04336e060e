"""A job's compute intensity before it starts (pure): its signature, its history, and a predictor for unseen
programs. The signature keys history from what the job trains (the comment's ``spec``: model and kwargs, input
shape, batch, precision, optimizer), so it survives small edits of the script; the script's SHA-256 only
without a spec. The predictor maps FLOPs per step (else batch x input elements) to SM activity with a
saturating curve fitted in ``calibration.json`` beside this module."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from slurm_coloc.comment import JobComment
from slurm_coloc.comment import job_signature as signature  # noqa: F401 - re-exported for placement callers
from slurm_coloc.errors import ConfigError
from slurm_coloc.placement.policies import Activity

DEFAULT_CALIBRATION = Path(__file__).with_name("calibration.json")


@dataclass(frozen=True)
class Features:
    """One training step's features (``gflop_per_step`` None: unknown; ``from_proxy``: not counted FLOPs)."""

    gflop_per_step: Optional[float]
    gbyte_per_step: Optional[float]
    batch_size: Optional[int]
    precision: str
    model: Optional[str]
    from_proxy: bool = False


def features(c: JobComment) -> Features:
    """Features of a job's comment; precision ``fp32`` when not given. ``flops_per_step``: what
    ``coloc-sbatch`` counted (``torch.utils.flop_counter``); without it, batch x input elements x 3e-6 GFLOP
    is a crude proxy (1,000 FLOP per input element forward, x3 with backward; real models range over 100x; 0
    for token models). The comment's bounds keep every feature finite."""
    spec = c.spec
    batch = spec.batch_size if spec else None
    gflop = c.flops_per_step / 1e9 if c.flops_per_step is not None else None
    from_proxy = False
    if gflop is None and batch and spec is not None and spec.input_shape:
        from_proxy = True
        gflop = batch * float(math.prod(spec.input_shape)) * 3e-6
    nbytes = c.bytes_per_step
    return Features(gflop, nbytes / 1e9 if nbytes is not None else None, batch,
                    (spec.precision if spec else None) or "fp32", spec.model if spec else None, from_proxy)


@dataclass(frozen=True)
class Calibration:
    """Predictor coefficients (fractions). SMACT = smact_min + (smact_max - smact_min) * x / (x +
    x_half_gflop), x = GFLOP per step x precision factor; SMOCC = SMACT x smocc_per_smact; DRAMA = SMACT x
    drama_per_smact; ``by_model``: model name -> measured activity alone, used before the curve. ``feature``:
    the curve's x (``flops`` or the ``proxy``); with ``flops``, a job without FLOPs gets proxy x
    ``proxy_to_flops`` (median measured ratio, ``benchmarks/placement_fit.py``). ``share_capacity``: the
    sharing model's capacity (``share.py``), fitted by ``benchmarks/placement_share_fit.py`` over
    ``share_source``; ``share_capacity_by_gpu``: per GPU model key (``H200``), ``capacity_for``."""

    smact_min: float
    smact_max: float
    x_half_gflop: float
    precision_factor: Dict[str, float]
    smocc_per_smact: float
    drama_per_smact: float
    unknown: Activity
    by_model: Dict[str, Activity]
    source: str = ""
    feature: str = "proxy"
    proxy_to_flops: float = 1.0
    share_capacity: float = 1.0
    share_source: str = ""
    share_capacity_by_gpu: Dict[str, float] = field(default_factory=dict)
    unmeasured_smact_floor: Optional[float] = None

    @property
    def smact_floor(self) -> float:
        """The least SM activity alone of a never measured job: ``unmeasured_smact_floor``, else
        ``unknown.smact`` (an under-predicted job breaks the bound, so a prediction only raises one)."""
        return self.unmeasured_smact_floor if self.unmeasured_smact_floor is not None else self.unknown.smact

    def capacity_for(self, model: str) -> float:
        """The sharing capacity of a GPU model (0.1..10): the longest ``share_capacity_by_gpu`` key the name
        contains, else ``share_capacity``; a model not known yet ("") gets the least of any, as it may be that
        one."""
        if not model:
            return min([self.share_capacity, *self.share_capacity_by_gpu.values()])
        keys = (sorted((k for k in self.share_capacity_by_gpu if k and k in model), key=len, reverse=True))
        return self.share_capacity_by_gpu[keys[0]] if keys else self.share_capacity


def _act(d: Any, where: str) -> Activity:
    if not isinstance(d, Mapping):
        raise ConfigError(f"calibration {where}: expected an object with smact/smocc/drama")
    try:
        return Activity(*(float(d.get(k, 0.0)) for k in ("smact", "smocc", "drama")))
    except (TypeError, ValueError):
        raise ConfigError(f"calibration {where}: smact/smocc/drama must be numbers") from None


def load_calibration(path: Optional[str] = None) -> Calibration:
    """None or empty ``path``: ``DEFAULT_CALIBRATION``. ConfigError: unreadable, not JSON, a bad coefficient.
    """
    p = Path(path) if path else DEFAULT_CALIBRATION
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
        cal = Calibration(
            smact_min=float(d["smact_min"]), smact_max=float(d["smact_max"]),
            x_half_gflop=float(d["x_half_gflop"]),
            precision_factor={str(k): float(v) for k, v in d.get("precision_factor", {}).items()},
            smocc_per_smact=float(d["smocc_per_smact"]), drama_per_smact=float(d["drama_per_smact"]),
            unknown=_act(d["unknown"], "unknown"),
            by_model={str(k): _act(v, f"by_model.{k}") for k, v in d.get("by_model", {}).items()},
            source=str(d.get("source", "")), feature=str(d.get("feature", "proxy")),
            proxy_to_flops=float(d.get("proxy_to_flops", 1.0)),
            share_capacity=float(d.get("share_capacity", 1.0)), share_source=str(d.get("share_source", "")),
            share_capacity_by_gpu={str(k): float(v) for k, v in d.get("share_capacity_by_gpu", {}).items()},
            unmeasured_smact_floor=(float(d["unmeasured_smact_floor"]) if d.get("unmeasured_smact_floor")
                                    is not None else None))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"cannot read placement calibration {str(p)!r}: {exc!r}") from None
    if cal.x_half_gflop <= 0 or not 0 <= cal.smact_min <= cal.smact_max <= 1 or cal.proxy_to_flops <= 0 \
            or cal.feature not in ("flops", "proxy") \
            or not all(0.1 <= c <= 10 for c in (cal.share_capacity, *cal.share_capacity_by_gpu.values())) \
            or not 0 <= cal.smact_floor <= 1:
        raise ConfigError(f"placement calibration {str(p)!r}: need x_half_gflop > 0, "
                          "0 <= smact_min <= smact_max <= 1, proxy_to_flops > 0, feature flops or proxy "
                          "0.1 <= share_capacity <= 10 and 0 <= unmeasured_smact_floor <= 1")
    return cal


def predict(f: Features, cal: Calibration) -> Activity:
    """Activity alone without history: ``by_model``'s measured one, the curve's, or ``cal.unknown`` without
    FLOPs."""
    if f.model and f.model in cal.by_model:
        return cal.by_model[f.model]
    if f.gflop_per_step is None:
        return cal.unknown
    x = f.gflop_per_step * cal.precision_factor.get(f.precision, 1.0)
    if f.from_proxy and cal.feature == "flops":
        x *= cal.proxy_to_flops
    if not math.isfinite(x) or x < 0:
        return cal.unknown  # never a NaN prediction (the comment's bounds already keep x finite)
    smact = cal.smact_min + (cal.smact_max - cal.smact_min) * x / (x + cal.x_half_gflop)
    return Activity(smact, min(1.0, smact * cal.smocc_per_smact), min(1.0, smact * cal.drama_per_smact))


HistoryKey = Tuple[Optional[int], str]
"""``(uid, signature)``: whose alone runs measured a signature; uid None for the admin's
``placement_history_path``."""


def history_keys(sig: Optional[str], uid: Optional[int]) -> Tuple[HistoryKey, ...]:
    """The keys that may steer ``uid``'s job: ``(uid, sig)``, then the admin's ``(None, sig)``; () without
    ``sig``."""
    if not sig:
        return ()
    return ((uid, sig), (None, sig)) if uid is not None else ((None, sig),)


def from_history(runs: Sequence[Activity]) -> Optional[Activity]:
    """Component-wise mean of earlier alone runs (fractions), or None without runs."""
    if not runs:
        return None
    n = len(runs)
    return (Activity(sum(r.smact for r in runs) / n, sum(r.smocc for r in runs) / n,
                     sum(r.drama for r in runs) / n))


def demand(c: JobComment, history: Mapping[HistoryKey, Sequence[Activity]], cal: Calibration,
           uid: Optional[int] = None) -> Tuple[Activity, str]:
    """The job's predicted activity alone and its source (``history`` or ``predicted``). Only runs of its own
    ``uid`` (the uid Slurm runs it as) count, then the admin's file (uid None): a user could otherwise forge a
    signature's history for everyone."""
    for key in history_keys(c.signature(), uid):
        h = from_history(history.get(key, ()))
        if h is not None:
            return h, "history"
    return predict(features(c), cal), "predicted"
