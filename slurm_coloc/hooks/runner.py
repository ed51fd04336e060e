"""Running a hook safely: bounded time, every error caught and logged, a row per run, exit 0.

A Prolog or Epilog that exits non-zero drains the node (facts §5); ours never does because of our
own bug. The shim in prolog_epilog/ adds an outer ``timeout``.
"""
from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional

from slurm_coloc import config as config_mod
from slurm_coloc.errors import ColocError
from slurm_coloc.hooks import ctld, node
from slurm_coloc.hooks.context import HookContext
from slurm_coloc.store import jobs as store_jobs
from slurm_coloc.store.db import open_ctld_db, open_node_db

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


class HookTimeout(Exception):
    """Raised by SIGALRM when a hook's own work exceeds ``hook_timeout_s``."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise HookTimeout()


def _setup_logging(cfg: Optional[config_mod.Config], job_id: Optional[int]) -> None:
    level = os.environ.get("COLOC_LOG_LEVEL", "INFO").upper()
    fmt = f"%(asctime)s %(levelname)s coloc[{job_id}] %(message)s"
    handler: logging.Handler
    try:
        if cfg is None:
            raise OSError("no config")
        Path(cfg.log_dir).mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(Path(cfg.log_dir) / "hooks.log")
    except OSError:
        handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(fmt))
    root = logging.getLogger("slurm_coloc")
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level, logging.INFO))


def _record_run(name: str, ctx: HookContext, cfg: config_mod.Config, t0: float, ok: bool,
                detail: Dict[str, Any]) -> None:
    """Append the hook_runs row (node hooks) or an event (controller hooks); failures only logged."""
    try:
        run = store_jobs.HookRun(job_id=ctx.job_id, node=ctx.node, hook=name, ts=time.time(),
                                 duration_ms=(time.monotonic() - t0) * 1000, ok=ok, detail=detail)
        if name in NODE_HOOKS and ctx.node:
            store_jobs.record_hook_run(open_node_db(cfg.node_db_path(ctx.node), cfg.db_busy_timeout_s), run)
        elif not ok:
            store_jobs.record_event(open_ctld_db(cfg.ctld_db_path, cfg.db_busy_timeout_s), ctx.job_id,
                                    "hook-error", {"hook": name, **detail})
    except Exception as exc:  # noqa: BLE001 - a hook must never fail the node
        log.error("%s: cannot record the hook run: %s", name, exc)


def run_hook(name: str, environ: Optional[Mapping[str, str]] = None) -> List[str]:
    """Run hook ``name`` for the job in ``environ``; return lines to print (TaskProlog only). Never raises.

    Args:
        name: one of ``HOOKS``.
        environ: the hook's environment (default ``os.environ``).
    """
    env = dict(os.environ if environ is None else environ)
    t0 = time.monotonic()
    ctx = HookContext.from_env(env)
    cfg: Optional[config_mod.Config] = None
    try:
        cfg = config_mod.load(environ=env)
    except ColocError as exc:
        _setup_logging(None, ctx.job_id)
        log.error("%s: %s", name, exc.one_line())
        return []
    _setup_logging(cfg, ctx.job_id)
    if name not in HOOKS or ctx.job_id is None:
        log.error("%s: unknown hook or no SLURM_JOB_ID", name)
        return []
    old = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, cfg.hook_timeout_s)
    result: Any = None
    ok, detail = True, {}
    try:
        result = HOOKS[name](ctx, cfg, env)
        detail = result if isinstance(result, dict) else {}
    except HookTimeout:
        ok, detail = False, {"error": f"timed out after {cfg.hook_timeout_s:g} s"}
    except ColocError as exc:
        ok, detail = False, {"error": exc.one_line()}
    except Exception as exc:  # noqa: BLE001 - our bug must not drain the node
        ok, detail = False, {"error": f"{type(exc).__name__}: {exc}"}
        log.exception("%s: internal error", name)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    level = logging.INFO if ok else logging.ERROR
    log.log(level, "%s %s in %.0f ms: %s", name, "ok" if ok else "FAILED", (time.monotonic() - t0) * 1000, detail)
    if name != "task-prolog":
        _record_run(name, ctx, cfg, t0, ok, detail)
        return []
    return result if ok and isinstance(result, list) else []
