"""The hook child's answer on its pipe to the parent (hooks/runner.py): one JSON object ``{"ok", "detail",
"result"}``, always valid and at most ``MAX_RESULT_BYTES``.

A ``detail`` over ``MAX_DETAIL_BYTES`` is cut to its small items plus a ``"truncated"`` marker, so the run's
record set still fits one queue entry. docs/reliability.md describes the faults this is tested against.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List

MAX_RESULT_BYTES = 1 << 20  # the child's whole answer on the pipe
# a run's detail as recorded (hook_runs.detail_json, events): small enough that the run's record set always
# fits one queue entry (store/queue.py MAX_ENTRY_BYTES, 256 KiB; the detail appears once per op)
MAX_DETAIL_BYTES = 64 * 1024
MAX_ITEM_BYTES = 1024  # a detail item kept whole when a detail is cut


def _cut_detail(detail: Dict[str, Any], size: int) -> Dict[str, Any]:
    """``detail`` (``size`` bytes as JSON) cut to fit ``MAX_DETAIL_BYTES``.

    Items of at most ``MAX_ITEM_BYTES`` as JSON kept, longer strings cut to their first ``MAX_ITEM_BYTES //
    2`` characters plus ``" ... [cut]"``, other large items dropped; ``"truncated": {"bytes", "limit",
    "cut"}`` names them. Only the marker is left when that is still too large.
    """
    kept: Dict[str, Any] = {}
    cut: List[str] = []
    for key, value in detail.items():
        if len(json.dumps(value, default=str)) <= MAX_ITEM_BYTES:
            kept[str(key)] = value
            continue
        if isinstance(value, str):
            kept[str(key)] = value[:MAX_ITEM_BYTES // 2] + " ... [cut]"
        cut.append(str(key)[:MAX_ITEM_BYTES])
    marker = {"bytes": size, "limit": MAX_DETAIL_BYTES, "cut": cut}
    out = {**kept, "truncated": marker}
    if len(json.dumps(out, default=str)) > MAX_DETAIL_BYTES:
        out = {"truncated": {**marker, "cut": "all"}}
    return out


def encode_result(payload: Dict[str, Any]) -> bytes:
    """The child's answer as UTF-8 JSON, at most ``MAX_RESULT_BYTES``; never raises.

    A ``detail`` over ``MAX_DETAIL_BYTES`` is cut (``_cut_detail``); an answer still too large (TaskProlog
    lines) becomes a failure naming its size, its lines dropped. Values JSON cannot encode are written as
    ``str``.
    """
    detail = payload.get("detail") or {}
    size = len(json.dumps(detail, default=str))
    if size > MAX_DETAIL_BYTES:
        payload = {**payload, "detail": _cut_detail(detail, size)}
    data = json.dumps(payload, default=str).encode()
    if len(data) > MAX_RESULT_BYTES:
        data = json.dumps({"ok": False, "detail": {"error": f"the hook's answer of {len(data)} bytes is over "
                                                            f"{MAX_RESULT_BYTES}: its result was dropped"},
                           "result": None}).encode()
    return data


def decode_answer(chunks: List[bytes]) -> tuple:
    """``(ok, detail, result)`` of the pipe's bytes; never raises.

    Missing or broken: ``(False, {"error": ...}, None)``.
    """
    try:
        payload = json.loads(b"".join(chunks).decode())
        return bool(payload["ok"]), dict(payload.get("detail") or {}), payload.get("result")
    except (ValueError, KeyError, TypeError, AttributeError):
        return False, {"error": "the hook's child ended without a result (crashed?)"}, None
