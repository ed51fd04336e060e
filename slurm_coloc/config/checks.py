"""One config key's value: converted to the key's type (``_coerce_field``: from YAML or ``COLOC_*`` text) and
checked against what the key declares (``_check_key``; ``allowed`` says it in words).

The declarations are ``slurm_coloc.config.sections._key``'s; the whole config is checked by
``slurm_coloc.config._validate``.
"""
from __future__ import annotations

import math
from dataclasses import Field
from typing import Any, Dict, List, Mapping

from slurm_coloc.errors import ConfigError


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
    key ``f`` declares (``_key``), is a NaN or infinite number, or holds a NUL byte."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"config key {f.name!r}: {value!r} is not a finite number")
    texts = [value] if isinstance(value, str) else [*value, *value.values()] if isinstance(value,
                                                                                           dict) else []
    if any("\0" in text for text in texts):
        raise ConfigError(f"config key {f.name!r}: contains a NUL byte")
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
