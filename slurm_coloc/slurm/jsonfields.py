"""Values of Slurm's ``--json`` job records across schemas (pure; table: ``docs/slurm-versions.md``).

- 22.05's ``openapi/v0.0.38``: plain numbers with ``NO_VAL``/``INFINITE`` markers (``0xFFFFFFFE``/
  ``0xFFFFFFFF``); ``job_state`` one string; ``exit_code`` the wait status (``768`` for ``exit 3``).
- ``data_parser`` v0.0.40+ (23.02 on; 24.11 v0.0.42, 26.05 v0.0.45): numbers that may be unset or unlimited
  are ``{"set", "infinite", "number"}`` objects; ``job_state`` a list, base state then flags;
  ``exit_code`` ``{"status", "return_code": <number>, "signal": {"id": <number>, "name"}}``.

Each reader takes either form, so one ``JobInfo`` builder serves every version.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Tuple

BIG = 0xFFFFFFF0  # 32-bit values at or above this are Slurm's NO_VAL/INFINITE markers (v0.0.38)


def number(value: Any) -> Optional[float]:
    """A number field in either schema; None when absent, unset, infinite or one of 22.05's markers.

    ``5`` -> 5; ``{"set": true, "infinite": false, "number": 5}`` -> 5; ``{"set": false, ...}`` -> None;
    ``{"infinite": true, ...}`` -> None; ``4294967295`` -> None; ``True``/``"5"`` -> None.
    """
    if isinstance(value, Mapping):
        if not value.get("set") or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if 0 <= value < BIG else None


def integer(j: Mapping[str, Any], key: str) -> Optional[int]:
    """``number`` of ``j[key]`` as an int; None when not a usable number."""
    v = number(j.get(key))
    return None if v is None else int(v)


def job_state(value: Any) -> Tuple[str, Tuple[str, ...]]:
    """``job_state`` -> (state, flags), normalised once here (first word, upper case).

    22.05 prints one string, a flag such as ``COMPLETING`` in place of the base state; data_parser prints a
    list, base state first: ``["COMPLETED", "COMPLETING"]`` -> ("COMPLETED", ("COMPLETING",)); anything else
    -> ("", ()).
    """
    if isinstance(value, str):
        return _word(value), ()
    if isinstance(value, list) and value and all(isinstance(x, str) for x in value):
        return _word(value[0]), tuple(_word(x) for x in value[1:])
    return "", ()


def _word(text: str) -> str:
    words = text.split()
    return words[0].upper() if words else ""


def exit_pair(value: Any) -> Tuple[Optional[int], Optional[int]]:
    """``exit_code`` / ``derived_exit_code`` -> (exit code, signal), as scontrol's
    ``ExitCode=<code>:<signal>``.

    22.05: the int wait status (``768`` -> (3, 0); ``9`` -> (0, 9)). data_parser: ``return_code.number`` and
    ``signal.id.number`` (0 when unset). (None, None) when unreadable.
    """
    if isinstance(value, bool):
        return None, None
    if isinstance(value, int):
        if not 0 <= value < BIG:
            return None, None
        return (value >> 8) & 0xFF, value & 0x7F
    if isinstance(value, Mapping):
        rc = value.get("return_code")
        sig = value.get("signal")
        sig_id = sig.get("id") if isinstance(sig, Mapping) else None
        if rc is None and sig_id is None:
            return None, None
        code, signo = number(rc), number(sig_id)
        return int(code or 0), int(signo or 0)
    return None, None


def text(j: Mapping[str, Any], key: str) -> str:
    """A string field; ``""`` when absent or null (user text stays one opaque value)."""
    v = j.get(key)
    return "" if v is None else str(v)
