"""The coloc part of a Slurm job comment: ``[user text ]coloc:{json}``.

``coloc-sbatch`` writes it (``submit/plan.py``); the root-side hooks and the OOM rerun read it back
(``hooks/``). Both sides import this package so that the tag and the size bound live in one place. Pure:
only ``json``.

The JSON object is written by ``build_comment`` with sorted keys and no spaces. Keys written by
``coloc-sbatch``: ``v`` (1), ``mode``, ``shards``, ``gpus``, ``mem_mib``, ``method``, ``gpu_model``,
``sha256``, ``spec``, when the script has arguments, ``argv``, and, when the probe or the ``#COLOC model=``
trace counted them, ``flops_per_step`` (int, FLOP of one training step; the placer's feature,
``placement/intensity.py``); ``coloc-placer`` submissions add ``place`` (true), OOM reruns ``retry_of``.

Reading: a user can submit any comment with plain ``sbatch``, so every reader (hooks, placer, report, history)
goes through ``JobComment.read`` (or ``JobComment.from_fields`` for a recorded object), which checks every
known key's type and range (``comment/values.py``: ``BOUNDS``, ``STR_CHARS``, the spec's limits) and ignores
unknown keys. A comment with one bad known key is no annotation at all (``NO_COMMENT``, one log line): the
job is treated as unannotated, never half-trusted. ``parse_comment`` is the raw JSON reader for the submitting
side (the user's own text).

slurmctld refuses a job whose whole comment is longer than ``MAX_COMMENT_CHARS``, so ``fit_comment`` drops the
bulky keys, in the order the caller gives, until user text + coloc JSON fit: every job plain sbatch accepts is
accepted.
"""
from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, fields
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from slurm_coloc.comment.values import (
    MAX_ARG_CHARS,
    MAX_ARGS,
    MAX_JSON_CHARS,
    CommentError,
    CommentSpec,
    _loads,
    _mode_sha256_place,
    _numbers_and_text,
    _text,
)

COMMENT_TAG = "coloc:"
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
