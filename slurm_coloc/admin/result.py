"""One result of ``coloc-admin check`` (shared by ``checks.py``, ``gpu_checks.py`` and ``munge.py``)."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Dict


@dataclass(frozen=True)
class Check:
    """One result: ``status`` pass|fail|skip|warn (works, but see ``fix``), ``what`` the finding, ``fix`` what
    to do (empty when passing)."""

    name: str
    status: str
    what: str
    fix: str = ""

    def to_json(self) -> Dict[str, str]:
        """JSON-able dict."""
        return asdict(self)


def ok(name: str, what: str) -> Check:
    """A passing check; ``what`` was found, in words."""
    return Check(name, "pass", what)


def fail(name: str, what: str, fix: str) -> Check:
    """A failing check: ``what`` is wrong, in words, and ``fix`` (a command or a setting)."""
    return Check(name, "fail", what, fix)
