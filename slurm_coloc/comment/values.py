"""What each value of the coloc JSON may be, and the checks that hold it there.

The bounds (``BOUNDS`` for integers, ``STR_CHARS`` for text, ``MODES``, the ``argv`` and spec limits), the
JSON reader that never turns an over-long integer, NaN or an infinity into a number (``_loads``), the per-key
checks ``JobComment.from_fields`` (``slurm_coloc.comment``) runs, ``CommentError`` for a value that breaks
them, and the typed model spec ``CommentSpec``. Pure: only ``json``.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, fields
from typing import Any, Dict, Mapping, Optional, Tuple

MAX_JSON_CHARS = 16384  # parse_comment ignores a coloc JSON longer than this (bounded work in root hooks)
MODES = ("shard", "whole-gpu", "gpu", "none")
BOUNDS: Dict[str, Tuple[int, int]] = {
    "v": (1, 1000), "shards": (1, 1 << 16), "gpus": (0, 1024), "mem_mib": (1, 1 << 24),
    "flops_per_step": (0, 10 ** 18), "bytes_per_step": (0, 10 ** 18), "retry_of": (1, (1 << 32) - 1),
    "batch_size": (1, 1 << 20), "kwargs_chars": (0, 1 << 20), "input_dim": (1, 1 << 24),
}
"""Inclusive bounds of every integer the comment may carry: 65,536 shards and 16 TiB in MiB (above any GPU,
far below SQLite's 64-bit INTEGER), 1e18 FLOP or bytes per step (an exa-op step; H100 does ~1e15 FLOP/s),
32-bit Slurm job ids, batch up to 2^20, each input dimension up to 2^24. ``flops_per_step``/``bytes_per_step``
also take a finite float in range (stored as int)."""
STR_CHARS: Dict[str, int] = {"method": 64, "gpu_model": 128, "model": 256, "input_dtype": 16, "optimizer": 32,
                             "precision": 16}
MAX_INPUT_DIMS = 8
MAX_INPUT_ELEMENTS = 1 << 40  # product of input_shape: keeps every derived figure (placement features) finite
MAX_KWARGS_CHARS = 8192
MAX_KWARGS_DEPTH = 16
MAX_ARGS = 4096  # the script's arguments (an OOM rerun's argv): count and characters per argument
MAX_ARG_CHARS = 4096
_SHA256 = re.compile(r"[0-9a-f]{64}")
# a longer JSON integer is never read as a number (Python's int() of 10^4300 digits raises)
_MAX_INT_DIGITS = 19


class CommentError(ValueError):
    """A coloc comment whose known keys break the protocol (the message names the key)."""


class _Invalid:
    """What a JSON number or constant outside the protocol parses to (never a valid value of any key)."""

    def __repr__(self) -> str:
        return "<invalid number>"


_BAD = _Invalid()


def _int(text: str) -> Any:
    return _BAD if len(text.lstrip("-")) > _MAX_INT_DIGITS else int(text)


def _float(text: str) -> Any:
    value = float(text)
    return value if math.isfinite(value) else _BAD


def _const(_text: str) -> Any:
    return _BAD  # NaN, Infinity, -Infinity: not JSON, never a value


def _loads(text: str) -> Any:
    return json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_const)


def _bounded_int(key: str, v: object, allow_float: bool = False) -> int:
    lo, hi = BOUNDS[key]
    if allow_float and isinstance(v, float) and math.isfinite(v) and v == int(v):
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise CommentError(f"{key} must be an integer in {lo}..{hi}")
    return int(v)


def _text(key: str, v: object, limit: int) -> str:
    if not isinstance(v, str) or len(v) > limit or "\x00" in v:
        raise CommentError(f"{key} must be a string of at most {limit} characters")
    return v


def _plain(v: object, depth: int = 0) -> bool:
    """Whether ``v`` is plain JSON within ``MAX_KWARGS_DEPTH`` (no invalid number anywhere)."""
    if depth > MAX_KWARGS_DEPTH:
        return False
    if isinstance(v, dict):
        return all(isinstance(k, str) and _plain(x, depth + 1) for k, x in v.items())
    if isinstance(v, list):
        return all(_plain(x, depth + 1) for x in v)
    return v is None or isinstance(v, (str, int, float, bool))


@dataclass(frozen=True)
class CommentSpec:
    """The model spec of a coloc comment (``ModelSpec.to_json``), each field checked; None: absent."""

    model: Optional[str] = None
    kwargs: Optional[Dict[str, Any]] = None
    input_shape: Optional[Tuple[int, ...]] = None
    input_dtype: Optional[str] = None
    batch_size: Optional[int] = None
    optimizer: Optional[str] = None
    precision: Optional[str] = None
    kwargs_chars: Optional[int] = None

    @classmethod
    def from_fields(cls, data: object) -> "CommentSpec":
        """The typed spec of a comment's ``spec`` object (unknown keys ignored, a null key absent).
        CommentError: not an object, or a known key out of type or range."""
        if not isinstance(data, dict):
            raise CommentError("spec must be an object")
        out: Dict[str, Any] = {}
        for key in ("model", "input_dtype", "optimizer", "precision"):
            if data.get(key) is not None:
                out[key] = _text(f"spec.{key}", data[key], STR_CHARS[key])
        for key in ("batch_size", "kwargs_chars"):
            if data.get(key) is not None:
                out[key] = _bounded_int(key, data[key])
        shape = data.get("input_shape")
        if shape is not None:
            if not isinstance(shape, list) or not 1 <= len(shape) <= MAX_INPUT_DIMS:
                raise CommentError(f"spec.input_shape must be a list of 1..{MAX_INPUT_DIMS} integers")
            dims = tuple(_bounded_int("input_dim", d) for d in shape)
            if math.prod(dims) > MAX_INPUT_ELEMENTS:
                raise CommentError(f"spec.input_shape has more than {MAX_INPUT_ELEMENTS} elements")
            out["input_shape"] = dims
        kwargs = data.get("kwargs")
        if kwargs is not None:
            if not isinstance(kwargs, dict) or not _plain(kwargs) \
                    or len(json.dumps(kwargs, sort_keys=True)) > MAX_KWARGS_CHARS:
                raise CommentError(f"spec.kwargs must be a JSON object of at most {MAX_KWARGS_CHARS} "
                                   f"characters, {MAX_KWARGS_DEPTH} levels, finite numbers")
            out["kwargs"] = kwargs
        return cls(**out)

    @classmethod
    def from_json_text(cls, text: Optional[str]) -> "Optional[CommentSpec]":
        """A recorded spec (``MAX_JSON_CHARS`` read); None when absent or invalid. Never raises."""
        if not text or len(text) > MAX_JSON_CHARS:
            return None
        try:
            return cls.from_fields(_loads(text))
        except (ValueError, RecursionError):
            return None

    def to_json(self) -> Dict[str, Any]:
        """The fields that are set, as JSON values (``input_shape`` a list)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
        if "input_shape" in out:
            out["input_shape"] = list(out["input_shape"])
        return out


def _numbers_and_text(data: Mapping[str, object], out: Dict[str, Any]) -> None:
    """Copy the integer (``BOUNDS``) and text (``STR_CHARS``) keys of ``data`` that are set into ``out``;
    CommentError: one of them of the wrong type or out of its range."""
    for key in ("v", "shards", "gpus", "mem_mib", "retry_of"):
        if data.get(key) is not None:
            out[key] = _bounded_int(key, data[key])
    for key in ("flops_per_step", "bytes_per_step"):
        if data.get(key) is not None:
            out[key] = _bounded_int(key, data[key], allow_float=True)
    for key in ("method", "gpu_model"):
        if data.get(key) is not None:
            out[key] = _text(key, data[key], STR_CHARS[key])


def _mode_sha256_place(data: Mapping[str, object], out: Dict[str, Any]) -> None:
    """Copy the set ``mode`` (of ``MODES``), ``sha256`` (64 lower-case hex) and ``place`` (bool) into ``out``;
    CommentError: one of them not as stated."""
    if data.get("mode") is not None:
        if data["mode"] not in MODES:
            raise CommentError(f"mode must be one of {', '.join(MODES)}")
        out["mode"] = data["mode"]
    if data.get("sha256") is not None:
        if not isinstance(data["sha256"], str) or not _SHA256.fullmatch(data["sha256"]):
            raise CommentError("sha256 must be 64 lower-case hex digits")
        out["sha256"] = data["sha256"]
    if data.get("place") is not None:
        if not isinstance(data["place"], bool):
            raise CommentError("place must be true or false")
        out["place"] = data["place"]
