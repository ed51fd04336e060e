"""What a trace imports: the user's model from a ``ModelSpec`` (user code: never call from hooks), and
``torch._dynamo`` kept out of an fp32 trace.

The callable is ``package.module:callable`` or ``path/to/file.py:callable`` (relative to ``spec.base_dir``);
every failure is an ``EstimateError`` naming the model. Whose code runs: a ``package.module`` model is
imported from the interpreter's own path only (``sys.path`` without the current directory, ``''`` and the
script's directory), so a ``torchvision/__init__.py`` planted beside a script in a shared directory is never
imported. A ``file.py`` model is imported by path, with its directory first on ``sys.path`` while it loads,
only when ``trusted_dir`` accepts that directory: owned by the submitting user (or root) and writable by
nobody else, and so is every directory above it up to the first root-owned one.

Importing ``torch._dynamo`` costs about as much as torch (~1.5-2.5 s on 2 cores) and the meta trace compiles
nothing, yet ``torchvision.ops.roi_align`` imports it at import time, ``torch._disable_dynamo``-wrapped
functions (``__torch_dispatch__``, ``Optimizer.zero_grad``, foreach kernels) on first call, and
``Optimizer.step`` calls its ``graph_break()``. Inside :func:`deferred_imports` ``sys.modules`` holds
stand-ins for ``torch._dynamo`` and ``torch._dynamo.utils`` doing what the real ones do outside compilation
(``disable`` only swaps the frame callback, ``graph_break`` is empty), so the traced allocations are unchanged
(``benchmarks/estimator_identity.py``). Any other attribute imports the real module; a stand-in is no package,
so ``import torch._dynamo.<sub>`` fails and ``trace.trace_spec`` traces again without them (AMP's
FakeTensorMode needs submodules: AMP traces never use them). On exit the stand-ins go and every
``fn.__dynamo_disable`` cache holding ``fn`` is deleted.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.util
import os
import stat
import sys
import types
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional

from slurm_coloc.errors import EstimateError
from slurm_coloc.estimate.spec import OPTIMIZERS, PRECISIONS, ModelSpec

if TYPE_CHECKING:
    import torch

MAX_BATCH_SIZE = 1 << 20
MAX_SAMPLE_ELEMENTS = 1 << 28


def validate_spec(spec: ModelSpec) -> None:
    """Check a spec's plain fields before anything is imported (batch 1..``MAX_BATCH_SIZE``, at most
    ``MAX_SAMPLE_ELEMENTS`` per sample). EstimateError: bad model name, batch size, shape, dtype, optimizer or
    precision."""
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


def untrusted_dir_reason(directory: str, uid: Optional[int] = None) -> Optional[str]:
    """Why another user could put code into ``directory`` (one line), or None when only ``uid`` and root can.

    ``uid`` None: ours. Checks ``directory`` (after ``realpath``: a symlink is judged by its target) and each
    parent up to and including the first root-owned one: each owned by ``uid`` or root. ``directory`` must not
    be group- or other-writable (anyone who can add an entry can add ``torch/``); a parent may be, with the
    sticky bit only (as ``/tmp``). A directory that cannot be ``lstat``'d is a reason; never raises
    OSError."""
    uid = os.getuid() if uid is None else uid
    own = path = os.path.realpath(directory)
    while True:
        try:
            st = os.lstat(path)
        except OSError as exc:
            return f"cannot check {path}: {exc.strerror}"
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid not in (uid, 0):
            return f"{path} is owned by uid {st.st_uid}, not by you (uid {uid}) or root"
        if mode & (stat.S_IWGRP | stat.S_IWOTH) and (path == own or not mode & stat.S_ISVTX):
            return f"{path} is writable by other users (mode {mode:o})"
        parent = os.path.dirname(path)
        if st.st_uid == 0 or parent == path:
            return None
        path = parent


def trusted_dir(directory: str, model: str) -> None:
    """Raise EstimateError (one line naming the directory and the fix) unless ``directory`` holds only this
    user's code (``untrusted_dir_reason``)."""
    why = untrusted_dir_reason(directory)
    if why:
        raise EstimateError(
            f"model {model}: not importing code from {directory}: {why}; move the model file into a "
            "directory "
            f"only you can write (e.g. chmod go-w, or a directory under your home) and name it there")


@contextlib.contextmanager
def _interpreter_path_only(drop: List[str]) -> Iterator[None]:
    """``sys.path`` without the current directory, ``''``/``.`` and ``drop`` while the block runs."""
    saved = list(sys.path)
    cwd = os.path.realpath(os.getcwd())
    bad = {os.path.realpath(d) for d in drop if d} | {cwd}
    sys.path[:] = [p for p in saved if p not in ("", ".") and os.path.realpath(p) not in bad]
    try:
        yield
    finally:
        sys.path[:] = saved


def load_callable(spec: ModelSpec) -> Callable[..., Any]:
    """Import ``spec.model``: ``package.module:callable`` from the interpreter's path only,
    ``path/file.py:callable`` (relative to ``base_dir``) from a trusted directory only. EstimateError: unknown
    module or file, an untrusted directory, import failure (any exception the user's module raises), missing
    or non-callable attribute."""
    target, attr = spec.model.rsplit(":", 1)
    if target.endswith(".py"):
        path = target if os.path.isabs(target) else os.path.join(spec.base_dir, target)
        path = os.path.abspath(path)
        if not os.path.isfile(path):
            raise EstimateError(f"model {spec.model}: file {path} not found")
        trusted_dir(os.path.dirname(path), spec.model)
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
            raise EstimateError(f"model {spec.model}: importing {path} failed: {short_error(exc)}") from exc
        finally:
            sys.path.remove(os.path.dirname(path))
    else:
        try:
            with _interpreter_path_only([spec.base_dir]):
                module = importlib.import_module(target)
        except ModuleNotFoundError as exc:
            raise EstimateError(f"model {spec.model}: module {target!r} not found ({exc.name}) on the "
                                "interpreter's path (a local module: name it as "
                                "path/file.py:callable)") from exc
        except Exception as exc:
            raise EstimateError(f"model {spec.model}: importing {target} failed: {short_error(exc)}") from exc
    fn = getattr(module, attr, None)
    if fn is None:
        raise EstimateError(f"model {spec.model}: {target} has no attribute {attr!r}")
    if not callable(fn):
        raise EstimateError(f"model {spec.model}: {target}.{attr} is not callable")
    return fn


def build_model(spec: ModelSpec, fn: Callable[..., object]) -> "torch.nn.Module":
    """Call the model callable with ``spec.kwargs``; EstimateError when it raises or returns no
    ``torch.nn.Module``."""
    import torch

    try:
        model = fn(**dict(spec.kwargs))
    except Exception as exc:
        raise EstimateError(f"model {spec.model}: building it raised {short_error(exc)}") from exc
    if not isinstance(model, torch.nn.Module):
        raise EstimateError(
            f"model {spec.model}: callable returned {type(model).__name__}, not a torch.nn.Module"
        )
    return model


def short_error(exc: BaseException) -> str:
    """``Type: first line of message``, at most 200 characters, for one-line estimate errors."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    out = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return out[:200]


_DYNAMO = "torch._dynamo"
_UTILS = "torch._dynamo.utils"


class _StandIn(types.ModuleType):
    """A module whose other attributes come from the real module (imported on first need, stand-ins
    removed)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # inspect/warnings probing dunders must not trigger the import
            raise AttributeError(f"stand-in module {self.__name__!r} has no attribute {name!r}")
        _drop()
        return getattr(importlib.import_module(self.__name__), name)


_active: List[_StandIn] = []
_identity_disabled: List[Callable[..., object]] = []


def _drop() -> None:
    """Remove the stand-ins from ``sys.modules`` and ``torch._dynamo``."""
    torch = sys.modules.get("torch")
    for mod in _active:
        if sys.modules.get(mod.__name__) is mod:
            del sys.modules[mod.__name__]
        if torch is not None and torch.__dict__.get("_dynamo") is mod:
            del torch._dynamo
    _active.clear()


def _is_compile_supported(device_type: str) -> bool:
    return importlib.import_module(_UTILS).is_compile_supported(device_type)


def _real(name: str) -> Any:
    """Attribute ``name`` of the real ``torch._dynamo`` (the stand-ins are removed first)."""
    _drop()
    return getattr(importlib.import_module(_DYNAMO), name)


def _graph_break(msg: str = "") -> None:
    """Nothing inside the block (outside compilation the body is empty); the real one after it."""
    if not _active:
        _real("graph_break")(msg)


def _disable(fn: Optional[Callable[..., object]] = None, recursive: bool = True, **kwargs: object) -> Any:
    """``fn`` itself for ``torch._disable_dynamo``'s lazy wrapper (it caches the result on ``fn``, deleted on
    exit); the real ``disable`` for anything else (``torch.compiler.disable`` at a model's import: it lives
    on)."""
    caller = sys._getframe(1).f_code.co_filename.replace("\\", "/")
    if fn is None or not _active or not caller.endswith("torch/_compile.py"):
        return _real("disable")(fn, recursive, **kwargs)
    _identity_disabled.append(fn)
    return fn


def _stand_in(name: str, attrs: Dict[str, Callable[..., object]], path: Optional[List[str]]) -> _StandIn:
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
    """Whether ``exc``, raised inside :func:`deferred_imports`, could be due to the stand-ins: unless it is an
    ``EstimateError`` with no ``_dynamo`` in its message or causes (a stand-in's failures always name it)."""
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
