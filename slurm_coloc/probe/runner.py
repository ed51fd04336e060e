"""Run a probe: the job's Python, in a child process, with the ``inject`` package loaded.

Injection: the child is ``<job python> -c BOOTSTRAP <bootdir> <request.json>``, ``bootdir`` a scratch
directory holding only a link ``slurm_coloc`` to this package, so the job's interpreter imports our probe and
estimator modules (stdlib + numpy + its own torch) and nothing else of ours. The bootstrap puts ``bootdir``
first on ``sys.path`` only while it imports the probe, then removes it and ``''``, so the program's imports
resolve as in the job.

The child runs as the caller, in its own session under ``reaper.py`` (every descendant killed at the limit
and at the end), with ``RLIMIT_AS`` as memory limit, stdin ``/dev/null``, output to ``probe.log`` in the
scratch directory, in a mirror of the job's working directory (``sandbox.py``). Files it creates land in
the scratch directory; a file link it opens for writing is replaced by a copy first (``inject/main.py``).
Writes to absolute paths outside the scratch directory, or into a directory linked as a whole, still reach
the real files: the child reports each (``outside_writes``). Network libraries are put offline (environment,
refusing proxies); ``PYTHONDONTWRITEBYTECODE`` keeps ``__pycache__`` out of the user's tree; ``TMPDIR`` and
matplotlib's, inductor's and triton's caches are in the scratch directory, removed after the run.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from slurm_coloc.probe.command import ProbeCommand
from slurm_coloc.probe.reaper import limits, run_reaped
from slurm_coloc.probe.sandbox import RunAs, mirror_with_ancestors, open_scratch, private_dir, read_child_file

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BOOTSTRAP = (
    "import sys\n"
    "boot = sys.argv[1]\n"
    "sys.path[:] = [p for p in sys.path if p != '']\n"
    "sys.path.insert(0, boot)\n"
    "from slurm_coloc.probe.inject.main import main\n"
    "sys.path.remove(boot)\n"
    "main(sys.argv[2])\n"
)
DEFAULT_TIMEOUT_S = 30.0
MAX_WALL_FACTOR = 3.0  # a starved probe (a busy login node) may run this many times its limit of wall time
MAX_PROBE_PROCESSES = 32  # live processes under the probe before it is ended (reaper.py --max-procs)
PROBE_THREADS = "2"  # OMP/MKL/OpenBLAS threads of the probe child: host work only, on a shared node
DEFAULT_MEM_LIMIT_MIB = 32768
# Refuses connections at once (port 9, discard, is closed on ordinary hosts): a download fails fast.
DEAD_PROXY = "http://127.0.0.1:9"
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1", "WANDB_MODE": "disabled", "WANDB_DISABLED": "true",
    "WANDB_SILENT": "true", "COMET_OFFLINE_DIRECTORY": "", "NEPTUNE_MODE": "offline",
    "DISABLE_MLFLOW_INTEGRATION": "TRUE", "CLEARML_OFFLINE_MODE": "1", "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false", "MPLBACKEND": "Agg", "PYTHONDONTWRITEBYTECODE": "1",
    "TQDM_DISABLE": "1", "PL_DISABLE_FORK": "1",
    "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": "", "TORCHINDUCTOR_COMPILE_THREADS": "1",
    "http_proxy": DEAD_PROXY, "https_proxy": DEAD_PROXY, "HTTP_PROXY": DEAD_PROXY,
    "HTTPS_PROXY": DEAD_PROXY, "ALL_PROXY": DEAD_PROXY, "all_proxy": DEAD_PROXY, "no_proxy": "",
    "NO_PROXY": "",
}
# The task identity Slurm gives a job's batch step (one task on one node; ``sbatch`` man page, OUTPUT
# ENVIRONMENT VARIABLES): scripts that branch on them (torchvision's references start a one-process DDP group
# when ``SLURM_PROCID`` is set; Lightning's SLURM environment) take in the probe the path they take in the
# job.
BATCH_STEP_ENV = {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NNODES": "1",
                  "SLURM_JOB_NUM_NODES": "1"}
_STDLIB = re.compile(r"/lib/python\d(\.\d+)?/")  # the standard library's frames (threading.py's wait)
_FRAME_RE = re.compile(r'File "([^"]+)", line (\d+) in (\S+)')


@dataclass
class RunOutcome:
    """What one probe run gave.

    ``result``: the child's result JSON (``inject/main.py``), None when it wrote none; ``reason`` "" when
    ``result["status"] == "ok"``; ``scratch`` and ``log_path`` "" once removed; ``scratch_files``: relative
    paths the program wrote in its mirrored directory; ``log_text``: the last 20,000 characters of its output.
    """

    result: Optional[Dict[str, Any]]
    reason: str
    wall_s: float
    timed_out: bool = False
    scratch: str = ""
    log_path: str = ""
    interpreter: str = ""
    scratch_files: List[str] = field(default_factory=list)
    log_text: str = ""


def resolve_interpreter(cmd: ProbeCommand, path_env: Optional[str] = None) -> Optional[str]:
    """The job's Python as an absolute path: the command's, else ``python3`` on ``path_env``; None if absent.

    For torchrun or ``accelerate launch`` without an interpreter, the Python its console script's ``#!``
    names.
    """
    path = path_env if path_env is not None else os.environ.get("PATH")
    name = cmd.interpreter
    if name is None and cmd.launcher in ("torchrun", "accelerate"):
        name = _shebang_python(shutil.which(cmd.launcher, path=path))
    name = name or "python3"
    if os.sep in name:
        return os.path.abspath(name) if os.access(name, os.X_OK) else None
    return shutil.which(name, path=path)


def _shebang_python(launcher: Optional[str]) -> Optional[str]:
    if not launcher:
        return None
    try:
        with open(launcher, "rb") as fh:
            first = fh.readline(300).decode("utf-8", "replace").strip()
    except OSError:
        return None
    if first.startswith("#!") and "python" in first:
        return first[2:].split()[0]
    return None


def hang_site(log_text: str) -> str:
    """``file:line in func`` of the program's innermost frame in a faulthandler dump, or "".

    Frames in the standard library, site-packages, slurm-coloc or ``<...>`` are skipped.
    """
    for m in _FRAME_RE.finditer(log_text):  # faulthandler prints the innermost frame first
        path = m.group(1)
        if "site-packages" in path or "/slurm_coloc/" in path or path.startswith("<") or _STDLIB.search(path):
            continue
        return f"{os.path.basename(path)}:{m.group(2)} in {m.group(3)}"
    return ""


def _files_under(root: str) -> List[str]:
    """Real files (not the mirror's links) under ``root``, relative to it: what the program wrote."""
    paths = (os.path.join(dirpath, f) for dirpath, _dirs, filenames in os.walk(root) for f in filenames)
    return sorted(os.path.relpath(path, root) for path in paths if not os.path.islink(path))


def run_probe(cmd: ProbeCommand, timeout_s: float = DEFAULT_TIMEOUT_S,
              mem_limit_mib: int = DEFAULT_MEM_LIMIT_MIB, steps: int = 2,
              scratch_root: Optional[str] = None, keep_scratch: bool = False,
              environ: Optional[Mapping[str, str]] = None, run_as: Optional[RunAs] = None) -> RunOutcome:
    """Run ``cmd`` under the probe (module docstring) and read its result; never raises for a failing program.

    ``mem_limit_mib``: the child's address-space limit; ``scratch_root`` None: the system temp dir. No figure
    and a reason when the job's Python or the program file is missing, ``timeout_s`` ended the child before an
    optimizer step, or it wrote no result.
    """
    start = time.monotonic()
    python = resolve_interpreter(cmd, (environ if environ is not None else os.environ).get("PATH"))
    if python is None:
        return RunOutcome(None, f"the job's Python {cmd.interpreter or 'python3'} was not found", 0.0)
    if cmd.mode == "file" and not os.path.isfile(cmd.target):
        return RunOutcome(None, f"the program {cmd.target} does not exist", 0.0, interpreter=python)
    sc = _make_scratch(cmd, steps, timeout_s, scratch_root, run_as)
    env = _child_env(cmd, environ, sc)
    log_path = os.path.join(sc.root, "probe.log")
    status_path = os.path.join(sc.root, "out", "reaper.json")
    with open(log_path, "wb") as log:
        reaped = run_reaped([python, "-c", BOOTSTRAP, sc.boot, sc.request_path], status_path, timeout_s,
                            cwd=sc.work, env=env, stdout=log,
                            preexec_fn=limits(mem_limit_mib, None if run_as is None else run_as.uid),
                            run_as=run_as, max_wall_s=timeout_s * MAX_WALL_FACTOR,
                            max_procs=MAX_PROBE_PROCESSES, dump=True)
    wall = time.monotonic() - start
    # the child's own stack dump (faulthandler, 1.5 s before the limit) can crash it inside torch's frame
    # hooks ("File ???", SIGSEGV): a child killed by a signal that close to the limit ran out of time
    rc = reaped.get("returncode")
    timed_out = bool(reaped.get("timed_out")) or (isinstance(rc, int) and rc < 0 and wall >= timeout_s - 2.0
                                                  and not reaped.get("too_many_processes"))
    out = RunOutcome(None, "", wall, timed_out, sc.root, log_path, python, _files_under(sc.work))
    out.result = _read_result(sc.result_path, run_as)
    out.log_text = _tail(log_path)
    left = int(reaped.get("left_running") or 0)
    _note_left_running(out.result, left)
    out.reason = _reason(out, timeout_s, rc, left, reaped)
    if not keep_scratch:
        shutil.rmtree(sc.root, ignore_errors=True)
        out.scratch = out.log_path = ""
    return out


@dataclass
class _Scratch:
    """One probe run's scratch directory (``root``) and the paths in it the child is given."""

    root: str
    boot: str  # on the child's ``sys.path`` for the bootstrap: a link to this package
    tmp: str  # the child's TMPDIR and caches
    work: str  # the mirror of the job's working directory, the child's cwd
    result_path: str
    request_path: str


def _make_scratch(cmd: ProbeCommand, steps: int, timeout_s: float, scratch_root: Optional[str],
                  run_as: Optional[RunAs] = None) -> _Scratch:
    """Make the scratch directory: the package link, the mirrored working directory and the child's request
    (``inject/main.py``: mode, target, arguments, steps, time limit in seconds, result path). For a child run
    as ``run_as`` the directory stays root's (traverse only), ``tmp``, ``up`` and ``out`` are the user's."""
    scratch = tempfile.mkdtemp(prefix="coloc-probe-", dir=scratch_root)
    open_scratch(scratch, run_as)
    boot, up, tmp = (os.path.join(scratch, d) for d in ("boot", "up", "tmp"))
    os.makedirs(boot, mode=0o755)
    private_dir(tmp, run_as)
    private_dir(os.path.join(scratch, "out"), run_as)
    os.symlink(PACKAGE_DIR, os.path.join(boot, "slurm_coloc"))
    work = mirror_with_ancestors(os.path.normpath(cmd.workdir), up)
    if run_as is not None:
        run_as.give(up)
    result_path = os.path.join(scratch, "out", "result.json")
    req = {"mode": cmd.mode, "target": cmd.target, "args": list(cmd.args), "result": result_path,
           "steps": int(steps), "scratch": scratch, "program_dir": cmd.workdir, "work": work,
           "timeout_s": float(timeout_s)}
    req_path = os.path.join(scratch, "request.json")
    with open(req_path, "w", encoding="utf-8") as fh:
        json.dump(req, fh)
    os.chmod(req_path, 0o644)
    return _Scratch(scratch, boot, tmp, work, result_path, req_path)


def _child_env(cmd: ProbeCommand, environ: Optional[Mapping[str, str]], sc: _Scratch) -> Dict[str, str]:
    """The child's environment: the job's (``environ``, else ``os.environ``) without ``PYTHONSTARTUP``, put
    offline (``OFFLINE_ENV``), the command's own variables, the batch step's task identity where unset,
    ``PROBE_THREADS`` math threads, and temporary files and caches in the scratch directory."""
    env = dict(os.environ if environ is None else environ)
    env.pop("PYTHONSTARTUP", None)
    env.update(OFFLINE_ENV)
    env.update(dict(cmd.env))
    # what the batch step of a one-task job sees (a script may branch)
    for name, value in BATCH_STEP_ENV.items():
        env.setdefault(name, value)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):  # host work only
        env[name] = PROBE_THREADS
    tmp = sc.tmp
    env.update(TMPDIR=tmp, MLFLOW_TRACKING_URI="file:" + os.path.join(sc.root, "mlruns"),
               SLURM_SUBMIT_DIR=cmd.workdir, COLOC_PROBE="1", MPLCONFIGDIR=os.path.join(tmp, "mpl"),
               TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"),
               TRITON_CACHE_DIR=os.path.join(tmp, "triton"), WANDB_DIR=tmp)
    return env


def _read_result(result_path: str, run_as: Optional[RunAs] = None) -> Optional[Dict[str, Any]]:
    """The child's result JSON, or None when it wrote none (or not all of it, or not as ``run_as``)."""
    try:
        result = json.loads(read_child_file(result_path, run_as).decode("utf-8"))
    except (OSError, ValueError):
        return None
    return result if isinstance(result, dict) else None


def _note_left_running(result: Optional[Dict[str, Any]], left: int) -> None:
    """Add a note to ``result`` that the program left ``left`` processes running, which the probe ended."""
    if left and result is not None:
        notes = result.setdefault("notes", [])
        if isinstance(notes, list):
            notes.append(f"the program left {left} process(es) running at its end (a daemon?): ended "
                         "by the probe")


def _reason(out: RunOutcome, timeout_s: float, returncode: Any, left: int,
            reaped: Optional[Dict[str, Any]] = None) -> str:
    """Why ``out`` has no figure ("" when the child reported ``ok``): too many processes, the time limit, an
    end without a result (its exit status and last log line), or the child's own reason."""
    reaped = reaped or {}
    ok = out.result is not None and out.result.get("status") == "ok"
    if reaped.get("too_many_processes") and not ok:
        n = reaped["too_many_processes"]
        return (f"the program started more than {MAX_PROBE_PROCESSES} processes ({n} running: a fork loop or "
                "many workers): the probe ended them all")
    if out.timed_out and not ok:
        site = hang_site(out.log_text)
        where = f" (stuck at {site})" if site else ""
        busy = (f", {reaped.get('cpu_s', 0):g} s of CPU in {reaped.get('wall_s', 0):g} s on a busy machine"
                if reaped.get("extended") else "")
        return (f"the probe reached its time limit of {timeout_s:g} s before the first optimizer "
                f"step{where}{busy}")
    if out.result is None:
        last = out.log_text.strip().splitlines()[-1:] or [""]
        daemon = f", leaving {left} process(es) running (killed)" if left else ""
        return (f"the probe ended (exit {returncode}){daemon} without a result: "
                f"{' '.join(last[0].split())[:200]}")
    if out.result.get("status") != "ok":
        return str(out.result.get("reason") or "the probe saw no optimizer step")
    return ""


def _tail(path: str, n: int = 20000) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - n))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
