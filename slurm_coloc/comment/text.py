"""The text of a job comment: ``[prefix ]coloc:{json}``, its tags, and the shrinking that keeps it within
Slurm's limit. Only ``JobComment`` renders comments, through ``build_comment`` and ``fit_comment``. Pure; the
JSON has sorted keys and no spaces, so a comment's bytes depend on its values only."""
from __future__ import annotations

import json
import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from slurm_coloc.comment.values import MAX_JSON_CHARS

COMMENT_TAG = "coloc:"
RETRY_TAG = "oom-retry-of-"
"""The prefix of an OOM rerun's comment: ``oom-retry-of-<original job id> coloc:{...}``."""
_RETRY_RE = re.compile(r"(?:^|\s)" + RETRY_TAG + r"(\d+)(?:\s|$)")
#: The placer's note in front of a held job's comment: ``coloc-wait:<reason>|<comment>``.
WAIT_TAG = "coloc-wait:"
COMMENT_OPTION = "--comment="
# slurmctld 22.05 refuses a longer --comment ("120 arguments" in docs/reliability.md)
MAX_COMMENT_CHARS = 1024

Shrink = Tuple[str, Callable[[Dict[str, Any]], Dict[str, Any]]]
"""``(what is dropped, in words; coloc JSON object -> smaller object)``: one step of ``fit_comment``."""


def build_comment(data: Mapping[str, object], user_comment: Optional[str] = None) -> str:
    """``"<user_comment> coloc:{...}"`` (no user comment: ``"coloc:{...}"``); TypeError: ``data`` holds a
    value JSON cannot encode."""
    text = COMMENT_TAG + json.dumps(dict(data), separators=(",", ":"), sort_keys=True)
    return f"{user_comment} {text}" if user_comment else text


def parse_comment(comment: Optional[str]) -> Optional[Dict[str, Any]]:
    """The coloc JSON object in a job comment (after the last ``coloc:{``), or None; never raises. Trust: root
    hooks run this on user text: JSON only, at most ``MAX_JSON_CHARS`` characters, an object only."""
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
    """The text in front of the last ``coloc:{``, stripped; None when empty or without coloc JSON."""
    at = comment.rfind(COMMENT_TAG + "{")
    return (comment[:at].strip() or None) if at >= 0 else None


def retry_tag_of(comment: Optional[str]) -> Optional[int]:
    """The job id of an ``oom-retry-of-<id>`` word (whole, anywhere; user text: a claim only), or None."""
    m = _RETRY_RE.search(comment or "")
    return int(m.group(1)) if m else None


def fit_comment(data: Mapping[str, object], user_comment: Optional[str], steps: Sequence[Shrink],
                limit: int = MAX_COMMENT_CHARS) -> Tuple[Optional[str], List[str]]:
    """``(comment, words of the steps applied)``: the comment for ``data`` within ``limit`` characters.
    ``steps`` shrink ``data`` in order, each on the previous result, until it fits; ``user_comment`` is kept
    whole (it is the user's). When even the smallest coloc JSON does not fit beside it: the user's comment
    alone (None without one), and ``"the whole coloc JSON"`` among the words."""
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
    """A shrink step that leaves ``keys`` out of the coloc JSON object."""
    return lambda data: {k: v for k, v in data.items() if k not in keys}


def without_kwargs(data: Dict[str, Any]) -> Dict[str, Any]:
    """A shrink step: the spec's ``kwargs`` emptied, their JSON length kept as ``kwargs_chars``."""
    spec = data.get("spec")
    if not isinstance(spec, dict) or not spec.get("kwargs"):
        return data
    return {**data, "spec": {**spec, "kwargs": {}, "kwargs_chars": len(json.dumps(spec["kwargs"]))}}


def strip_wait(comment: str) -> str:
    """The comment without the placer's ``coloc-wait:<reason>|`` prefix."""
    if comment.startswith(WAIT_TAG) and "|" in comment:
        return comment.split("|", 1)[1]
    return comment


def wait_comment(reason: str, comment: str) -> str:
    """``coloc-wait:<reason>|<comment>``, the coloc JSON kept last; ``reason`` without ``|``, <= 200 chars."""
    return f"{WAIT_TAG}{reason.replace('|', '/')[:200]}|{strip_wait(comment)}"
