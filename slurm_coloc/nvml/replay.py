"""Replay of an NVML recording (JSON lines) for machines without a GPU: CI and demos, never production.

Format (written by ``coloc-sampler record``): first line a header ``{"recording": "<what/where>", ...}``, then
one frame per line ``{"t": s since start, "gpus": [GpuReading...], "procs": [ProcReading...]}`` (a frame may
carry ``"error"``: the live read failed there). Replay serves the frames in order, at the current wall time,
and starts over at the end. ``pid_map`` replaces recorded pids by live ones so attribution through /proc can be
exercised on a real Slurm job.
"""
from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from slurm_coloc.errors import ColocError
from slurm_coloc.nvml.readings import Frame


class ReplayReader:
    """Serve recorded frames as if read now.

    Args:
        path: recording file (``*.jsonl``).
        pid_map: ``{recorded pid: live pid}``; unmapped pids are served as recorded.

    Raises:
        ColocError: missing file, no header, or no frame.
    """

    def __init__(self, path: str, pid_map: Optional[Mapping[int, int]] = None) -> None:
        p = Path(path)
        try:
            lines = [ln for ln in p.read_text(encoding="utf-8").splitlines() if ln.strip()]
        except OSError as exc:
            raise ColocError(f"cannot read NVML recording {path!r}: {exc}") from None
        try:
            rows: List[Dict[str, Any]] = [json.loads(ln) for ln in lines]
        except json.JSONDecodeError as exc:
            raise ColocError(f"NVML recording {path!r} is not JSON lines: {exc}") from None
        if not rows or "recording" not in rows[0]:
            raise ColocError(f"NVML recording {path!r} has no header line with a 'recording' label")
        self.header = rows[0]
        self.frames = rows[1:]
        if not self.frames:
            raise ColocError(f"NVML recording {path!r} holds no frame")
        self.pid_map = dict(pid_map or {})
        self._next = 0

    @property
    def recorded_pids(self) -> List[int]:
        """Distinct pids in the recording, in order of first appearance."""
        seen: List[int] = []
        for f in self.frames:
            for p in f.get("procs", []):
                if p["pid"] not in seen:
                    seen.append(p["pid"])
        return seen

    def read(self) -> Frame:
        """The next recorded frame, stamped with the current wall time."""
        data = self.frames[self._next % len(self.frames)]
        self._next += 1
        frame = Frame.from_json(data, ts=time.time())
        if self.pid_map:
            frame.procs = [replace(p, pid=self.pid_map.get(p.pid, p.pid)) for p in frame.procs]
        return frame

    def close(self) -> None:
        """Nothing to release."""
