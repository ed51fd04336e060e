"""The text of a job comment: ``[prefix ]coloc:{json}``, its tags, and the shrinking that keeps it within
Slurm's limit. ``JobComment`` (``slurm_coloc.comment``) renders every comment the package writes through
``build_comment`` and ``fit_comment``; nothing outside ``comment/`` assembles comment text. Pure: only
``json``.

The JSON object is written with sorted keys and no spaces (``separators=(",", ":")``), so a comment's bytes
depend on its values only.
"""
from __future__ import annotations

import json
import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from slurm_coloc.comment.values import MAX_JSON_CHARS

COMMENT_TAG = "coloc:"
RETRY_TAG = "oom-retry-of-"
"""The prefix of an OOM rerun's comment: ``oom-retry-of-<original job id> coloc:{...}``."""
_RETRY_RE = re.compile(r"(?:^|\s)" + RETRY_TAG + r"(\d+)(?:\s|$)")
COMMENT_OPTION = "--comment="
# slurmctld 22.05 refuses a longer --comment ("120 arguments" in docs/reliability.md)
MAX_COMMENT_CHARS = 1024

Shrink = Tuple[str, Callable[[Dict[str, Any]], Dict[str, Any]]]
"""``(what is dropped, in words; coloc JSON object -> smaller object)``: one step of ``fit_comment``."""


def build_comment(data: Mapping[str, Any], user_comment: Optional[str] = None) -> str:
    """The job comment carrying ``data``: ``"<user_comment> coloc:{...}"``, or ``"coloc:{...}"`` alone.

    Args:
        data: JSON-serialisable mapping (the coloc fields).
        user_comment: the text kept in front (the user's own ``--comment``, or an OOM rerun's tag); None or
            empty for none.

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


def user_text_of(comment: str) -> Optional[str]:
    """The text in front of the last ``coloc:{`` of ``comment``, stripped; None when empty or when there is
    no coloc JSON. Pure, never raises."""
    at = comment.rfind(COMMENT_TAG + "{")
    return (comment[:at].strip() or None) if at >= 0 else None


def retry_tag_of(comment: Optional[str]) -> Optional[int]:
    """The job id in a comment's ``oom-retry-of-<id>`` word (a whole word, anywhere), or None.

    Args:
        comment: a job comment (user-controlled text: a claim only); None counts as empty.

    Returns:
        The job id, or None. Pure, never raises.
    """
    m = _RETRY_RE.search(comment or "")
    return int(m.group(1)) if m else None


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


def without(*keys: str) -> Callable[[Dict[str, Any]], Dict[str, Any]]:
    """A shrink step (``Shrink``'s function) that leaves ``keys`` out of the coloc JSON object."""
    return lambda data: {k: v for k, v in data.items() if k not in keys}


def without_kwargs(data: Dict[str, Any]) -> Dict[str, Any]:
    """A shrink step: the spec's ``kwargs`` emptied, their JSON length kept as ``kwargs_chars`` (the object
    as it is when the spec has no kwargs)."""
    spec = data.get("spec")
    if not isinstance(spec, dict) or not spec.get("kwargs"):
        return data
    return {**data, "spec": {**spec, "kwargs": {}, "kwargs_chars": len(json.dumps(spec["kwargs"]))}}
