"""What a hook run leaves behind: its rows in the database, or in the root-only spool when the database is unusable.

Split from hooks/runner.py (which runs the hook): ``record_ops`` builds the rows from the hook's environment only,
``record_run`` writes them (and replays pending spool entries) within the recording budget, ``spool_ops`` keeps them
when the database cannot be used (store/spool.py).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Dict, List, Optional

from slurm_coloc import config as config_mod
from slurm_coloc.errors import ColocError
from slurm_coloc.hooks import ctld
from slurm_coloc.hooks.context import HookContext
from slurm_coloc.hooks.state import infer_final_state
from slurm_coloc.store import spool
from slurm_coloc.store.db import open_ctld_db, open_node_db
from slurm_coloc.submit.plan import parse_comment

log = logging.getLogger("slurm_coloc.hooks")

NODE_HOOKS = ("prolog", "epilog")
CTLD_HOOKS = ("prolog-slurmctld", "epilog-slurmctld")
RECORD_BUSY_S = 1.0  # busy timeout while recording the run (capped by db_busy_timeout_s)
RECORD_BUDGET_S = 3.0  # SIGALRM bound of the recording phase (record + fallback rows + spool replay)
REPLAY_BUDGET_S = 1.0


class HookTimeout(BaseException):
    """Raised by SIGALRM when a hook's own work exceeds ``hook_timeout_s``.

    A BaseException (like KeyboardInterrupt) so that the broad ``except Exception`` of code that must not fail
    the job (MPS start, OOM handling) does not swallow the timeout and carry on past the budget.
    """


class HookTerminated(BaseException):
    """Raised by SIGTERM in the hook's main process: the shim's outer ``timeout``, or a Slurm daemon stopping."""


def spool_dirs(cfg: config_mod.Config) -> List[Path]:
    """Where pending records wait: ``<run_dir>/spool`` first, ``<state_dir>/spool`` when that cannot be written."""
    return [Path(cfg.run_dir) / "spool", Path(cfg.state_dir) / "spool"]


def target_of(name: str, ctx: HookContext) -> Optional[str]:
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


def spool_ops(cfg: config_mod.Config, target: str, ops: List[Dict[str, Any]]) -> None:
    for d in spool_dirs(cfg):
        try:
            path = spool.write_entry(d, target, ops)
            log.warning("database unusable: %d record(s) spooled to %s, replayed by the next hook", len(ops), path)
            return
        except ColocError as exc:
            log.error("cannot spool to %s: %s", d, exc.one_line())
    log.error("RECORDS LOST (no database, no spool): %s", json.dumps(ops, default=str))


def record_run(name: str, ctx: HookContext, cfg: config_mod.Config, ok: bool, detail: Dict[str, Any],
            started_ts: float, duration_ms: float, state: Optional[Dict[str, Any]] = None) -> None:
    """Write this run's records and replay pending ones; spool them when the database is unusable. Never raises
    (but ``HookTerminated`` passes). ``state["recorded"]`` turns True once this run's rows are in the database."""
    target = target_of(name, ctx)
    if target is None:
        return
    ops = record_ops(name, ctx, ok, detail, started_ts, duration_ms)
    busy_s = min(cfg.db_busy_timeout_s, RECORD_BUSY_S)
    try:
        db = _open_target(target, cfg, busy_s)
        if ops:
            spool.apply_ops(db, ops)
        ops = []
        if state is not None:
            state["recorded"] = True
        for d in spool_dirs(cfg):
            n = spool.replay(d, target, db, budget_s=REPLAY_BUDGET_S)
            if n:
                log.info("replayed %d spooled record set(s) from %s into %s", n, d, target)
    except HookTimeout:
        log.error("%s: recording timed out after %g s", name, RECORD_BUDGET_S)
    except Exception as exc:  # noqa: BLE001 - a hook must never fail the node
        log.error("%s: cannot record the hook run: %s", name, exc)
    if ops:
        spool_ops(cfg, target, ops)
