"""The text of a job comment: ``[prefix ]coloc:{json}``, its tags, and the shrinking that keeps it within
Slurm's limit. Only ``JobComment`` (``slurm_coloc.comment``) renders comments, through ``build_comment`` and
``fit_comment``; nothing outside ``comment/`` assembles comment text. Pure: only ``json``.

The JSON object is written with sorted keys and no spaces, so a comment's bytes depend on its values only.
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
    """``"<user_comment> coloc:{...}"`` carrying ``data``; without ``user_comment``: ``"coloc:{...}"``.

    Raises:
        TypeError: ``data`` holds a value JSON cannot encode.
    """
    text = COMMENT_TAG + json.dumps(dict(data), separators=(",", ":"), sort_keys=True)
    return f"{user_comment} {text}" if user_comment else text


def parse_comment(comment: Optional[str]) -> Optional[Dict[str, Any]]:
    """The coloc JSON object in a job comment (after the last ``coloc:{``), or None. Never raises.

    Trust: hooks run this as root on user-controlled text: JSON only (no eval, no pickle), at most
    ``MAX_JSON_CHARS`` characters, and a JSON object only (a list or a scalar gives None).
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
    """The text in front of the last ``coloc:{``, stripped; None when empty or without coloc JSON.

    Pure, never raises.
    """
    at = comment.rfind(COMMENT_TAG + "{")
    return (comment[:at].strip() or None) if at >= 0 else None


def retry_tag_of(comment: Optional[str]) -> Optional[int]:
    """The job id of an ``oom-retry-of-<id>`` word (whole, anywhere; user text: a claim only), or None.

    Pure, never raises.
    """
    m = _RETRY_RE.search(comment or "")
    return int(m.group(1)) if m else None


def fit_comment(data: Mapping[str, Any], user_comment: Optional[str], steps: Sequence[Shrink],
                limit: int = MAX_COMMENT_CHARS) -> Tuple[Optional[str], List[str]]:
    """``(comment, words of the steps applied)``: the comment for ``data`` within ``limit`` characters.

    ``steps`` shrink ``data`` in order, each on the previous result, until it fits; ``user_comment`` is kept
    whole (it is the user's). When even the smallest coloc JSON does not fit beside it: the user's comment
    alone (None without one), and ``"the whole coloc JSON"`` among the words.
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
    """A shrink step: the spec's ``kwargs`` emptied, their JSON length kept as ``kwargs_chars``."""
    spec = data.get("spec")
    if not isinstance(spec, dict) or not spec.get("kwargs"):
        return data
    return {**data, "spec": {**spec, "kwargs": {}, "kwargs_chars": len(json.dumps(spec["kwargs"]))}}
