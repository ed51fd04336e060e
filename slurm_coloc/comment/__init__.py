"""The coloc part of a Slurm job comment: ``[prefix ]coloc:{json}``, written and read by ``JobComment`` only.

Writing: ``JobComment`` is the one writer of a job comment: ``JobComment.submission`` (coloc-sbatch,
``submit/plan.py``), ``with_place`` (coloc-placer, ``placement/heartbeat.py``), ``JobComment.oom_rerun``
(``hooks/rerun.py``); each renders itself with ``to_comment``, ``comment_arg`` (``--comment=...``) or
``fitted_arg`` (within Slurm's limit), through ``comment/text.py``. Keys written by ``coloc-sbatch``: ``v``
(1), ``mode``, ``shards``, ``gpus``, ``mem_mib``, ``method``, ``gpu_model``, ``sha256``, ``spec`` (always,
null when unknown: ``SUBMISSION_KEYS``), ``argv`` when the script has arguments, and ``flops_per_step``
(int, FLOP of one training step; the placer's feature, ``placement/intensity.py``) when the probe or the
``#COLOC model=`` trace counted them; coloc-placer adds ``place`` (true), OOM reruns ``retry_of``.

Reading: a user can submit any comment with plain ``sbatch``, so every reader (hooks, placer, report,
history) goes through ``JobComment.read`` (or ``JobComment.from_fields`` for a recorded object), which checks
every known key's type and range (``comment/values.py``: ``BOUNDS``, ``STR_CHARS``, the spec's limits) and
ignores unknown keys; a null key is absent. A comment with one bad known key is no annotation at all
(``NO_COMMENT``, one log line): the job is treated as unannotated, never half-trusted. ``parse_comment`` is
the raw JSON reader for the submitting side (the user's own text).

slurmctld refuses a job whose whole comment is longer than ``MAX_COMMENT_CHARS``, so ``fitted_arg`` drops the
bulky keys in the caller's order (``without``, ``without_kwargs``) until prefix + coloc JSON fit: every job
plain sbatch accepts is accepted.
"""
from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field, fields, replace
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from slurm_coloc.comment.text import (
    COMMENT_OPTION,
    COMMENT_TAG,
    MAX_COMMENT_CHARS,
    RETRY_TAG,
    Shrink,
    build_comment,
    fit_comment,
    parse_comment,
    retry_tag_of,
    user_text_of,
    without,
    without_kwargs,
)
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

__all__ = ["COMMENT_OPTION", "COMMENT_TAG", "MAX_COMMENT_CHARS", "NO_COMMENT", "RETRY_TAG",
           "SUBMISSION_KEYS", "CommentError", "CommentSpec", "JobComment", "Shrink", "build_comment",
           "fit_comment", "job_signature", "parse_comment", "retry_tag_of", "without", "without_kwargs"]
log = logging.getLogger("slurm_coloc.comment")
SUBMISSION_KEYS = ("v", "mode", "shards", "gpus", "mem_mib", "method", "gpu_model", "sha256", "spec")
"""The keys coloc-sbatch always writes, null when unset (readers take null as absent)."""
_NOT_JSON = ("annotated", "user_text", "nulls")


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
    user_text: Optional[str] = field(default=None, compare=False)
    """The text in front of the coloc JSON (the user's own comment, or an OOM rerun's
    ``oom-retry-of-<id>``); None for none. Kept by ``read``, written in front by ``to_comment``; not part of
    the annotation (equality ignores it)."""
    nulls: Tuple[str, ...] = field(default=(), compare=False, repr=False)
    """Keys written as JSON null while unset (``SUBMISSION_KEYS`` for coloc-sbatch's comment); never read."""

    @classmethod
    def from_fields(cls, data: Any) -> "JobComment":
        """The typed annotation (``annotated`` True) of a coloc JSON object (parsed, or recorded).

        Unknown keys are ignored; a key set to null counts as absent.

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
        """The annotation in a job comment (the last ``coloc:{...}``), or ``NO_COMMENT``; never raises.

        ``comment``: Slurm's ``Comment``, user-controlled text (None: empty). A comment that breaks the
        protocol gives one warning naming the job (``?`` if None) and the key. Bounded work
        (``MAX_JSON_CHARS``; integers of more than 19 digits, NaN and infinities are never read as numbers).
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
            return replace(cls.from_fields(data), user_text=user_text_of(text))
        except CommentError as exc:
            _warn_once(job_id, text, str(exc))
            return NO_COMMENT

    @classmethod
    def from_json_text(cls, text: Optional[str]) -> "JobComment":
        """A recorded ``coloc_json`` (``MAX_JSON_CHARS`` read); absent or invalid: ``NO_COMMENT``."""
        if not text or len(text) > MAX_JSON_CHARS:
            return NO_COMMENT
        try:
            return cls.from_fields(_loads(text))
        except (ValueError, RecursionError):  # CommentError is a ValueError
            return NO_COMMENT

    @classmethod
    def submission(cls, *, mode: str, shards: Optional[int], gpus: Optional[int] = None,
                   mem_mib: Optional[int] = None, method: Optional[str] = None,
                   gpu_model: Optional[str] = None, sha256: Optional[str] = None,
                   spec: Optional[CommentSpec] = None, flops_per_step: Optional[int] = None,
                   argv: Sequence[str] = (),
                   user_text: Optional[str] = None) -> "JobComment":
        """coloc-sbatch's comment (``v`` 1) after ``user_text``; ``SUBMISSION_KEYS`` null while unset.

        ``argv`` only when there are arguments. Values are written as given (one outside the protocol makes
        every reader ignore the comment, as for any user's comment).
        """
        return cls(v=1, mode=mode, shards=shards, gpus=gpus, mem_mib=mem_mib, method=method,
                   gpu_model=gpu_model, sha256=sha256, spec=spec, flops_per_step=flops_per_step,
                   argv=tuple(argv) if argv else None, annotated=True, user_text=user_text or None,
                   nulls=SUBMISSION_KEYS)

    @classmethod
    def oom_rerun(cls, job_id: int, shards: int, mem_mib: int) -> "JobComment":
        """The comment of job ``job_id``'s OOM rerun on a whole GPU (``shards`` shards, ``mem_mib`` MiB).

        ``oom-retry-of-<job_id> coloc:{"mode":"whole-gpu",...,"retry_of":<job_id>}``.
        """
        return cls(v=1, mode="whole-gpu", shards=shards, mem_mib=mem_mib, method="oom-retry", retry_of=job_id,
                   annotated=True, user_text=f"{RETRY_TAG}{job_id}")

    def with_place(self) -> "JobComment":
        """This comment with ``place`` true: a submission for coloc-placer to steer."""
        return replace(self, place=True)

    @property
    def placed_shards(self) -> Optional[int]:
        """The shard count of a job submitted for coloc-placer (``place`` true, ``shards`` set), else None."""
        return self.shards if self.place and self.shards else None

    def to_json(self) -> Dict[str, Any]:
        """The set fields as the coloc JSON object (``spec``, ``argv`` as JSON); {} when unannotated."""
        out: Dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _NOT_JSON or value is None or (f.name == "place" and not value):
                continue
            out[f.name] = value.to_json() if isinstance(value, CommentSpec) else \
                list(value) if isinstance(value, tuple) else value
        return out

    def comment_json(self) -> Dict[str, Any]:
        """The coloc JSON object as written: ``to_json`` and the unset keys of ``nulls`` as None."""
        return {**dict.fromkeys(self.nulls), **self.to_json()}

    def to_comment(self) -> str:
        """``"<user_text> coloc:{...}"``, the whole comment (``JobComment.read`` gives this one back)."""
        return build_comment(self.comment_json(), self.user_text)

    def comment_arg(self) -> str:
        """The sbatch argument that sets the job comment: ``--comment=`` + ``to_comment()``."""
        return COMMENT_OPTION + self.to_comment()

    def fitted_arg(self, steps: Sequence[Shrink],
                   limit: int = MAX_COMMENT_CHARS) -> Tuple[Optional[str], List[str]]:
        """``(comment_arg within limit, or None: nothing left; what was dropped, in words)``.

        ``fit_comment``: ``steps`` shrink the JSON in order; ``user_text`` is kept whole.
        """
        text, dropped = fit_comment(self.comment_json(), self.user_text, steps, limit)
        return (None if text is None else COMMENT_OPTION + text), dropped

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
    """A 16-hex-digit key of what a job trains, from a ``JobComment`` or a coloc JSON mapping.

    Hash of the spec's (model, kwargs, input_shape, batch_size, precision, optimizer); without a spec,
    ``"sha:" + sha256`` of the script. None when nothing identifies it or the object breaks the protocol;
    never raises ``CommentError``.
    """

    if isinstance(coloc, JobComment):
        return coloc.signature()
    try:
        return JobComment.from_fields(dict(coloc) if isinstance(coloc, Mapping) else coloc).signature()
    except CommentError:
        return None
