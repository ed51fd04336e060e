"""What a hook run leaves behind: its rows in the database, or in the root-only spool when the database is unusable.

Split from hooks/runner.py (which runs the hook): ``record_ops`` builds the rows from the hook's environment only,
``record_run`` writes them (and replays pending spool entries) within the recording budget, ``spool_ops`` keeps them
when the database cannot be used (store/spool.py). ``replay_pending`` records the runs that could not record at
all (killed during start-up, crashed) from the environments they left (hooks/pending.py), with the same builder.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sqlite3
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional

from slurm_coloc import config as config_mod
from slurm_coloc.errors import ColocError
from slurm_coloc.hooks import ctld, pending
from slurm_coloc.hooks.context import HookContext
from slurm_coloc.hooks.state import infer_final_state
from slurm_coloc.store import claims, spool
from slurm_coloc.store.db import open_ctld_db, open_node_db
from slurm_coloc.comment import parse_comment

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

    Appended rows carry a ``once`` window of their own timestamp (store/spool.py), and the other ops only insert
    what is absent or fill what is NULL, so applying the same ops twice leaves what applying them once does: a run
    whose recording was cut off after the commit (the recording alarm) and that spooled its ops anyway, or a spool
    entry taken again after its replayer died, adds no second row (a duplicate Epilog row seen under load).
    """
    now = started_ts + duration_ms / 1000
    ops: List[Dict[str, Any]] = []
    detail_json = json.dumps(detail, sort_keys=True, default=str)
    if name in NODE_HOOKS:
        ops.append({"op": "hook_run", "row": {"job_id": ctx.job_id, "node": ctx.node, "hook": name,
                                              "ts": started_ts, "duration_ms": duration_ms, "ok": int(ok),
                                              "detail_json": detail_json}, "once": [started_ts, started_ts]})
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
                                                                     default=str)}, "once": [now, now]})
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


def recovered_ops(env: Mapping[str, str], started_ts: float, ended_ts: float) -> tuple:
    """``(target, ops)`` of a pending entry's run (hooks/pending.py): the rows of a failed run, built by
    ``record_ops`` from the captured environment with the captured times, marked as recovered, each append op
    with its ``once`` window. Raises PendingError when the entry names no job or database."""
    name = env["COLOC_PENDING_HOOK"]
    ctx = HookContext.from_env(env)
    target = target_of(name, ctx)
    if ctx.job_id is None or target is None:
        raise pending.PendingError("no SLURM_JOB_ID or SLURMD_NODENAME")
    reason = env.get("COLOC_PENDING_RC", "")
    why = ("terminated during start-up" if reason == "startup" else
           f"terminated by the shim's timeout (rc {reason})" if reason in ("124", "137", "143") else
           f"ended with rc {reason} before recording")
    detail = {"error": f"{why}; recorded later from its environment", "recovered": True}
    ops = record_ops(name, ctx, False, detail, started_ts, (ended_ts - started_ts) * 1000)
    for op in ops:
        if op["op"] in ("hook_run", "event"):
            op["once"] = [started_ts - 1.0, ended_ts + 1.0]
    return target, ops


def replay_pending(target: str, db: Any, env: Mapping[str, str], budget_s: float = REPLAY_BUDGET_S) -> int:
    """Apply the pending entries of ``target`` (same ``COLOC_CONFIG``) to ``db``, each in one transaction, then
    delete them; an unusable entry is renamed ``.bad`` and logged. Returns how many were applied. A database
    error (or the recording alarm) stops it and propagates; the claimed entry is put back."""
    import time

    d = pending.safe_dir(pending.pending_dir(env), create=False)
    if d is None:
        return 0
    t_end, done = time.monotonic() + budget_s, 0
    for path in pending.candidates(d):
        if time.monotonic() > t_end:
            break
        base = (os.path.join(os.path.dirname(path), claims.split_claim(os.path.basename(path))[0])
                if path.endswith(".replaying") else path)
        try:
            entry = pending.read_entry(path)
            if entry.get("COLOC_CONFIG", "") != env.get("COLOC_CONFIG", ""):
                continue  # another cluster's entry sharing the directory
            started, ended = pending.times_of(entry, os.lstat(path).st_mtime)
            entry_target, ops = recovered_ops(entry, started, ended)
        except FileNotFoundError:
            continue  # claimed by another replayer meanwhile
        except (pending.PendingError, OSError, KeyError, ValueError) as exc:
            log.error("pending hook entry %s is unusable (%s): set aside as .bad", base, exc)
            try:
                os.rename(path, base + ".bad")
            except OSError:
                pass
            continue
        if entry_target != target:
            continue
        claimed = claims.claim_name(base)
        try:
            os.rename(path, claimed)  # atomic claim: a second replayer misses it
            os.utime(claimed)
        except OSError:
            continue
        try:
            spool.apply_ops(db, ops)
        except (ValueError, KeyError, TypeError) as exc:
            log.error("pending hook entry %s is malformed (%s): set aside as .bad", base, exc)
            os.rename(claimed, base + ".bad")
            continue
        except BaseException:
            os.rename(claimed, base)
            raise
        os.unlink(claimed)
        log.warning("%s of job %s (rc %s) recorded from its pending entry %s (%d row(s))", entry["COLOC_PENDING_HOOK"],
                    entry.get("SLURM_JOB_ID"), entry.get("COLOC_PENDING_RC"), base, len(ops))
        done += 1
    return done


def record_run(name: str, target: str, cfg: config_mod.Config, ops: List[Dict[str, Any]],
               state: Dict[str, Any], env: Optional[Mapping[str, str]] = None) -> None:
    """Write this run's rows ``ops`` (``record_ops``) to ``target``'s database, then replay pending ones (spool
    entries and pending environments of runs that could not record, hooks/pending.py). Never raises (but
    ``HookTerminated`` passes, and the recording alarm's ``HookTimeout`` may).

    ``state["recorded"]`` turns True once the rows are committed; the caller (``runner.record_bounded``) spools
    them otherwise, after its alarm is disarmed. The connection is closed with SIGALRM held, which also rolls
    back a transaction the alarm left open (its write lock would block the next opener).
    """
    busy_s = min(cfg.db_busy_timeout_s, RECORD_BUSY_S)
    db = None
    try:
        db = _open_target(target, cfg, busy_s)
        if ops:
            spool.apply_ops(db, ops)
        state["recorded"] = True
        for d in spool_dirs(cfg):
            n = spool.replay(d, target, db, budget_s=REPLAY_BUDGET_S)
            if n:
                log.info("replayed %d spooled record set(s) from %s into %s", n, d, target)
        # after the spool: a run that spooled its rows and was then killed also left a pending environment,
        # whose rows (``once`` windows) then find the spooled ones and add nothing
        n = replay_pending(target, db, os.environ if env is None else env)
        if n:
            log.info("recorded %d run(s) from pending environments into %s", n, target)
    except HookTimeout:
        log.error("%s: recording timed out after %g s", name, RECORD_BUDGET_S)
    except Exception as exc:  # noqa: BLE001 - a hook must never fail the node
        log.error("%s: cannot record the hook run: %s", name, exc)
    finally:
        if db is not None:
            with _alarm_held(), contextlib.suppress(sqlite3.Error):
                db.conn.close()


@contextlib.contextmanager
def _alarm_held() -> Iterator[None]:
    """Hold SIGALRM back inside the block (a pending alarm is delivered at its end)."""
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    except (OSError, ValueError):  # not the main thread: nothing to hold back
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
