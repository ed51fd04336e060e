"""Running a hook safely: bounded time, every error caught and logged, a record per run, exit 0.

A Prolog or Epilog that exits non-zero drains the node (facts §5); ours never does because of our own bug or a
broken environment (docs/reliability.md has the fault campaign). The shim in prolog_epilog/ adds an outer
``timeout``.

Time bound of one hook process (``bound_s``): the hook's own work runs in a forked child with ``hook_timeout_s``
(SIGALRM inside it, so Python-level waits end cleanly and kill their subprocesses); a child stuck in C code that the
alarm cannot interrupt (an NVML call that hangs, a long SQLite busy wait) is SIGKILLed, with its process group,
``KILL_GRACE_S`` later. The parent, which never touches NVML, MPS or Slurm, then records the run within
``RECORD_BUDGET_S`` (busy waits capped at ``RECORD_BUSY_S``). Defaults: 20 + 1 + 3 + 1 = 25 s, under the shim's 30 s.

What a failed hook would have recorded is never dropped: a minimal row built from the hook's environment (job
start/end, submission, the hook run with its error) goes to the database at once, or, when the database is
unusable (locked past the budget, full filesystem, corrupt, missing config), to the root-only spool
(store/spool.py), replayed by the next hook that can open that database.
"""
from __future__ import annotations

import json
import logging
import logging.handlers
import os
import select
import signal
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional

from slurm_coloc import config as config_mod
from slurm_coloc.errors import ColocError
from slurm_coloc.hooks import ctld, node
from slurm_coloc.hooks.context import HookContext
from slurm_coloc.hooks.state import infer_final_state
from slurm_coloc.store import spool
from slurm_coloc.store.db import open_ctld_db, open_node_db
from slurm_coloc.submit.plan import parse_comment

log = logging.getLogger("slurm_coloc.hooks")

HookFn = Callable[[HookContext, config_mod.Config, Dict[str, str]], Any]
HOOKS: Dict[str, HookFn] = {
    "prolog-slurmctld": ctld.prolog_slurmctld,
    "epilog-slurmctld": ctld.epilog_slurmctld,
    "prolog": node.prolog,
    "epilog": node.epilog,
    "task-prolog": node.task_prolog,
}
NODE_HOOKS = ("prolog", "epilog")
CTLD_HOOKS = ("prolog-slurmctld", "epilog-slurmctld")
RECORD_BUSY_S = 1.0  # busy timeout while recording the run (capped by db_busy_timeout_s)
RECORD_BUDGET_S = 3.0  # SIGALRM bound of the recording phase (record + fallback rows + spool replay)
REPLAY_BUDGET_S = 1.0
KILL_GRACE_S = 1.0  # after hook_timeout_s, a child that did not end by itself is SIGKILLed
MAX_RESULT_BYTES = 1 << 20


class HookTimeout(BaseException):
    """Raised by SIGALRM when a hook's own work exceeds ``hook_timeout_s``.

    A BaseException (like KeyboardInterrupt) so that the broad ``except Exception`` of code that must not fail
    the job (MPS start, OOM handling) does not swallow the timeout and carry on past the budget.
    """


def _on_alarm(signum: int, frame: Any) -> None:
    raise HookTimeout()


def _setup_logging(cfg: config_mod.Config, job_id: Optional[int], create_dir: bool = True) -> None:
    """Log to ``<log_dir>/hooks.log``; else syslog (hooks' stderr goes nowhere); else stderr."""
    level = os.environ.get("COLOC_LOG_LEVEL", "INFO").upper()
    fmt = f"%(asctime)s %(levelname)s coloc[{job_id}] %(message)s"
    handler: logging.Handler
    try:
        if create_dir:
            Path(cfg.log_dir).mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(Path(cfg.log_dir) / "hooks.log")
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


def spool_dirs(cfg: config_mod.Config) -> List[Path]:
    """Where pending records wait: ``<run_dir>/spool`` first, ``<state_dir>/spool`` when that cannot be written."""
    return [Path(cfg.run_dir) / "spool", Path(cfg.state_dir) / "spool"]


def _target(name: str, ctx: HookContext) -> Optional[str]:
    if name in NODE_HOOKS and ctx.node:
        return f"node:{ctx.node}"
    if name in CTLD_HOOKS:
        return "ctld"
    return None


def _open_target(target: str, cfg: config_mod.Config, busy_s: float) -> Any:
    if target == "ctld":
        return open_ctld_db(cfg.ctld_db_path, busy_s)
    return open_node_db(cfg.node_db_path(target.split(":", 1)[1]), busy_s)


def record_ops(name: str, ctx: HookContext, ok: bool, detail: Dict[str, Any], started_ts: float,
               duration_ms: float) -> List[Dict[str, Any]]:
    """The rows a hook run must leave (spool op format, store/spool.py), built from its environment only.

    A successful node hook leaves its ``hook_runs`` row (its own work recorded the rest). A failed hook also
    leaves the minimal job row it may not have written: start/end on the node (Prolog/Epilog), submission/end in
    the controller DB (PrologSlurmctld/EpilogSlurmctld, as a ``hook-error`` event too). Pure.
    """
    now = started_ts + duration_ms / 1000
    ops: List[Dict[str, Any]] = []
    detail_json = json.dumps(detail, sort_keys=True, default=str)
    if name in NODE_HOOKS:
        ops.append({"op": "hook_run", "row": {"job_id": ctx.job_id, "node": ctx.node, "hook": name,
                                              "ts": started_ts, "duration_ms": duration_ms, "ok": int(ok),
                                              "detail_json": detail_json}})
        if not ok and name == "prolog":
            ops.append({"op": "job_start", "row": {"job_id": ctx.job_id, "node": ctx.node,
                                                   "user_name": ctx.user_name, "uid": ctx.uid,
                                                   "gpus": ",".join(str(g) for g in ctx.gpus),
                                                   "start_ts": started_ts}})
        elif not ok and name == "epilog":
            ops.append({"op": "job_end", "row": {
                "job_id": ctx.job_id, "node": ctx.node, "end_ts": now, "exit_code": ctx.exit_code,
                "signal": ctx.signal, "state": infer_final_state("", ctx.exit_code, ctx.signal, None, None)}})
    elif name in CTLD_HOOKS and not ok:
        ops.append({"op": "event", "row": {"ts": now, "job_id": ctx.job_id, "kind": "hook-error",
                                           "detail_json": json.dumps({"hook": name, **detail}, sort_keys=True,
                                                                     default=str)}})
        if name == "prolog-slurmctld":
            coloc = ctld._clean_coloc(parse_comment(ctx.comment))
            ops.append({"op": "submission", "row": {
                "job_id": ctx.job_id, "user_name": ctx.user_name, "uid": ctx.uid, "job_name": ctx.job_name,
                "partition": ctx.partition, "estimate_mib": coloc.get("mem_mib"),
                "shards_req": coloc.get("shards"), "estimate_method": coloc.get("method"),
                "script_sha256": coloc.get("sha256"), "updated_ts": now,
                "coloc_json": json.dumps(coloc, sort_keys=True) if coloc else None}})
        else:
            ops.append({"op": "ctld_end", "row": {
                "job_id": ctx.job_id, "end_ts": now, "exit_code": ctx.exit_code, "signal": ctx.signal,
                "state": infer_final_state("", ctx.exit_code, ctx.signal, None, None), "updated_ts": now}})
    return ops


def _spool(cfg: config_mod.Config, target: str, ops: List[Dict[str, Any]]) -> None:
    for d in spool_dirs(cfg):
        try:
            path = spool.write_entry(d, target, ops)
            log.warning("database unusable: %d record(s) spooled to %s, replayed by the next hook", len(ops), path)
            return
        except ColocError as exc:
            log.error("cannot spool to %s: %s", d, exc.one_line())
    log.error("RECORDS LOST (no database, no spool): %s", json.dumps(ops, default=str))


def _record(name: str, ctx: HookContext, cfg: config_mod.Config, ok: bool, detail: Dict[str, Any],
            started_ts: float, duration_ms: float) -> None:
    """Write this run's records and replay pending ones; spool them when the database is unusable. Never raises."""
    target = _target(name, ctx)
    if target is None:
        return
    ops = record_ops(name, ctx, ok, detail, started_ts, duration_ms)
    busy_s = min(cfg.db_busy_timeout_s, RECORD_BUSY_S)
    try:
        db = _open_target(target, cfg, busy_s)
        if ops:
            spool.apply_ops(db, ops)
        ops = []
        for d in spool_dirs(cfg):
            n = spool.replay(d, target, db, budget_s=REPLAY_BUDGET_S)
            if n:
                log.info("replayed %d spooled record set(s) from %s into %s", n, d, target)
    except HookTimeout:
        log.error("%s: recording timed out after %g s", name, RECORD_BUDGET_S)
    except Exception as exc:  # noqa: BLE001 - a hook must never fail the node
        log.error("%s: cannot record the hook run: %s", name, exc)
    if ops:
        _spool(cfg, target, ops)


def _load_config(name: str, ctx: HookContext, env: Dict[str, str]) -> Optional[config_mod.Config]:
    """The config, or None after logging (and recording where possible) why it cannot be loaded."""
    try:
        return config_mod.load(environ=env)
    except ColocError as exc:
        fallback = config_mod.load_fallback(environ=env)
        _setup_logging(fallback, ctx.job_id, create_dir=False)
        log.error("%s: config unusable, hook skipped (job runs without slurm-coloc): %s", name, exc.one_line())
        if fallback.state_dir != config_mod.Config().state_dir or os.path.isdir(fallback.state_dir):
            _bounded(lambda: _record(name, ctx, fallback, False, {"error": exc.one_line()}, time.time(), 0.0),
                     RECORD_BUDGET_S)
        return None


def _bounded(fn: Callable[[], Any], seconds: float) -> None:
    old = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        fn()
    except HookTimeout:
        log.error("recording timed out after %g s", seconds)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_hook(name: str, environ: Optional[Mapping[str, str]] = None) -> List[str]:
    """Run hook ``name`` for the job in ``environ``; return lines to print (TaskProlog only). Never raises.

    Args:
        name: one of ``HOOKS``.
        environ: the hook's environment (default ``os.environ``).
    """
    env = dict(os.environ if environ is None else environ)
    t0, started_ts = time.monotonic(), time.time()
    ctx = HookContext.from_env(env)
    cfg = _load_config(name, ctx, env)
    if cfg is None:
        log.info("%s done in %.0f ms (config unusable)", name, (time.monotonic() - t0) * 1000)
        return []
    _setup_logging(cfg, ctx.job_id)
    if name not in HOOKS or ctx.job_id is None:
        log.error("%s: unknown hook or no SLURM_JOB_ID", name)
        return []
    ok, detail, result = run_bounded(HOOKS[name], ctx, cfg, env, name)
    duration_ms = (time.monotonic() - t0) * 1000
    level = logging.INFO if ok else logging.ERROR
    log.log(level, "%s %s in %.0f ms: %s", name, "ok" if ok else "FAILED", duration_ms, detail)
    if name != "task-prolog":
        _bounded(lambda: _record(name, ctx, cfg, ok, detail, started_ts, duration_ms), RECORD_BUDGET_S)
        result = None
    log.info("%s done in %.0f ms (bound %.0f ms)", name, (time.monotonic() - t0) * 1000, bound_s(cfg) * 1000)
    return result if ok and isinstance(result, list) else []


def _child(fn: HookFn, ctx: HookContext, cfg: config_mod.Config, env: Dict[str, str], name: str, fd: int) -> None:
    """In the forked child: run the hook under SIGALRM, write ``{"ok", "detail", "result"}`` JSON to ``fd``, exit."""
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
    except BaseException as exc:  # noqa: BLE001 - our bug must not drain the node
        payload = {"ok": False, "detail": {"error": f"{type(exc).__name__}: {exc}"}}
        try:
            log.exception("%s: internal error", name)
        except BaseException:  # noqa: BLE001
            pass
    try:
        data = json.dumps(payload, default=str).encode()[:MAX_RESULT_BYTES]
        while data:
            data = data[os.write(fd, data):]
        for h in logging.getLogger("slurm_coloc").handlers:
            h.flush()
    finally:
        os._exit(0)


def run_bounded(fn: HookFn, ctx: HookContext, cfg: config_mod.Config, env: Dict[str, str],
                name: str = "hook") -> tuple:
    """Run ``fn(ctx, cfg, env)`` in a forked child bounded by ``hook_timeout_s`` (soft, SIGALRM in the child) and
    ``hook_timeout_s + KILL_GRACE_S`` (hard: SIGKILL of the child's process group).

    Returns:
        ``(ok, detail, result)``: ``detail`` the hook's dict (or ``{"error": ...}``), ``result`` its list (TaskProlog
        lines) or None. Never raises.
    """
    try:
        r, w = os.pipe()
        pid = os.fork()
    except OSError as exc:
        return False, {"error": f"cannot fork the hook: {exc}"}, None
    if pid == 0:  # pragma: no cover - the child (measured through the parent)
        os.close(r)
        _child(fn, ctx, cfg, env, name, w)
    os.close(w)
    deadline = time.monotonic() + cfg.hook_timeout_s + KILL_GRACE_S
    chunks: List[bytes] = []
    killed = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                killed = True
                break
            ready, _, _ = select.select([r], [], [], left)
            if ready:
                chunk = os.read(r, 65536)
                if not chunk:
                    break
                chunks.append(chunk)
    finally:
        os.close(r)
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
    if killed:
        return False, {"error": f"killed after {cfg.hook_timeout_s + KILL_GRACE_S:g} s (stuck where the alarm "
                                f"cannot reach: C code such as NVML or a SQLite wait)"}, None
    try:
        payload = json.loads(b"".join(chunks).decode())
        return bool(payload["ok"]), dict(payload.get("detail") or {}), payload.get("result")
    except (ValueError, KeyError, TypeError, AttributeError):
        return False, {"error": "the hook's child ended without a result (crashed?)"}, None


def bound_s(cfg: config_mod.Config) -> float:
    """The most seconds one hook process takes (module docstring): own work + kill grace + recording."""
    return cfg.hook_timeout_s + KILL_GRACE_S + RECORD_BUDGET_S + min(cfg.db_busy_timeout_s, RECORD_BUSY_S)
