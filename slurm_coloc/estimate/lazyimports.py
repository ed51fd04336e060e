"""Keep ``torch._dynamo`` unimported while an fp32 spec is imported and traced.

Importing ``torch._dynamo`` costs about as much as torch itself (~1.5-2.5 s on the 2-core machine) and the
meta-device trace compiles nothing, yet it gets imported: ``torchvision.ops.roi_align`` imports
``torch._dynamo.utils.is_compile_supported`` at import time; ``torch._disable_dynamo``-wrapped functions
(every ``TorchDispatchMode.__torch_dispatch__``, ``Optimizer.zero_grad``, the foreach kernels) import it on
first call to wrap themselves in ``torch._dynamo.disable``; ``Optimizer.step`` calls
``torch._dynamo.graph_break()``.

Inside :func:`deferred_imports`, ``sys.modules`` holds two stand-ins: ``torch._dynamo.utils``, whose
``is_compile_supported`` imports the real module when called, and ``torch._dynamo``, whose ``disable(fn)``
returns ``fn`` to ``torch._disable_dynamo``'s lazy wrapper (the real ``disable`` to anyone else) and whose
``graph_break()`` does nothing. Outside compilation both are exactly that (``disable`` only swaps dynamo's
frame callback, unset when nothing compiles; ``graph_break``'s body is empty); called after the block they
forward to the real ones. So the traced allocations are unchanged (checked by
``benchmarks/estimator_identity.py``).

Any other attribute of a stand-in removes the stand-ins and imports the real module. A stand-in is not a
package: ``import torch._dynamo.<submodule>`` fails inside the block and ``trace.trace_spec`` traces again
without them (FakeTensorMode, used for AMP, needs such submodules, so AMP traces never use them). On exit the
stand-ins go and every ``fn.__dynamo_disable`` cache holding ``fn`` is deleted. :func:`may_need_real_dynamo`
tells whether a failure could come from the stand-ins, so a model's own error does not pay for a second trace.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import sys
import types
from typing import Any, Dict, Iterator, List

_DYNAMO = "torch._dynamo"
_UTILS = "torch._dynamo.utils"


class _StandIn(types.ModuleType):
    """A module whose attributes, other than the ones set on it, come from the real module
    (imported on first need, after the stand-ins are removed)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # inspect/warnings probing dunders must not trigger the import
            raise AttributeError(f"stand-in module {self.__name__!r} has no attribute {name!r}")
        _drop()
        return getattr(importlib.import_module(self.__name__), name)


_active: List[_StandIn] = []
_identity_disabled: List[Any] = []


def _drop() -> None:
    """Remove the stand-ins from ``sys.modules`` and ``torch._dynamo``."""
    torch = sys.modules.get("torch")
    for mod in _active:
        if sys.modules.get(mod.__name__) is mod:
            del sys.modules[mod.__name__]
        if torch is not None and torch.__dict__.get("_dynamo") is mod:
            del torch._dynamo
    _active.clear()


def _is_compile_supported(device_type: Any) -> Any:
    return importlib.import_module(_UTILS).is_compile_supported(device_type)


def _real(name: str) -> Any:
    """Attribute ``name`` of the real ``torch._dynamo`` (the stand-ins are removed first)."""
    _drop()
    return getattr(importlib.import_module(_DYNAMO), name)


def _graph_break(msg: str = "") -> None:
    """``torch._dynamo.graph_break``: outside compilation its body is empty, so inside the block
    nothing is done; a caller that kept this function past the block gets the real one."""
    if not _active:
        _real("graph_break")(msg)


def _disable(fn: Any = None, recursive: bool = True, **kwargs: Any) -> Any:
    """``torch._dynamo.disable``: ``fn`` itself for ``torch._disable_dynamo``'s lazy wrapper (which
    caches the result on ``fn``; the cache is deleted on exit), the real one for anything else
    (e.g. ``torch.compiler.disable`` decorating a model's function at import time, whose result
    lives on after the block)."""
    caller = sys._getframe(1).f_code.co_filename.replace("\\", "/")
    if fn is None or not _active or not caller.endswith("torch/_compile.py"):
        return _real("disable")(fn, recursive, **kwargs)
    _identity_disabled.append(fn)
    return fn


def _stand_in(name: str, attrs: Dict[str, Any], path: Any) -> _StandIn:
    mod = _StandIn(name)
    mod.__dict__.update(attrs)
    # importlib.util.find_spec(name) returns a module's __spec__ once it is in sys.modules
    try:
        mod.__spec__ = importlib.machinery.PathFinder.find_spec(name, path)
    except (ImportError, ValueError):  # pragma: no cover - spec lookup is best effort
        mod.__spec__ = None
    return mod


@contextlib.contextmanager
def deferred_imports() -> Iterator[None]:
    """Run the block with the stand-ins (module docstring); a no-op once ``torch._dynamo`` is in."""
    import torch

    mine = not (_DYNAMO in sys.modules or _UTILS in sys.modules or "_dynamo" in torch.__dict__ or _active)
    if mine:
        dyn = _stand_in(_DYNAMO, {"disable": _disable, "graph_break": _graph_break}, list(torch.__path__))
        path = list(dyn.__spec__.submodule_search_locations or []) if dyn.__spec__ else []
        utils = _stand_in(_UTILS, {"is_compile_supported": _is_compile_supported}, path)
        _active.extend((dyn, utils))
        sys.modules[_DYNAMO] = dyn
        sys.modules[_UTILS] = utils
        torch._dynamo = dyn  # type: ignore[attr-defined]  # what ``import torch._dynamo`` then reads
    try:
        yield
    finally:
        if mine:
            _drop()
            for fn in _identity_disabled:
                if getattr(fn, "__dynamo_disable", None) is fn:
                    try:
                        delattr(fn, "__dynamo_disable")
                    except AttributeError:  # pragma: no cover - read-only function attributes
                        pass
            _identity_disabled.clear()


def may_need_real_dynamo(exc: BaseException) -> bool:
    """Whether ``exc``, raised inside :func:`deferred_imports`, could be due to the stand-ins.

    True unless it is an ``EstimateError`` with no ``_dynamo`` in its message or its causes (a stand-in's
    failures, e.g. ``torch._dynamo' is not a package``, always name it).
    """
    from slurm_coloc.errors import EstimateError

    if not isinstance(exc, EstimateError):
        return True
    seen: List[BaseException] = []
    cur: Any = exc
    while cur is not None and not any(cur is s for s in seen):
        if "_dynamo" in str(cur):
            return True
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    return False
