"""Data-dependent scalars in a trace without data, and picking the logits from a model's output.

The trace runs on ``meta`` (fp32) or fake CPU tensors (AMP): shapes, no values. Code reading a value back
(``.item()``, ``bool(t)``, ``if (t == 0).all():``) dispatches ``aten._local_scalar_dense``, which meta
tensors refuse; Hugging Face transformers 5.x does it in every causal LM with ``use_cache=False``
(``find_packed_sequence_indices``). :class:`ScalarAssumptions` answers with what a well-formed batch gives:

* a 0-dim ``all`` result (validity checks: ``torch._check_tensor_all``, "no padding") -> ``True``;
* a 0-dim ``any`` result (anomaly checks: NaN, ids out of range, padding present) -> ``False``;
* any other boolean -> ``False``, any other number -> ``0`` (the zero-filled token-id input, in
  ``[0, vocab)``).

So the trace takes the GPU's path for ordinary batches. Every assumed read is counted and reported in the
estimate's detail (``assumed_values``), so a user sees the figure rests on assumptions.
"""
from __future__ import annotations

from typing import Any, Dict

ORIGIN_OPS = ("all", "any")
NOTE = ("data-dependent reads (.item()/bool()) answered without data: all() -> True, "
        "any() -> False, other booleans False, numbers 0 (a well-formed, unpadded batch)")


class ScalarAssumptions:
    """Remembers which 0-dim tensors came from ``all``/``any`` and answers value reads of them.

    ``counts``: assumed reads by kind (``all``, ``any``, ``bool``, ``number``).
    """

    def __init__(self) -> None:
        self.origin: Dict[int, str] = {}
        self.counts: Dict[str, int] = {}

    def note_output(self, func: Any, out: Any, storage_key: int) -> None:
        """Record that 0-dim ``out`` (``storage_key``) came from ``func`` (``ORIGIN_OPS`` only)."""
        name = func.__name__.split(".")[0]
        if name in ORIGIN_OPS:
            self.origin[storage_key] = name

    def forget(self, storage_key: int) -> None:
        """The storage died: its key may be reused by an unrelated tensor."""
        self.origin.pop(storage_key, None)

    def answer(self, torch: Any, t: Any) -> Any:
        """0-dim ``t``'s assumed value, counted: True (``all``), False (``any``, bool), else 0.0 or 0."""
        kind = self.origin.get(t.untyped_storage()._cdata, "")
        if kind == "all":
            value: Any = True
        elif kind == "any":
            value = False
        elif t.dtype == torch.bool:
            kind, value = "bool", False
        else:
            kind = "number"
            value = 0.0 if (t.dtype.is_floating_point or t.dtype.is_complex) else 0
        self.counts[kind] = self.counts.get(kind, 0) + 1
        return value

    @property
    def total(self) -> int:
        """How many value reads were answered by assumption."""
        return sum(self.counts.values())


def has_no_data(torch: Any, t: Any) -> bool:
    """Whether ``t`` is a tensor without values: on ``meta``, or a ``FakeTensor``."""
    if not isinstance(t, torch.Tensor):
        return False
    if t.device.type == "meta":
        return True
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def pick_output(torch: Any, out: Any) -> Any:
    """The tensor the step's loss is computed from, given what ``model(x)`` returned; None when none is found.

    A tensor as is; a tensor ``.logits`` (Hugging Face ``ModelOutput``); a dict's ``"logits"``, else its first
    tensor value; a tuple or list's first element (recursively, at most 8 levels).
    """
    for _ in range(8):  # bounded: nested containers
        if isinstance(out, torch.Tensor):
            return out
        logits = getattr(out, "logits", None)
        if isinstance(logits, torch.Tensor):
            return logits
        if isinstance(out, dict):
            if isinstance(out.get("logits"), torch.Tensor):
                return out["logits"]
            vals = [v for v in out.values() if v is not None]
            out = next((v for v in vals if isinstance(v, torch.Tensor)), vals[0] if vals else None)
        elif isinstance(out, (tuple, list)):
            out = out[0] if out else None
        else:
            return None
    return None
