"""coloc-sbatch's estimate, run in a child process: the user's model never touches our stdout or our time.

``estimate_isolated`` starts ``python -c <bootstrap>`` (this interpreter, this ``sys.path``, the caller's
working directory) in a new session, so it and whatever it forks form one process group. The child reads its
task (spec, GPU model, history) from stdin, imports and traces the model through ``estimate.estimate_peak``,
and writes the result as JSON to a private file. Its stdout and stderr (the model's prints, torch warnings) go
to a private log file, never to coloc-sbatch's stdout: ``--parsable`` prints the job id alone. After
``timeout_s`` the group is killed (SIGKILL) and the caller gets None; the group is killed in every case once
the child is done, so nothing the model forked outlives coloc-sbatch.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from slurm_coloc.errors import EstimateError
from slurm_coloc.estimate.spec import Estimate, ModelSpec

LOG_TAIL_LINES = 5  # lines of the child's output shown when it died without an answer
_BOOT = ("import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
         "from slurm_coloc.cli.sbatch_estimate import child_main; child_main(sys.argv[2])")


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in lines[-LOG_TAIL_LINES:])


def estimate_isolated(spec: ModelSpec, gpu_model: str, history_mib: Sequence[int],
                      timeout_s: float) -> Optional[Estimate]:
    """``estimate.estimate_peak(spec, gpu_model, history_mib)`` in a child process group bounded by
    ``timeout_s``.

    Args:
        spec: the model to estimate (``#COLOC model=`` and its options).
        gpu_model: the GPU model name (a key of the estimator's GPU table, e.g. ``H100``).
        history_mib: earlier runs' figures for the script (MiB), applied by the estimator.
        timeout_s: the child's time limit (s).

    Returns:
        The estimate (peak memory in MiB), or None when the child did not answer within ``timeout_s`` (it and
        its process group are killed).

    Raises:
        EstimateError: the estimator's own error (bad spec, a model that cannot be imported or run), or a
            child that died without an answer (the last lines of its output in the message).
    """
    task = {"spec": dataclasses.asdict(spec), "gpu_model": gpu_model,
            "history_mib": [int(h) for h in history_mib]}
    with tempfile.TemporaryDirectory(prefix="coloc-sbatch-est-") as tmp:
        result, log_path = Path(tmp) / "result.json", Path(tmp) / "child.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([sys.executable, "-c", _BOOT, json.dumps(sys.path), str(result)],
                                    stdin=subprocess.PIPE, stdout=log, stderr=log, start_new_session=True)
        try:
            assert proc.stdin is not None
            try:
                proc.stdin.write(json.dumps(task).encode())
                proc.stdin.close()
            except BrokenPipeError:
                pass
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                return None
        finally:
            _kill_group(proc.pid)  # the child's pgid is its pid (new session); also kills what it forked
            proc.wait()
        try:
            answer: Dict[str, Any] = json.loads(result.read_text())
        except (OSError, ValueError):
            raise EstimateError(f"the estimate process died (exit {proc.returncode}) without an answer: "
                                f"{_tail(log_path) or 'no output'}") from None
    if "error" in answer:
        raise EstimateError(str(answer["error"]))
    try:
        return Estimate.from_json(answer)
    except ValueError as exc:
        raise EstimateError(f"the estimate process answered badly: {exc}") from None


def child_main(result_path: str) -> None:
    """The child: read the task from stdin, estimate, write ``Estimate.to_json()`` or ``{"error": <one
    line>}`` to ``result_path``. Exit code 0 once an answer is written.

    Args:
        result_path: the file the answer is written to (whole: through a ``.tmp`` file and a rename).

    Raises:
        Never returns: the process ends with ``os._exit(0)``; a malformed task on stdin (``ValueError``,
        ``KeyError``) ends it without an answer, which the parent reports.
    """
    task = json.loads(sys.stdin.read())
    spec_fields = dict(task["spec"])
    spec_fields["input_shape"] = tuple(spec_fields["input_shape"])
    answer: Dict[str, Any]
    try:
        from slurm_coloc.errors import ColocError
        from slurm_coloc.estimate import estimate_peak

        try:
            est = estimate_peak(ModelSpec(**spec_fields), task["gpu_model"], history_mib=task["history_mib"])
            answer = est.to_json()
        except ColocError as exc:
            answer = {"error": exc.one_line()}
    except Exception as exc:  # the user's model may raise anything; one line back to the parent
        answer = {"error": " ".join(f"the model failed: {type(exc).__name__}: {exc}".split())[:2000]}
    text = json.dumps(answer, default=str)
    tmp = result_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, result_path)  # whole or nothing: a kill mid-write leaves no half answer
    sys.stdout.flush()
    os._exit(0)  # skip the model's atexit handlers and non-daemon threads: the answer is written

