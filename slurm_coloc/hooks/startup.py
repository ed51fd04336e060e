"""How long ago this process was exec'd: the hook's start-up counts against the shim's ``timeout``.

A light module (no third-party import): ``coloc-hook`` uses it while still starting up.
"""
from __future__ import annotations

import os
from pathlib import Path


def process_age_s() -> float:
    """Seconds since exec (``/proc/self/stat`` start time vs ``/proc/uptime``); 0 if unknown."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime_s - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0
