"""FLOP counting for a traced training step: ``torch.utils.flop_counter.FlopCounterMode`` for a total.

The counter sits below the tracker on the dispatch mode stack (``trace.py``, ``probe/inject/main.py``) and
counts matrix multiplications, convolutions and fused attention forward and backward (torch's shape
formulas); element-wise ops, normalisations and the optimizer step count zero in those formulas. One step's
FLOPs are the difference of the counter's totals at two step ends (:func:`step_flops`).
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional


class _GlobalOnly:
    """Stands in for ``FlopCounterMode``'s ``ModuleTracker``: every FLOP goes to ``"Global"``, no hooks."""

    parents = frozenset({"Global"})

    def __enter__(self) -> "_GlobalOnly":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def make_flop_counter() -> Any:
    """A ``FlopCounterMode(display=False)`` for a total count, or None when this torch has none.

    Its ``ModuleTracker`` (newer torch) puts global module hooks that register ``register_multi_grad_hook``s
    on every module's inputs and outputs; those hold gradients until all of a module's inputs have theirs,
    which changed the replayed peak of DenseNet-121 (its layers take lists of tensors). A total needs no
    per-module attribution, so the tracker is replaced by :class:`_GlobalOnly`: the counting mode alone stays.
    A formula that raises counts 0 and sets ``coloc_failed`` (the count is then unknown, the trace goes on).
    """
    try:
        from torch.utils.flop_counter import FlopCounterMode
    except ImportError:
        return None
    counter: Any = FlopCounterMode(display=False)
    if hasattr(counter, "mod_tracker"):
        counter.mod_tracker = _GlobalOnly()
    counter.coloc_failed = False
    registry = getattr(counter, "flop_registry", None)
    if isinstance(registry, dict):
        def guarded(formula: Callable[..., Any]) -> Callable[..., Any]:
            def count(*args: Any, **kwargs: Any) -> Any:
                try:
                    return formula(*args, **kwargs)
                except Exception:  # a FLOP formula never fails the memory trace
                    counter.coloc_failed = True
                    return 0
            return count

        counter.flop_registry = {k: guarded(v) for k, v in registry.items()}
    return counter


def step_flops(totals: List[int], counter: Any) -> Optional[int]:
    """The last step's FLOPs (last two ``totals``' difference); None: fewer, no counter, or failed."""
    if counter is None or getattr(counter, "coloc_failed", False) or len(totals) < 2:
        return None
    return int(totals[-1] - totals[-2])
