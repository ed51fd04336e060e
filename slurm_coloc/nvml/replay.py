"""Replay of an NVML recording (JSON lines) for machines without a GPU: CI and demos, never production.

Format (written by ``coloc-sampler record``): first line a header ``{"recording": "<what/where>", ...}``, then
one frame per line ``{"t": s since start, "gpus": [GpuReading...], "procs": [ProcReading...]}`` (a frame may
carry ``"error"``: the live read failed there). Replay serves the frames in order, at the current wall time,
and starts over at the end. ``pid_map`` replaces recorded pids by live ones so attribution through /proc can
be exercised on a real Slurm job.
"""
from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from slurm_coloc.errors import ColocError
from slurm_coloc.nvml.readings import Frame, PidMib


class ReplayReader:
    """Serve recorded frames (a ``*.jsonl`` file) as if read now; ``pid_map`` maps recorded pids to live ones.

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

    def read(self) -> Frame:
        """The next recorded frame, stamped with the current wall time."""
        data = self.frames[self._next % len(self.frames)]
        self._next += 1
        frame = Frame.from_json(data, ts=time.time())
        if self.pid_map:
            m = self.pid_map
            frame.procs = [replace(p, pid=m.get(p.pid, p.pid)) for p in frame.procs]
            frame.lists = [replace(x, compute=_mapped(x.compute, m), mps=_mapped(x.mps, m))
                           for x in frame.lists]
        return frame

    def close(self) -> None:
        """Nothing to release."""


def _mapped(pairs: Optional[Tuple[PidMib, ...]], pid_map: Mapping[int, int]) -> Optional[Tuple[PidMib, ...]]:
    return None if pairs is None else tuple((pid_map.get(pid, pid), mib) for pid, mib in pairs)


class RecordedComputeModes:
    """``ComputeModes`` over recorded GPU states, for CI: never touches a GPU; every call is listed in
    ``calls``.

    ``modes``: ``{NVML index: mode name}`` as recorded (e.g. the H100's ``compute_mode`` 0 = ``DEFAULT`` in
    ``benchmarks/device/results/h100-mps-limits/mps_limits.json``); ``fail_set``: ``set`` raises
    ``ColocError`` (what NVML answers without permission).
    """

    def __init__(self, modes: Mapping[int, str], fail_set: bool = False) -> None:
        self.modes = dict(modes)
        self.fail_set = fail_set
        self.calls: List[tuple] = []

    def get(self, index: int) -> str:
        """The recorded (or last set) ``MODE_NAMES`` value of GPU ``index``.

        Raises:
            ColocError: the recording has no such GPU.
        """
        if index not in self.modes:
            raise ColocError(f"GPU {index}: not in the recording")
        return self.modes[index]

    def set(self, index: int, mode: str) -> None:
        """Note the call in ``calls`` and keep ``mode`` (not checked) for GPU ``index`` in memory.

        Raises:
            ColocError: built with ``fail_set`` (the call is still noted; the mode is not changed).
        """
        self.calls.append(("set", index, mode))
        if self.fail_set:
            raise ColocError(f"GPU {index}: cannot set compute mode {mode}: Insufficient Permissions")
        self.modes[index] = mode
