"""Per-user cache of estimates, so a repeated ``coloc-estimate``/``coloc-sbatch`` skips torch entirely.

``$XDG_CACHE_HOME/slurm-coloc/estimates.json`` (``COLOC_ESTIMATE_CACHE=off`` bypasses it). The key is the
sha256 of: the spec and canonical GPU name; the model's code (a ``file.py`` model's sha256; a module's
installed distribution and version and, when found on disk without importing it, its file's sha256:
the package directories are walked, so an ``__init__`` that imports torch never runs); torch's installed
version (``importlib.metadata``, never ``import torch``); slurm-coloc's version and the estimator's sources
and weights. Only trace-derived estimates are cached (history applies on top); a model whose code cannot be
pinned down is not cached. Limit: a ``file.py`` model's sibling modules are not hashed.

Writes are atomic; a missing, unreadable or corrupt file reads as empty and a failed write is ignored: the
cache only saves time, never fails an estimate. At most ``MAX_ENTRIES`` (oldest dropped).
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.machinery
import importlib.metadata
import json
import os
import tempfile
import time
from typing import Any, Dict, List, Optional

from slurm_coloc.estimate.spec import Estimate, ModelSpec

MAX_ENTRIES = 512
FORMAT = 1
_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_SOURCES = ("__init__.py", "combine.py", "convcall.py", "gpulike.py", "loader.py", "spec.py", "trace.py",
            "tracker.py", "workspace.py")
_WEIGHTS = ("calibration.json", "conv_workspace_h100.npz")


def enabled() -> bool:
    """False when ``COLOC_ESTIMATE_CACHE`` is ``off``/``0``/``no``/``false``."""
    return os.environ.get("COLOC_ESTIMATE_CACHE", "on").strip().lower() not in ("off", "0", "no", "false")


def cache_path() -> str:
    """``$XDG_CACHE_HOME/slurm-coloc/estimates.json`` (``~/.cache`` when unset or not absolute)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "slurm-coloc", "estimates.json")


def _sha256_file(path: str) -> Optional[str]:
    try:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()
    except OSError:
        return None


def _dist_version(name: str) -> Optional[str]:
    try:
        return importlib.metadata.version(name)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None


def _module_file(dotted: str, base_dir: str) -> Optional[str]:
    """The file of module ``dotted`` found on ``[base_dir] + sys.path`` without importing anything."""
    import sys

    parts = dotted.split(".")
    search: List[str] = ([os.path.abspath(base_dir)] if base_dir else []) + list(sys.path)
    spec = importlib.machinery.PathFinder.find_spec(parts[0], search)
    if spec is None:
        return None
    if len(parts) == 1:
        return spec.origin if spec.origin and os.path.isfile(spec.origin) else None
    dirs = list(spec.submodule_search_locations or [])
    for i, part in enumerate(parts[1:], start=1):
        found = None
        for d in dirs:
            pkg = os.path.join(d, part)
            if os.path.isfile(os.path.join(pkg, "__init__.py")):
                found = ("pkg", pkg)
                break
            if i == len(parts) - 1 and os.path.isfile(pkg + ".py"):
                return pkg + ".py"
        if found is None:
            return None
        if i == len(parts) - 1:
            return os.path.join(found[1], "__init__.py")
        dirs = [found[1]]
    return None


def _code_identity(spec: ModelSpec) -> Optional[Dict[str, Any]]:
    """What pins down the model's code (see module docstring), or None when nothing does."""
    target = spec.model.rsplit(":", 1)[0]
    if target.endswith(".py"):
        path = target if os.path.isabs(target) else os.path.join(spec.base_dir, target)
        path = os.path.abspath(path)
        digest = _sha256_file(path)
        return None if digest is None else {"file": path, "sha256": digest}
    top = target.split(".")[0]
    dist_version = _dist_version(top) or _dist_version(top.replace("_", "-"))
    mod_file = _module_file(target, spec.base_dir)
    mod_sha = _sha256_file(mod_file) if mod_file else None
    if dist_version is None and mod_sha is None:
        return None
    return {"module": target, "dist": top, "dist_version": dist_version, "file_sha256": mod_sha}


def estimator_identity() -> Dict[str, Any]:
    """The estimator's identity for cache keys: versions, sha256 of its sources and shipped weights."""
    h = hashlib.sha256()
    for name in _SOURCES:
        h.update(name.encode() + b"\0" + (_sha256_file(os.path.join(_PKG_DIR, name)) or "-").encode())
    return {
        "slurm_coloc": _dist_version("slurm-coloc"),
        "torch": _dist_version("torch"),
        "sources_sha256": h.hexdigest(),
        "weights": {w: _sha256_file(os.path.join(_PKG_DIR, "weights", w)) for w in _WEIGHTS},
    }


def cache_key(spec: ModelSpec, gpu_name: str) -> Optional[str]:
    """Hex sha256 (64 digits) of (spec, GPU, model code, torch, estimator), or None when nothing pins the code
    down.

    Never raises for an unreadable file: it only makes the spec uncacheable.
    """
    code = _code_identity(spec)
    if code is None:
        return None
    blob = {"format": FORMAT, "spec": spec.to_json(), "gpu": gpu_name, "code": code,
            "estimator": estimator_identity()}
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()


def _read(path: str) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"),
                                                                                    dict):
        return {}
    return data["entries"]


def lookup(key: str) -> Optional[Estimate]:
    """The cached ``Estimate`` (``detail["cached"] = True``); None: miss, corrupt file or bad entry."""
    entry = _read(cache_path()).get(key)
    if not isinstance(entry, dict):
        return None
    try:
        est = Estimate.from_json(entry)
    except ValueError:
        return None
    return dataclasses.replace(est, detail=dict(est.detail, cached=True))


def store(key: str, est: Estimate) -> None:
    """Add ``est`` under ``key`` with ``stored_at`` (Unix s), keeping the newest ``MAX_ENTRIES`` (atomic
    replace).

    An unwritable cache or an unserialisable detail (OSError, TypeError, ValueError) is skipped, not raised.
    """
    path = cache_path()
    try:
        entries = _read(path)
        entries[key] = {**est.to_json(), "stored_at": time.time()}
        if len(entries) > MAX_ENTRIES:
            keep = sorted(entries, key=lambda k: float(entries[k].get("stored_at", 0))
                          if isinstance(entries[k], dict) else 0.0)[-MAX_ENTRIES:]
            entries = {k: entries[k] for k in keep}
        d = os.path.dirname(path)
        os.makedirs(d, mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".estimates-", suffix=".tmp", dir=d)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({"format": FORMAT, "entries": entries}, fh, sort_keys=True)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except (OSError, TypeError, ValueError):
        return
