"""Find and build the user's model from a ``ModelSpec`` (imports user code: never call from hooks).

The callable is named ``package.module:callable`` or ``path/to/file.py:callable`` (relative to
``spec.base_dir``). Every failure is an ``EstimateError`` naming the model.

Whose code runs: a ``package.module`` model is imported from the interpreter's own path only (``sys.path``
without the current directory, ``''`` and the script's directory), so a ``torchvision/__init__.py`` planted
beside a script in a shared directory is never imported. A ``file.py`` model is imported by path, with its
directory first on ``sys.path`` while it loads, only when ``trusted_dir`` accepts that directory: owned by the
submitting user (or root) and writable by nobody else, and so is every directory above it up to the first
root-owned one.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import stat
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator, List, Optional

from slurm_coloc.errors import EstimateError
from slurm_coloc.estimate.spec import OPTIMIZERS, PRECISIONS, ModelSpec

MAX_BATCH_SIZE = 1 << 20
MAX_SAMPLE_ELEMENTS = 1 << 28


def validate_spec(spec: ModelSpec) -> None:
    """Check a spec's plain fields before anything is imported (batch 1..``MAX_BATCH_SIZE``,
    ``MAX_SAMPLE_ELEMENTS``).

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


def untrusted_dir_reason(directory: str, uid: Optional[int] = None) -> Optional[str]:
    """Why another user could put code into ``directory`` (one line), or None when only ``uid`` and root can.

    ``uid`` None: ours. Checks ``directory`` (after ``realpath``: a symlink is judged by its target) and each
    parent up to and including the first root-owned one: each owned by ``uid`` or root. ``directory`` must not
    be group- or other-writable (anyone who can add an entry can add ``torch/``); a parent may be, with the
    sticky bit only (as ``/tmp``). A directory that cannot be ``lstat``'d is a reason; never raises OSError.
    """
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
    """Raise unless ``directory`` holds only this user's code (``untrusted_dir_reason``).

    Raises:
        EstimateError: one line naming the directory and the fix.
    """
    why = untrusted_dir_reason(directory)
    if why:
        raise EstimateError(
            f"model {model}: not importing code from {directory}: {why}; move the model file into a "
            "directory "
            f"only you can write (e.g. chmod go-w, or a directory under your home) and name it there")


@contextmanager
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
    """Import ``spec.model``: ``package.module:callable`` from the interpreter's path only, or
    ``path/file.py:callable`` (relative to ``base_dir``) from a trusted directory only.

    Raises:
        EstimateError: unknown module or file, an untrusted directory, import failure (any exception the
            user's module raises), missing or non-callable attribute.
    """
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


def build_model(spec: ModelSpec, fn: Callable[..., Any]) -> Any:
    """Call the model callable with ``spec.kwargs``; the result must be a ``torch.nn.Module``.

    Raises:
        EstimateError: the callable raised or returned something else.
    """
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
