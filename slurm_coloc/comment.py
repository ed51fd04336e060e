"""The coloc part of a Slurm job comment: ``[user text ]coloc:{json}``.

``coloc-sbatch`` writes it (``submit/plan.py``); the root-side hooks and the OOM rerun read it back
(``hooks/``). Both sides import this module so that the tag and the size bound live in one place. Pure:
only ``json``.

The JSON object is written by ``build_comment`` with sorted keys and no spaces. Keys written by
``coloc-sbatch``: ``v`` (1), ``mode``, ``shards``, ``gpus``, ``mem_mib``, ``method``, ``gpu_model``,
``sha256``, ``spec``, when the script has arguments, ``argv``, and, when the probe or the ``#COLOC model=``
trace counted them, ``flops_per_step`` (int, FLOP of one training step; the placer's feature,
``placement/intensity.py``); ``coloc-placer`` submissions add ``place`` (true), OOM reruns ``retry_of``.

Reading: a user can submit any comment with plain ``sbatch``, so every reader (hooks, placer, report, history)
goes through ``JobComment.read`` (or ``JobComment.from_fields`` for a recorded object), which checks every
known key's type and range (``BOUNDS``, ``STR_CHARS``, the spec's limits) and ignores unknown keys. A comment
with one bad known key is no annotation at all (``NO_COMMENT``, one log line): the job is treated as
unannotated, never half-trusted. ``parse_comment`` is the raw JSON reader for the submitting side (the user's
own text).

slurmctld refuses a job whose whole comment is longer than ``MAX_COMMENT_CHARS``, so ``fit_comment`` drops the
bulky keys, in the order the caller gives, until user text + coloc JSON fit: every job plain sbatch accepts is
accepted.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from dataclasses import dataclass, fields
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

COMMENT_TAG = "coloc:"
MAX_JSON_CHARS = 16384  # parse_comment ignores a coloc JSON longer than this (bounded work in root hooks)
# slurmctld 22.05 refuses a longer --comment ("120 arguments" in docs/reliability.md)
MAX_COMMENT_CHARS = 1024
log = logging.getLogger("slurm_coloc.comment")

Shrink = Tuple[str, Callable[[Dict[str, Any]], Dict[str, Any]]]
"""``(what is dropped, in words; data -> smaller data)``: one step of ``fit_comment``."""


def build_comment(data: Mapping[str, Any], user_comment: Optional[str] = None) -> str:
    """The job comment carrying ``data``: ``"<user_comment> coloc:{...}"``, or ``"coloc:{...}"`` alone.

    Args:
        data: JSON-serialisable mapping (the coloc fields).
        user_comment: the user's own ``--comment`` text, kept in front; None or empty for none.

    Raises:
        TypeError: ``data`` holds a value JSON cannot encode.
    """
    text = COMMENT_TAG + json.dumps(dict(data), separators=(",", ":"), sort_keys=True)
    return f"{user_comment} {text}" if user_comment else text


def parse_comment(comment: Optional[str]) -> Optional[Dict[str, Any]]:
    """The coloc JSON object in a job comment (after the last ``coloc:{``), or None. Never raises.

    Hooks run this as root on user-controlled text: JSON only (no eval, no pickle), at most
    ``MAX_JSON_CHARS`` characters, and a JSON object only (a list or a scalar gives None).

    Args:
        comment: the job's comment (Slurm's ``Comment``, user-controlled text); None counts as empty.

    Returns:
        The object as a dict, or None.
    """
    text = comment or ""
    at = text.rfind(COMMENT_TAG + "{")
    if at < 0 or len(text) - at > MAX_JSON_CHARS:
        return None
    try:
        data = json.loads(text[at + len(COMMENT_TAG):])
    except (json.JSONDecodeError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def fit_comment(data: Mapping[str, Any], user_comment: Optional[str], steps: Sequence[Shrink],
                limit: int = MAX_COMMENT_CHARS) -> Tuple[Optional[str], List[str]]:
    """The job comment for ``data`` within ``limit`` characters, shrinking ``data`` step by step.

    Args:
        data: the full coloc fields.
        user_comment: the user's own comment text (kept whole: it is theirs).
        steps: shrink steps applied in order, each to the result of the previous, until the comment fits.
        limit: the most characters Slurm takes.

    Returns:
        (the comment, or the user's comment alone when even the smallest coloc JSON does not fit beside it
        (None without one); the words of the steps applied, plus ``"the whole coloc JSON"`` in that case).
    """
    current: Dict[str, Any] = dict(data)
    dropped: List[str] = []
    text = build_comment(current, user_comment)
    for what, shrink in steps:
        if len(text) <= limit:
            break
        current = shrink(current)
        dropped.append(what)
        text = build_comment(current, user_comment)
    if len(text) <= limit:
        return text, dropped
    return (user_comment or None), dropped + ["the whole coloc JSON"]


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


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _bounded_int(key: str, v: Any, allow_float: bool = False) -> int:
    lo, hi = BOUNDS[key]
    if allow_float and isinstance(v, float) and math.isfinite(v) and v == int(v):
        v = int(v)
    if not _is_int(v) or not lo <= v <= hi:
        raise CommentError(f"{key} must be an integer in {lo}..{hi}")
    return int(v)


def _text(key: str, v: Any, limit: int) -> str:
    if not isinstance(v, str) or len(v) > limit or "\x00" in v:
        raise CommentError(f"{key} must be a string of at most {limit} characters")
    return v


def _plain(v: Any, depth: int = 0) -> bool:
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
    """The model spec of a coloc comment (``estimate.spec.ModelSpec.to_json``), each field checked; None:
    absent."""

    model: Optional[str] = None
    kwargs: Optional[Dict[str, Any]] = None
    input_shape: Optional[Tuple[int, ...]] = None
    input_dtype: Optional[str] = None
    batch_size: Optional[int] = None
    optimizer: Optional[str] = None
    precision: Optional[str] = None
    kwargs_chars: Optional[int] = None

    @classmethod
    def from_fields(cls, data: Any) -> "CommentSpec":
        """The typed spec of a comment's ``spec`` object (unknown keys ignored, a null key absent).

        Args:
            data: the parsed ``spec`` value (JSON types).

        Returns:
            The ``CommentSpec``.

        Raises:
            CommentError: not an object, or a known key out of type or range.
        """
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
        """A recorded spec (JSON text) read back; None when absent or invalid. Never raises.

        Args:
            text: the spec's JSON text (at most ``MAX_JSON_CHARS`` characters are read), or None.
        """
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


def _numbers_and_text(data: Dict[str, Any], out: Dict[str, Any]) -> None:
    """Copy the integer (``BOUNDS``) and text (``STR_CHARS``) keys of ``data`` that are set into ``out``.

    Raises:
        CommentError: one of them of the wrong type or out of its range.
    """
    for key in ("v", "shards", "gpus", "mem_mib", "retry_of"):
        if data.get(key) is not None:
            out[key] = _bounded_int(key, data[key])
    for key in ("flops_per_step", "bytes_per_step"):
        if data.get(key) is not None:
            out[key] = _bounded_int(key, data[key], allow_float=True)
    for key in ("method", "gpu_model"):
        if data.get(key) is not None:
            out[key] = _text(key, data[key], STR_CHARS[key])


def _mode_sha256_place(data: Dict[str, Any], out: Dict[str, Any]) -> None:
    """Copy ``mode`` (one of ``MODES``), ``sha256`` (64 lower-case hex digits) and ``place`` (a boolean) of
    ``data``, when set, into ``out``.

    Raises:
        CommentError: one of them not as stated.
    """
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


@dataclass(frozen=True)
class JobComment:
    """The coloc annotation of one job, validated: every field None (or False) when absent.

    ``NO_COMMENT`` (``annotated`` False) stands for a job without a usable annotation: no coloc JSON, or one
    whose known keys break the protocol. Field meanings: module docstring; units in names (``mem_mib``: MiB;
    ``flops_per_step``: FLOP; ``bytes_per_step``: bytes; ``shards``: GiB of one GPU).
    """

    v: Optional[int] = None
    mode: Optional[str] = None
    shards: Optional[int] = None
    gpus: Optional[int] = None
    mem_mib: Optional[int] = None
    method: Optional[str] = None
    gpu_model: Optional[str] = None
    sha256: Optional[str] = None
    spec: Optional[CommentSpec] = None
    argv: Optional[Tuple[str, ...]] = None
    flops_per_step: Optional[int] = None
    bytes_per_step: Optional[int] = None
    place: bool = False
    retry_of: Optional[int] = None
    annotated: bool = False

    @classmethod
    def from_fields(cls, data: Any) -> "JobComment":
        """The typed annotation of a coloc JSON object (a parsed comment or a recorded ``coloc_json``).
        Unknown keys are ignored; a key set to null counts as absent.

        Args:
            data: the parsed JSON value (``mem_mib`` in MiB, ``shards`` in GiB of one GPU, ``flops_per_step``
                in FLOP, ``bytes_per_step`` in bytes).

        Returns:
            The ``JobComment``, ``annotated`` True.

        Raises:
            CommentError: not an object, or a known key of the wrong type or out of its range (``BOUNDS``,
                ``STR_CHARS``, ``MODES``, a 64-hex-digit ``sha256``, ``argv`` within ``MAX_ARGS`` x
                ``MAX_ARG_CHARS``, a boolean ``place``).
        """
        if not isinstance(data, dict):
            raise CommentError("the coloc JSON must be an object")
        out: Dict[str, Any] = {"annotated": True}
        _numbers_and_text(data, out)
        _mode_sha256_place(data, out)
        if data.get("spec") is not None:
            out["spec"] = CommentSpec.from_fields(data["spec"])
        argv = data.get("argv")
        if argv is not None:
            if not isinstance(argv, list) or len(argv) > MAX_ARGS:
                raise CommentError(f"argv must be a list of at most {MAX_ARGS} strings")
            out["argv"] = tuple(_text("argv[]", a, MAX_ARG_CHARS) for a in argv)
        return cls(**out)

    @classmethod
    def read(cls, comment: Optional[str], job_id: Optional[int] = None) -> "JobComment":
        """The annotation in a job comment (the last ``coloc:{...}``); ``NO_COMMENT`` when there is none or it
        breaks the protocol, the latter with one warning naming the job and the key. Never raises; bounded
        work (``MAX_JSON_CHARS``; integers of more than 19 digits, NaN and infinities are never read as
        numbers).

        Args:
            comment: the job's comment (Slurm's ``Comment``, user-controlled text); None counts as empty.
            job_id: the job the comment belongs to, named in the warning (``?`` if None).

        Returns:
            The ``JobComment``, or ``NO_COMMENT``.
        """
        text = comment or ""
        at = text.rfind(COMMENT_TAG + "{")
        if at < 0:
            return NO_COMMENT
        try:
            if len(text) - at > MAX_JSON_CHARS:
                raise CommentError(f"coloc JSON longer than {MAX_JSON_CHARS} characters")
            try:
                data = _loads(text[at + len(COMMENT_TAG):])
            except (ValueError, RecursionError):
                raise CommentError("not one JSON object") from None
            return cls.from_fields(data)
        except CommentError as exc:
            _warn_once(job_id, text, str(exc))
            return NO_COMMENT

    @classmethod
    def from_json_text(cls, text: Optional[str]) -> "JobComment":
        """A recorded ``coloc_json`` (database text) read back; ``NO_COMMENT`` when absent or invalid. Never
        raises.

        Args:
            text: the recorded JSON text (at most ``MAX_JSON_CHARS`` characters are read), or None.
        """
        if not text or len(text) > MAX_JSON_CHARS:
            return NO_COMMENT
        try:
            return cls.from_fields(_loads(text))
        except (ValueError, RecursionError):  # CommentError is a ValueError
            return NO_COMMENT

    @property
    def placed_shards(self) -> Optional[int]:
        """The shard count of a job submitted for coloc-placer (``place`` true and ``shards`` set), else
        None."""
        return self.shards if self.place and self.shards else None

    def to_json(self) -> Dict[str, Any]:
        """The set fields as the coloc JSON object (``spec`` and ``argv`` as JSON values); {} when
        unannotated."""
        out: Dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "annotated" or value is None or (f.name == "place" and not value):
                continue
            out[f.name] = value.to_json() if isinstance(value, CommentSpec) else \
                list(value) if isinstance(value, tuple) else value
        return out

    def signature(self) -> Optional[str]:
        """A 16-hex-digit key of what the job trains; None when nothing identifies it (``job_signature``)."""
        spec = self.spec.to_json() if self.spec is not None else {}
        if isinstance(spec.get("model"), str):
            key = ({k: spec.get(k)
                    for k in ("model", "kwargs", "input_shape", "batch_size", "precision", "optimizer")})
            text = json.dumps(key, sort_keys=True, default=str)
        elif self.sha256:
            text = "sha:" + self.sha256
        else:
            return None
        return hashlib.sha256(text.encode()).hexdigest()[:16]


NO_COMMENT = JobComment()
"""The unannotated job."""
_WARNED: Dict[Tuple[Optional[int], str], None] = {}


def _warn_once(job_id: Optional[int], text: str, why: str) -> None:
    """One warning per (job, comment) (the placer reads every held job each round); the memory is bounded."""
    key = (job_id, hashlib.sha256(text.encode("utf-8", "replace")).hexdigest())
    if key in _WARNED:
        return
    if len(_WARNED) >= 4096:
        _WARNED.clear()
    _WARNED[key] = None
    log.warning("job %s: coloc comment ignored (%s): treated as an unannotated job",
                job_id if job_id is not None else "?", why)


def job_signature(coloc: Any) -> Optional[str]:
    """A 16-hex-digit key of what a job trains, from its coloc JSON object; None when nothing identifies it or
    the object breaks the protocol (``JobComment.from_fields``).

    ``{"spec": {"model": "resnet50", "batch_size": 32, "precision": "amp", ...}}`` -> hash of (model, kwargs,
    input_shape, batch_size, precision, optimizer); without a spec, ``"sha:" + sha256`` of the script.

    Args:
        coloc: a ``JobComment``, or a coloc JSON object (a mapping, e.g. ``parse_comment``'s result).

    Returns:
        The 16-hex-digit key, or None.

    Raises:
        Never raises ``CommentError`` (a broken object gives None).
    """

    if isinstance(coloc, JobComment):
        return coloc.signature()
    try:
        return JobComment.from_fields(dict(coloc) if isinstance(coloc, Mapping) else coloc).signature()
    except CommentError:
        return None
