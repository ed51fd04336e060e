"""The coloc part of a Slurm job comment: ``[user text ]coloc:{json}``.

``coloc-sbatch`` writes it (``submit/plan.py``); the root-side hooks and the OOM rerun read it back
(``hooks/``). Both sides import this module so that the tag and the size bound live in one place. Pure:
only ``json``.

The JSON object is written by ``build_comment`` with sorted keys and no spaces. Keys written by
``coloc-sbatch``: ``v`` (1), ``mode``, ``shards``, ``gpus``, ``mem_mib``, ``method``, ``gpu_model``,
``sha256``, ``spec``, when the script has arguments, ``argv``, and, when the probe or the ``#COLOC model=`` trace
counted them, ``flops_per_step`` (int, FLOP of one training step; the placer's feature,
``placement/intensity.py``). Readers treat every key as untrusted user input: a user can submit any comment
with plain ``sbatch``.

slurmctld refuses a job whose whole comment is longer than ``MAX_COMMENT_CHARS``, so ``fit_comment`` drops the
bulky keys, in the order the caller gives, until user text + coloc JSON fit: every job plain sbatch accepts is
accepted.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

COMMENT_TAG = "coloc:"
MAX_JSON_CHARS = 16384  # parse_comment ignores a coloc JSON longer than this (bounded work in root hooks)
MAX_COMMENT_CHARS = 1024  # slurmctld 22.05 refuses a longer --comment ("120 arguments" in docs/reliability.md)

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


def job_signature(coloc: Optional[Mapping[str, Any]]) -> Optional[str]:
    """A 16-hex-digit key of what a job trains, from its parsed coloc comment; None when nothing identifies it.

    ``{"spec": {"model": "resnet50", "batch_size": 32, "precision": "amp", ...}}`` -> hash of (model, kwargs,
    input_shape, batch_size, precision, optimizer); without a spec, ``"sha:" + sha256`` of the script.
    Untrusted input: only JSON-typed values are read, never executed.
    """
    if not isinstance(coloc, Mapping):
        return None
    spec = coloc.get("spec")
    if isinstance(spec, Mapping) and isinstance(spec.get("model"), str):
        key = {k: spec.get(k) for k in ("model", "kwargs", "input_shape", "batch_size", "precision", "optimizer")}
        text = json.dumps(key, sort_keys=True, default=str)
    elif isinstance(coloc.get("sha256"), str) and coloc["sha256"]:
        text = "sha:" + coloc["sha256"]
    else:
        return None
    return hashlib.sha256(text.encode()).hexdigest()[:16]
