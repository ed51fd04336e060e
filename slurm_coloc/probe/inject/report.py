"""What a probe reports (job's Python): the result JSON of ``inject/main.py`` and the one-line reasons.

Result keys: ``inject/main.py``'s module docstring.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import sysconfig
import traceback
from typing import Any, Dict, List

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]|\[[0-9;]*m")
REASON_CHARS = 200  # the most of an exception's message a reason line keeps


def result(probe: Any, status: str, reason: str) -> Dict[str, Any]:
    """The result JSON (keys: ``inject/main.py``'s module docstring; bytes, FLOP) of a probe ending with
    ``status``.

    ``probe.state`` may be None (torch never imported). Notes ``cudnn.benchmark`` on the state as a side
    effect.
    """
    st = probe.state
    alloc = st.tracker.alloc if st is not None else None
    dw = 0
    ws_max = 0
    ops = 0
    assumed: Dict[str, int] = {}
    if st is not None:
        for c in st.tracker.conv_calls:
            if len(c.input) >= 4 and c.groups > 1 and c.groups == c.input[1]:
                dw = max(dw, int(c.input[-1]) * int(c.input[-2]))
        ws_max = int(st.tracker.ws_max_b)
        ops = int(st.tracker.ops)
        assumed = dict(st.tracker.scalars.counts)
    torch_mod = sys.modules.get("torch")
    if st is not None and st.tracker.conv_calls and torch_mod is not None \
            and getattr(torch_mod.backends.cudnn, "benchmark", False):
        st.note("cudnn.benchmark = True: cuDNN's autotuning can reserve more than the replayed workspaces "
                "(pytorch/examples dcgan: +620 to +1,170 MiB on the H100, docs/estimator.md); not modelled")
    return {
        "status": status, "reason": reason,
        "peak_reserved_b": int(alloc.peak_reserved_b) if alloc else 0,
        "peak_allocated_b": int(alloc.peak_allocated_b) if alloc else 0,
        "optimizers": sorted(set(probe.opt_names.values())),
        "steps": sum(probe.opt_steps.values()), "forwards": probe.forwards,
        "autocast": list(st.autocast_dtypes) if st else [],
        "nccl_group": bool(st.nccl_group) if st else False,
        "param_dtypes": probe.param_dtypes, "depthwise_max_hw": dw,
        "conv_workspace_max_b": ws_max, "ops": ops, "assumed_values": assumed,
        "flops_per_step": probe.step_flops(),
        "notes": list(st.notes) if st else [], "outside_writes": probe.outside_writes,
        "user_files": user_files(), "torch": torch_version(),
    }


def torch_version() -> str:
    """The version of the torch the program imported ("" when none)."""
    t = sys.modules.get("torch")
    return str(getattr(t, "__version__", ""))


def user_files() -> List[str]:
    """Source files imported from outside the Python installation and slurm-coloc (realpaths)."""
    skip = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        with contextlib.suppress(KeyError):
            skip.add(os.path.realpath(sysconfig.get_paths()[key]))
    skip.update(os.path.realpath(p) for p in sys.path if "site-packages" in p or "dist-packages" in p)
    ours = os.path.realpath(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    out = set()
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if not f or not f.endswith(".py") or not os.path.isabs(f) or f.startswith(("/etc/", "/usr/")):
            continue
        real = os.path.realpath(f)
        if real.startswith(ours + os.sep) or any(real.startswith(s + os.sep) for s in skip):
            continue
        out.add(real)
    return sorted(out)


def reason_of(exc: BaseException) -> str:
    """One line naming what stopped the program, with the deepest frame of the program's own code.

    ``the program exited (code N) ...``, ``the program reached the real CUDA driver at file:line ...`` (never
    the job's own cause), ``data missing at file:line: ...`` or ``the program failed at file:line: Type:
    message``.
    """
    if isinstance(exc, SystemExit):
        return f"the program exited (code {exc.code}) before its first optimizer step"
    worker = worker_reason(exc)
    if worker:
        return worker
    msg = short_message(exc)
    where = ""
    for fr in reversed(traceback.extract_tb(exc.__traceback__)):
        if "site-packages" not in fr.filename and "slurm_coloc" not in fr.filename and "<" not in fr.filename:
            where = f" at {os.path.basename(fr.filename)}:{fr.lineno}"
            break
    if _DRIVER.search(msg):  # the probe has no GPU: a driver error is a CUDA call the fake GPU missed
        return (f"the program reached the real CUDA driver{where} through a CUDA call the probe's fake GPU "
                f"does not imitate ({type(exc).__name__}: {msg[:120]}); the job itself has a GPU")
    if isinstance(exc, FileNotFoundError) or "not found" in msg.lower() and "dataset" in msg.lower():
        return f"data missing{where}: {type(exc).__name__}: {msg}"
    if "weights_only" in str(exc) and "UnpicklingError" in type(exc).__name__:
        msg += (" (torch >= 2.6 loads with weights_only=True, which refuses what this file holds: the "
                "program fails the same way in the job)")
    return f"the program failed{where}: {type(exc).__name__}: {msg}"


_DRIVER = re.compile(r"Found no NVIDIA driver|CUDA driver version is insufficient|no CUDA GPUs are available|"
                     r"only supported with GPUs, no GPUs found|Torch not compiled with CUDA enabled")
_WORKER_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def worker_reason(exc: BaseException) -> str:
    """``the program's worker process N failed at file:line: Type: message`` for a launcher's wrapper
    exception, else "".

    ``torch.multiprocessing.spawn`` raises ``ProcessRaisedException`` with the worker's traceback as text; the
    line names its first exception (the cause where it chains) and its deepest frame in the program's own
    code.
    """
    text = str(exc)
    m = re.search(r"-- Process (\d+) terminated with the following error:\s*(Traceback.*)", text, re.S)
    if m is None or "ProcessRaised" not in type(exc).__name__:
        return ""
    first = re.split(r"\n\s*\n(?:During handling|The above exception)", m.group(2))[0]
    lines = [ln for ln in first.strip().splitlines() if ln.strip()]
    error = lines[-1].strip() if lines else ""
    where = ""
    for fm in reversed(list(_WORKER_FRAME.finditer(first))):
        if "site-packages" not in fm.group(1) and "slurm_coloc" not in fm.group(1) and "<" not in fm.group(1):
            where = f" at {os.path.basename(fm.group(1))}:{fm.group(2)}"
            break
    name, _, msg = error.partition(": ")
    short = short_message(RuntimeError(msg)) if msg else ""
    who = f"the program's worker process {m.group(1)}"
    if _DRIVER.search(msg):
        return (f"{who} reached the real CUDA driver{where} through a CUDA call the probe's fake GPU does "
                f"not imitate ({name}: {short[:120]}); the job itself has a GPU")
    return f"{who} failed{where}: {name}{': ' + short if short else ''}"


def short_message(exc: BaseException) -> str:
    """The message on one line without colour codes; a long one cut at its first sentence (<=
    ``REASON_CHARS``).
    """
    msg = " ".join(_ANSI.sub("", str(exc)).split())
    if len(msg) > REASON_CHARS:
        first = msg.find(". ")
        msg = msg[:first + 1] if 0 < first < REASON_CHARS else msg[:REASON_CHARS - 3] + "..."
    return msg


