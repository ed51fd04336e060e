"""The coloc part of a Slurm job comment: ``[user text ]coloc:{json}``.

``coloc-sbatch`` writes it (``submit/plan.py``); the root-side hooks and the OOM rerun read it back
(``hooks/``). Both sides import this module so that the tag and the size bound live in one place. Pure:
only ``json``.

The JSON object is written by ``build_comment`` with sorted keys and no spaces. Keys written by
``coloc-sbatch``: ``v`` (1), ``mode``, ``shards``, ``gpus``, ``mem_mib``, ``method``, ``gpu_model``,
``sha256``, ``spec`` and, when the script has arguments, ``argv``. Readers treat every key as untrusted
user input: a user can submit any comment with plain ``sbatch``.
"""
from __future__ import annotations

import json
from typing import Any, Dict, Mapping, Optional

COMMENT_TAG = "coloc:"
MAX_JSON_CHARS = 16384  # parse_comment ignores a coloc JSON longer than this (bounded work in root hooks)


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
