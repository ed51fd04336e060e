"""Running a hook safely: bounded time, every error caught and logged, a record per run, exit 0. Time bound of
one hook process (``bound_s``): the hook's own work runs in a forked child, in its own process group, under
SIGALRM at ``hook_timeout_s`` (``HookTimeout`` ends Python-level waits and the subprocesses they wait on); a
child that has not ended ``KILL_GRACE_S`` later (stuck in C code the alarm cannot interrupt) is SIGKILLed with
its process group. The parent, which never touches NVML, MPS or Slurm, then records the run (hooks/record.py)
within ``RECORD_BUDGET_S``, busy waits capped at ``RECORD_BUSY_S``. Defaults: 20 + 1 + 3 + 1 = 25 s. The
shim's ``timeout`` (prolog_epilog/coloc-hook.sh, ``COLOC_SHIM_TIMEOUT_S``, default ``OUTER_LIMIT_S``) counts
from exec, so the child's budget is also capped by what start-up left of it (``work_budget_s``). A SIGTERM to
the parent (``HookTerminated``) queues the rows a failed run leaves (they only fill what the child does not
write) and logs the run's one ``<hook> done in N ms (TERMINATED ...)`` line; the child is left to finish under
its own alarm. The child answers with one JSON object ``{"ok", "detail", "result"}`` on a pipe, encoded within
size limits and decoded by hooks/context.py (``encode_result``, ``decode_answer``). docs/reliability.md
describes the faults this is tested against."""
from __future__ import annotations

import dataclasses
import logging
import logging.handlers
import os
import select
import signal
import time
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from slurm_coloc import config as config_mod
from slurm_coloc.errors import ColocError
from slurm_coloc.hooks import ctld, node
from slurm_coloc.hooks.context import HookContext, decode_answer, encode_result
from slurm_coloc.hooks.pending import process_age_s
from slurm_coloc.hooks.record import (
    RECORD_BUDGET_S,
    RECORD_BUSY_S,
    HookTerminated,
    HookTimeout,
    enqueue_ops,
    record_ops,
    record_run,
    target_of,
)

log = logging.getLogger("slurm_coloc.hooks")

HookFn = Callable[[HookContext, config_mod.Config, Dict[str, str]], Any]
HOOKS: Dict[str, HookFn] = {
    "prolog-slurmctld": ctld.prolog_slurmctld,
    "epilog-slurmctld": ctld.epilog_slurmctld,
    "prolog": node.prolog,
    "epilog": node.epilog,
    "task-prolog": node.task_prolog,
}
KILL_GRACE_S = 1.0  # after hook_timeout_s, a child that did not end by itself is SIGKILLed
OUTER_LIMIT_S = 30.0  # the shim's `timeout` (prolog_epilog/coloc-hook.sh) when COLOC_SHIM_TIMEOUT_S is absent
OUTER_MARGIN_S = 1.0  # kept free under the shim's limit (logging, exit)
MIN_WORK_S = 5.0  # below this the shim's limit cannot be kept anyway: the child keeps its full hook_timeout_s


def _on_alarm(signum: int, frame: Optional[FrameType]) -> None:
    raise HookTimeout()


def _on_term(signum: int, frame: Optional[FrameType]) -> None:
    raise HookTerminated(signum)


def work_budget_s(cfg: config_mod.Config, env: Mapping[str, str], age_s: float) -> float:
    """The child's time budget (s), at most ``hook_timeout_s``; never raises. Capped so that the whole process
    (start-up ``age_s``, kill grace, recording) ends ``OUTER_MARGIN_S`` before the shim's limit
    (``COLOC_SHIM_TIMEOUT_S``; a bad value counts as ``OUTER_LIMIT_S``). When that leaves less than
    ``MIN_WORK_S`` (an overloaded host), the cap is dropped: cutting the work short would only lose it, while
    the parent's SIGTERM is caught and logged and the child finishes on its own."""
    try:
        outer = float(env.get("COLOC_SHIM_TIMEOUT_S") or OUTER_LIMIT_S)
    except ValueError:
        outer = OUTER_LIMIT_S
    left = outer - age_s - OUTER_MARGIN_S - (bound_s(cfg) - cfg.hook_timeout_s)
    return cfg.hook_timeout_s if left < MIN_WORK_S else min(cfg.hook_timeout_s, left)


def _setup_logging(cfg: config_mod.Config, job_id: Optional[int], create_dir: bool = True) -> None:
    """Log to ``<log_dir>/hooks.log``; else syslog (hooks' stderr goes nowhere); else stderr."""
    level = os.environ.get("COLOC_LOG_LEVEL", "INFO").upper()
    fmt = f"%(asctime)s %(levelname)s coloc[{job_id}] %(message)s"
    handler: logging.Handler
    try:
        if create_dir:
            Path(cfg.log_dir).mkdir(parents=True, exist_ok=True)
        handler = logging.handlers.WatchedFileHandler(Path(cfg.log_dir) / "hooks.log")
    except OSError:
        try:
            handler = logging.handlers.SysLogHandler(address="/dev/log")
            fmt = f"coloc[{job_id}]: %(levelname)s %(message)s"
        except OSError:
            handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(fmt))
    root = logging.getLogger("slurm_coloc")
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level, logging.INFO))


def _load_config(name: str, ctx: HookContext, env: Dict[str, str]) -> Optional[config_mod.Config]:
    """The config, or None after logging (and recording where possible) why it cannot be loaded. The
    TaskProlog runs in the job's environment, so it takes no override from it
    (``config.load_in_job_environment``)."""
    try:
        if name == "task-prolog":
            return config_mod.load_in_job_environment(env)
        return config_mod.load(environ=env)
    except ColocError as exc:
        fallback = config_mod.load_fallback(environ=env)
        _setup_logging(fallback, ctx.job_id, create_dir=False)
        log.error("%s: config unusable, hook skipped (job runs without slurm-coloc): %s", name,
                  exc.one_line())
        if fallback.state_dir != config_mod.Config().state_dir or os.path.isdir(fallback.state_dir):
            record_bounded(name, ctx, fallback, False, {"error": exc.one_line()}, time.time(), 0.0, {}, env)
        return None


def record_bounded(name: str, ctx: HookContext, cfg: config_mod.Config, ok: bool, detail: Dict[str, Any],
                   started_ts: float, duration_ms: float, state: Dict[str, Any],
                   env: Mapping[str, str]) -> None:
    """Record this run (``record_run``) within ``RECORD_BUDGET_S`` wall-clock seconds, never losing its rows.
    The rows are built before the alarm is armed and, unless ``record_run`` committed them
    (``state["recorded"]``), queued after it is disarmed, so an alarm firing anywhere loses none; rows both
    committed and queued are applied once (``once`` windows). Never raises (the alarm's ``HookTimeout`` is
    caught and logged), but ``HookTerminated`` passes."""
    target = target_of(name, ctx)
    if target is None:
        return
    ops = record_ops(name, ctx, ok, detail, started_ts, duration_ms)
    state["recorded"] = False
    _bounded(lambda: record_run(name, target, cfg, ops, state, env), RECORD_BUDGET_S)
    if ops and not state["recorded"]:
        enqueue_ops(cfg, target, ops)


def _bounded(fn: Callable[[], object], seconds: float) -> None:
    old = signal.signal(signal.SIGALRM, _on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        fn()
    except HookTimeout:
        log.error("recording timed out after %g s", seconds)
    finally:
        try:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        except HookTimeout:  # the one alarm, delivered after fn() returned (Python runs handlers between
            signal.signal(signal.SIGALRM, old)  # bytecodes): nothing left to cut short


def run_hook(name: str, environ: Optional[Mapping[str, str]] = None) -> List[str]:
    """Run hook ``name`` (of ``HOOKS``) for the job in ``environ`` (None: ``os.environ``); lines to print.
    Only TaskProlog prints lines. Never raises."""
    env = dict(os.environ if environ is None else environ)
    t0, started_ts = time.monotonic(), time.time()
    age_ms = process_age_s() * 1000
    try:
        old_term = signal.signal(signal.SIGTERM, _on_term)
    except ValueError:  # not the main thread (tests): no handler
        old_term = None
    state: Dict[str, Any] = {"cfg": None, "child": None, "recorded": False}
    ctx = HookContext.from_env(env)
    try:
        return _run_hook(name, env, ctx, t0, started_ts, age_ms, state)
    except HookTerminated:
        _terminated(name, env, ctx, t0, started_ts, age_ms, state)
        return []
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)


def _run_hook(name: str, env: Dict[str, str], ctx: HookContext, t0: float, started_ts: float, age_ms: float,
              state: Dict[str, Any]) -> List[str]:
    """``run_hook`` proper; ``state`` tells a SIGTERM handler what was reached (config, child, recorded)."""
    cfg = _load_config(name, ctx, env)
    if cfg is None:
        log.info("%s done in %.0f ms (config unusable)", name, (time.monotonic() - t0) * 1000)
        return []
    _setup_logging(cfg, ctx.job_id)
    state["cfg"] = cfg
    if name not in HOOKS or ctx.job_id is None:
        log.error("%s: unknown hook or no SLURM_JOB_ID", name)
        return []
    budget = work_budget_s(cfg, env, age_ms / 1000 + time.monotonic() - t0)
    run_cfg = cfg if budget >= cfg.hook_timeout_s else dataclasses.replace(cfg, hook_timeout_s=budget)
    ok, detail, result = run_bounded(HOOKS[name], ctx, run_cfg, env, name, state)
    duration_ms = (time.monotonic() - t0) * 1000
    level = logging.INFO if ok else logging.ERROR
    log.log(level, "%s %s in %.0f ms: %s", name, "ok" if ok else "FAILED", duration_ms, detail)
    if name != "task-prolog":
        record_bounded(name, ctx, cfg, ok, detail, started_ts, duration_ms, state, env)
        result = None
    log.info("%s done in %.0f ms (bound %.0f ms, work budget %.1f s, exec %.0f ms before)", name,
             (time.monotonic() - t0) * 1000, bound_s(cfg) * 1000, budget, age_ms)
    return result if ok and isinstance(result, list) else []


def _terminated(name: str, env: Dict[str, str], ctx: HookContext, t0: float, started_ts: float, age_ms: float,
                state: Dict[str, Any]) -> None:
    """SIGTERM reached the hook process: queue what a failed run leaves, log the one done line. Called with
    about 2 s left (the shim's ``timeout -k 2``); does no database wait. The child (own process group,
    untouched by the shim's signals) finishes its work under its own alarm. Never raises."""
    try:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut this short
        child = state.get("child")
        cfg = state.get("cfg")
        if cfg is None:
            cfg = config_mod.load_fallback(environ=env)
            _setup_logging(cfg, ctx.job_id, create_dir=False)
        duration_ms = (time.monotonic() - t0) * 1000
        error = "terminated by SIGTERM (the shim's timeout, or slurmd/slurmctld stopping)"
        target = target_of(name, ctx)
        if target is not None and ctx.job_id is not None and name in HOOKS and not state.get("recorded"):
            enqueue_ops(cfg, target, record_ops(name, ctx, False, {"error": error}, started_ts, duration_ms))
        log.error("%s done in %.0f ms (TERMINATED: %s; exec %.0f ms before; child %s left to finish)", name,
                  duration_ms, error, age_ms, child)
    except BaseException:  # a hook must never fail the node
        pass


def _child(fn: HookFn, ctx: HookContext, cfg: config_mod.Config, env: Dict[str, str], name: str,
           fd: int) -> None:
    """Forked child: run the hook under SIGALRM, write ``{"ok", "detail", "result"}`` to ``fd``, exit."""
    payload: Dict[str, Any]
    try:
        os.setpgid(0, 0)  # its own process group: a hard kill takes its subprocesses too
    except OSError:
        pass
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, cfg.hook_timeout_s)
    try:
        try:
            result = fn(ctx, cfg, env)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        payload = {"ok": True, "detail": result if isinstance(result, dict) else {},
                   "result": result if isinstance(result, list) else None}
    except HookTimeout:
        payload = {"ok": False, "detail": {"error": f"timed out after {cfg.hook_timeout_s:g} s"}}
    except ColocError as exc:
        payload = {"ok": False, "detail": {"error": exc.one_line()}}
    except BaseException as exc:  # our bug must not drain the node
        payload = {"ok": False, "detail": {"error": f"{type(exc).__name__}: {exc}"}}
        try:
            log.exception("%s: internal error", name)
        except BaseException:
            pass
    try:
        data = encode_result(payload)
        while data:
            data = data[os.write(fd, data):]
        for h in logging.getLogger("slurm_coloc").handlers:
            h.flush()
    finally:
        os._exit(0)


def _read_answer(r: int, deadline: float) -> Tuple[List[bytes], bool]:
    """``(chunks, killed)`` from pipe ``r`` (closed on return), read until EOF or ``deadline`` (monotonic s).
    ``killed``: the deadline passed first (the child is to be killed)."""
    chunks: List[bytes] = []
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return chunks, True
            ready, _, _ = select.select([r], [], [], left)
            if ready:
                chunk = os.read(r, 65536)
                if not chunk:
                    return chunks, False
                chunks.append(chunk)
    finally:
        os.close(r)


def _reap(pid: int, killed: bool) -> None:
    """SIGKILL the child's process group (else the child) when ``killed``, then wait for it. Never raises."""
    if killed:
        for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
            try:
                target()
            except OSError:
                pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def run_bounded(fn: HookFn, ctx: HookContext, cfg: config_mod.Config, env: Dict[str, str],
                name: str = "hook", state: Optional[Dict[str, Any]] = None) -> tuple:
    """Run ``fn(ctx, cfg, env)`` in a forked child; ``(ok, detail, result)``. Bounded by ``hook_timeout_s``
    (soft, SIGALRM in the child) and ``hook_timeout_s + KILL_GRACE_S`` (hard: SIGKILL of its process group).
    ``detail``: the hook's dict (or ``{"error": ...}``); ``result``: its list (TaskProlog lines) or None.
    ``state["child"]`` holds the child's pid while it runs. Never raises (``HookTerminated`` passes;
    ``state["child"]`` then names the child to kill)."""
    # the child must never see our handler
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        r, w = os.pipe()
        pid = os.fork()
    except OSError as exc:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        return False, {"error": f"cannot fork the hook: {exc}"}, None
    if pid == 0:  # pragma: no cover - the child (measured through the parent)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        os.close(r)
        _child(fn, ctx, cfg, env, name, w)
    if state is not None:
        state["child"] = pid
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # a SIGTERM that came meanwhile is delivered here
    os.close(w)
    chunks, killed = _read_answer(r, time.monotonic() + cfg.hook_timeout_s + KILL_GRACE_S)
    _reap(pid, killed)
    if state is not None:
        state["child"] = None
    if killed:
        return False, {"error": f"killed after {cfg.hook_timeout_s + KILL_GRACE_S:g} s (stuck where the "
                                "alarm cannot reach: C code such as NVML or a SQLite wait)"}, None
    return decode_answer(chunks)


def bound_s(cfg: config_mod.Config) -> float:
    """The most seconds one hook process takes (module docstring): own work + kill grace + recording. Pure,
    never raises."""
    return cfg.hook_timeout_s + KILL_GRACE_S + RECORD_BUDGET_S + min(cfg.db_busy_timeout_s, RECORD_BUSY_S)
