"""Find and build the user's model from a ``ModelSpec`` (imports user code: never call from hooks).

The callable is named ``package.module:callable`` (imported) or ``path/to/file.py:callable``
(relative to ``spec.base_dir``). Every failure is an ``EstimateError`` naming the model.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any, Callable

from slurm_coloc.errors import EstimateError
from slurm_coloc.estimate.spec import OPTIMIZERS, PRECISIONS, ModelSpec

MAX_BATCH_SIZE = 1 << 20
MAX_SAMPLE_ELEMENTS = 1 << 28


def validate_spec(spec: ModelSpec) -> None:
    """Check a spec's plain fields before anything is imported.

    Raises:
        EstimateError: malformed model name, batch size, shape, dtype, optimizer or precision.
    """
    if not isinstance(spec.model, str) or spec.model.count(":") != 1 or not all(spec.model.split(":")):
        raise EstimateError(
            f"model {spec.model!r}: expected 'package.module:callable' or 'path/file.py:callable'"
        )
    if not isinstance(spec.batch_size, int) or not 1 <= spec.batch_size <= MAX_BATCH_SIZE:
        raise EstimateError(
            f"model {spec.model}: batch size {spec.batch_size!r} is not between 1 and {MAX_BATCH_SIZE}"
        )
    shape = tuple(spec.input_shape)
    if not shape or any((not isinstance(d, int)) or d < 1 for d in shape):
        raise EstimateError(f"model {spec.model}: input shape {shape!r} must be positive integers")
    n = 1
    for d in shape:
        n *= d
    if n > MAX_SAMPLE_ELEMENTS:
        raise EstimateError(f"model {spec.model}: input shape {shape!r} has {n} elements per sample")
    if spec.input_dtype not in ("float32", "int64"):
        raise EstimateError(f"model {spec.model}: input dtype {spec.input_dtype!r} not float32 or int64")
    if spec.optimizer not in OPTIMIZERS:
        raise EstimateError(f"model {spec.model}: optimizer {spec.optimizer!r} not one of {OPTIMIZERS}")
    if spec.precision not in PRECISIONS:
        raise EstimateError(f"model {spec.model}: precision {spec.precision!r} not one of {PRECISIONS}")


def load_callable(spec: ModelSpec) -> Callable[..., Any]:
    """Import the model callable named by ``spec.model``.

    Raises:
        EstimateError: unknown module or file, import failure, missing or non-callable attribute.
    """
    target, attr = spec.model.rsplit(":", 1)
    if target.endswith(".py"):
        path = target if os.path.isabs(target) else os.path.join(spec.base_dir, target)
        path = os.path.abspath(path)
        if not os.path.isfile(path):
            raise EstimateError(f"model {spec.model}: file {path} not found")
        name = "_coloc_user_model_" + str(abs(hash(path)))
        mod_spec = importlib.util.spec_from_file_location(name, path)
        if mod_spec is None or mod_spec.loader is None:
            raise EstimateError(f"model {spec.model}: cannot load {path} as Python")
        module = importlib.util.module_from_spec(mod_spec)
        sys.path.insert(0, os.path.dirname(path))
        try:
            sys.modules[name] = module
            mod_spec.loader.exec_module(module)
        except Exception as exc:  # user code: any failure is the user's model failing
            sys.modules.pop(name, None)
            raise EstimateError(f"model {spec.model}: importing {path} failed: {_short(exc)}") from exc
        finally:
            sys.path.remove(os.path.dirname(path))
    else:
        added = False
        if spec.base_dir and spec.base_dir not in sys.path:
            sys.path.insert(0, os.path.abspath(spec.base_dir))
            added = True
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as exc:
            raise EstimateError(f"model {spec.model}: module {target!r} not found ({exc.name})") from exc
        except Exception as exc:
            raise EstimateError(f"model {spec.model}: importing {target} failed: {_short(exc)}") from exc
        finally:
            if added:
                sys.path.remove(os.path.abspath(spec.base_dir))
    fn = getattr(module, attr, None)
    if fn is None:
        raise EstimateError(f"model {spec.model}: {target} has no attribute {attr!r}")
    if not callable(fn):
        raise EstimateError(f"model {spec.model}: {target}.{attr} is not callable")
    return fn


def build_model(spec: ModelSpec, fn: Callable[..., Any]) -> Any:
    """Call the model callable with ``spec.kwargs``; the result must be a ``torch.nn.Module``.

    Raises:
        EstimateError: the callable raised or returned something else.
    """
    import torch

    try:
        model = fn(**dict(spec.kwargs))
    except Exception as exc:
        raise EstimateError(f"model {spec.model}: building it raised {_short(exc)}") from exc
    if not isinstance(model, torch.nn.Module):
        raise EstimateError(
            f"model {spec.model}: callable returned {type(model).__name__}, not a torch.nn.Module"
        )
    return model


def _short(exc: BaseException) -> str:
    """``Type: first line of message`` (at most 200 characters)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    out = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return out[:200]
