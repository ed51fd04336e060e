"""One config key's value: converted to the key's type (``_coerce_field``: from YAML or ``COLOC_*`` text) and
checked against what the key declares (``_check_key``; ``allowed`` says it in words).

The declarations are ``slurm_coloc.config.sections._key``'s; the whole config is checked by
``slurm_coloc.config._validate``.
"""
from __future__ import annotations

import math
import re
from dataclasses import Field
from typing import Any, Dict, List, Mapping

from slurm_coloc.errors import ConfigError

# C0 controls (newline, carriage return and tab included), DEL and C1 controls, and the Unicode line
# separators and bidi format characters that reorder what a reader sees: no key's text may hold one. A path
# key with a newline added a line to plugstack.conf (fifth campaign, F9); in a log line or a generated file
# any of them can pose as another line or field.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff]")


def _coerce(name: str, kind: type, value: Any) -> Any:
    """Convert ``value`` to the field's type or raise ConfigError naming ``name``."""
    try:
        if kind is bool:
            if isinstance(value, str):
                return value.strip().lower() in ("1", "true", "yes", "on")
            return bool(value)
        if kind is int and isinstance(value, float) and not value.is_integer():
            raise ValueError("not an integer")
        if isinstance(value, (dict, list)):
            raise ValueError("expected a scalar")
        return kind(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"config key {name!r}: bad value {value!r} ({exc})") from None


def _mapping(name: str, value: Any) -> Dict[str, str]:
    """A ``name -> str`` mapping from a YAML mapping or a ``key=value,key=value`` string.

    Raises:
        ConfigError: another type, an empty key or value, or a string item without ``=``.
    """
    items: List[Any]
    if isinstance(value, str):
        items = [item.split("=", 1) for item in value.split(",") if item.strip()]
        if any(len(item) != 2 for item in items):
            raise ConfigError(f"config key {name!r}: bad value {value!r} (expected key=value,key=value)")
    elif isinstance(value, dict):
        items = list(value.items())
    else:
        raise ConfigError(f"config key {name!r}: bad value {value!r} (expected a mapping)")
    out: Dict[str, str] = {}
    for key, val in items:
        if isinstance(key, (dict, list)) or isinstance(val, (dict, list)) or key is None or val is None:
            raise ConfigError(f"config key {name!r}: bad entry {key!r}: {val!r} (expected text: text)")
        key, val = str(key).strip(), str(val).strip()
        if not key or not val:
            raise ConfigError(f"config key {name!r}: empty name in {key!r}: {val!r}")
        out[key] = val
    return out


def _coerce_field(f: Field[Any], value: Any) -> Any:
    """Convert ``value`` to the type of config field ``f`` or raise ConfigError naming it."""
    if str(f.type).startswith("Dict["):
        return _mapping(f.name, value)
    kinds = {"str": str, "int": int, "float": float, "bool": bool}
    return _coerce(f.name, kinds[str(f.type)], value)


def _interval(meta: Mapping[str, Any]) -> str:
    """A key's declared bounds in words: ``[0.1, inf)``, ``(0, 3600]``."""
    if meta["gt"] is not None:
        lo = f"({meta['gt']:g}"
    else:
        lo = f"[{meta['ge']:g}" if meta["ge"] is not None else "(-inf"
    hi = f"{meta['le']:g}]" if meta["le"] is not None else "inf)"
    return f"{lo}, {hi}"


def allowed(f: Field[Any]) -> str:
    """What config key ``f`` declares it allows, in words (``[1, 4096]``, ``merge | if-empty | off``, ``not
    empty``); "" when it declares nothing.

    Args:
        f: the key's dataclass field (its metadata: choices, bounds, not-empty).

    Returns:
        The words, or "". Pure, never raises.
    """
    meta = f.metadata
    if not meta:
        return ""
    if meta["choices"]:
        return " | ".join(meta["choices"])
    if meta["nonempty"]:
        return "not empty"
    if meta["ge"] is None and meta["gt"] is None and meta["le"] is None:
        return ""
    return _interval(meta) + (f" ({meta['why']})" if meta["why"] else "")


def _check_key(f: Field[Any], value: Any) -> None:
    """Raise ConfigError (one line naming the key, the value and what is allowed) when ``value`` breaks what
    key ``f`` declares (``_key``), is a NaN or infinite number, or holds a control character (``_CONTROL``:
    NUL, newline, tab, ESC, DEL, C1) in its text or in a mapping's names and values."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"config key {f.name!r}: {value!r} is not a finite number")
    texts = [value] if isinstance(value, str) else [*value, *value.values()] if isinstance(value,
                                                                                           dict) else []
    for text in texts:
        bad = _CONTROL.search(str(text))
        if bad:
            what = "a NUL byte" if bad.group() == "\0" else f"a control character ({bad.group()!r})"
            raise ConfigError(f"config key {f.name!r}: contains {what} at position {bad.start()}: a path or "
                              "name is one line of printable text")
    meta = f.metadata
    if not meta:
        return
    if meta["choices"] and value not in meta["choices"]:
        raise ConfigError(f"config key {f.name!r}: {value!r} is not one of {', '.join(meta['choices'])}")
    if meta["nonempty"] and not value.strip():
        raise ConfigError(f"config key {f.name!r} is empty")
    if (meta["ge"] is not None and not value >= meta["ge"]) \
            or (meta["gt"] is not None and not value > meta["gt"]) \
            or (meta["le"] is not None and not value <= meta["le"]):
        raise ConfigError(f"config key {f.name!r}: {value!r} is outside {allowed(f)}")
