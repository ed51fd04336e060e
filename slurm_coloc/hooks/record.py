"""What a hook run leaves behind: its rows in the database, or in the recovery queue when it is unusable.
``record_ops`` builds a run's rows from its environment alone (a record set, store/recordset.py).
``record_run`` writes them and then replays the recovery queue (store/queue.py) of the same database within
the recording budget; ``enqueue_ops`` queues them when they could not be written. ``recovered_ops`` builds the
rows of a run that could not record at all from the environment it left (hooks/pending.py)."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from sqlite_utils import Database

from slurm_coloc import config as config_mod
from slurm_coloc.comment import JobComment
from slurm_coloc.errors import ColocError
from slurm_coloc.hooks import ctld, pending
from slurm_coloc.hooks.context import HookContext, infer_final_state
from slurm_coloc.store import queue, recordset
from slurm_coloc.store.db import open_ctld_db, open_node_db

log = logging.getLogger("slurm_coloc.hooks")

NODE_HOOKS = ("prolog", "epilog")
CTLD_HOOKS = ("prolog-slurmctld", "epilog-slurmctld")
RECORD_BUSY_S = 1.0  # busy timeout while recording the run (capped by db_busy_timeout_s)
RECORD_BUDGET_S = 3.0  # SIGALRM bound of the recording phase (the run's rows + the queue's replay)
REPLAY_BUDGET_S = 2.0  # the queue's replay, all directories and kinds together
REPLAY_MARGIN_S = 0.25  # the replay starts no entry later than this before the recording alarm


class HookTimeout(BaseException):
    """SIGALRM: a hook's own work exceeded ``hook_timeout_s``. A BaseException, so the ``except Exception`` of
    code that must not fail the job (MPS start, OOM handling) does not swallow it."""


class HookTerminated(BaseException):
    """SIGTERM in the hook's main process: the shim's outer ``timeout``, or a Slurm daemon stopping."""


def spool_dirs(cfg: config_mod.Config) -> List[str]:
    """Spool directories for an unusable database, in order: ``<run_dir>/spool``, ``<state_dir>/spool``. Pure,
    never raises."""
    return [str(Path(cfg.run_dir) / "spool"), str(Path(cfg.state_dir) / "spool")]


def queue_dirs(cfg: config_mod.Config, env: Mapping[str, str]) -> List[str]:
    """Every recovery-queue directory a run replays, in order: the spool directories, then the pending one.
    Never raises."""
    return spool_dirs(cfg) + [pending.pending_dir(env)]


def target_of(name: str, ctx: HookContext) -> Optional[str]:
    """The database hook ``name`` records into: ``node:<node>`` (Prolog/Epilog) or ``ctld``. None: a hook that
    records nothing (TaskProlog), or a node hook without a node name."""
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
    """The rows a hook run must leave (``{"op", "row"[, "once"]}``, store/recordset.py), from its environment
    (pure). A successful node hook leaves its ``hook_runs`` row; a failed hook also the minimal job row it may
    not have written (node start/end; controller submission/end and a ``hook-error`` event). Appended rows
    carry a ``once`` window of their timestamp and the other ops only fill what is absent or NULL, so applying
    them twice leaves what once does. ``started_ts`` in Unix s; the end is ``started_ts + duration_ms /
    1000``."""
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
            coloc = JobComment.read(ctx.comment, ctx.job_id)
            ops.append({"op": "submission", "row": {
                "job_id": ctx.job_id, "user_name": ctx.user_name, "uid": ctx.uid, "job_name": ctx.job_name,
                "partition": ctx.partition, "estimate_mib": coloc.mem_mib,
                "estimate_method": coloc.method,  # no shards_req: only Slurm's GRES (hooks/ctld.py) is one,
                # never the comment's claim; left NULL, the report takes the node's record of the job
                "updated_ts": now,  # script_sha256: only root's hash of Slurm's copy (hooks/ctld.py)
                "coloc_json": ctld.coloc_record(coloc)[0]}})
        else:
            ops.append({"op": "ctld_end", "row": {
                "job_id": ctx.job_id, "end_ts": now, "exit_code": ctx.exit_code, "signal": ctx.signal,
                "state": infer_final_state("", ctx.exit_code, ctx.signal, None, None), "updated_ts": now}})
    return ops


def enqueue_ops(cfg: config_mod.Config, target: str, ops: List[Dict[str, Any]]) -> None:
    """Queue a run's record set in the first of ``spool_dirs`` that takes it; log where, or log the rows.
    Never raises ``ColocError`` (a directory that refuses the entry is logged and the next is tried)."""
    data = recordset.encode(target, ops)
    for d in spool_dirs(cfg):
        try:
            path = queue.write(d, recordset.entry_name(), data)
            log.warning("database unusable: %d record(s) spooled to %s, replayed by the next hook", len(ops),
                        path)
            return
        except ColocError as exc:
            log.error("cannot spool to %s: %s", d, exc.one_line())
    log.error("RECORDS LOST (no database, no spool): %s", json.dumps(ops, default=str))


def recovered_ops(env: Mapping[str, str], started_ts: float, ended_ts: float) -> Tuple[str,
                                                                                       List[Dict[str, Any]]]:
    """``(target, ops)`` of a pending entry's run (hooks/pending.py): ``record_ops`` of a failed run, marked
    recovered, each ``once`` window the run's span (Unix s) widened by 1 s. Raises queue.EntryError (no job or
    database named), KeyError (no ``COLOC_PENDING_HOOK``)."""
    name = env["COLOC_PENDING_HOOK"]
    ctx = HookContext.from_env(env)
    target = target_of(name, ctx)
    if ctx.job_id is None or target is None:
        raise queue.EntryError("no SLURM_JOB_ID or SLURMD_NODENAME")
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


def replay_queue(target: str, db: Database, directories: Sequence[str], config_path: str,
                 budget_s: float = REPLAY_BUDGET_S, max_entries: int = queue.MAX_REPLAY) -> int:
    """Apply the recovery queue's entries of ``target`` to ``db`` (``queue.replay``); how many were applied.
    Record sets (``.json``) first, then pending environments (``.env``) of the same ``config_path``, each in
    one transaction; another database's or cluster's are left; an unusable entry is set aside (``.bad``,
    logged). ``budget_s`` in s. The database's own failure (``recordset.store_unusable``) or ``HookTimeout``
    stops the replay, the entry put back, and propagates."""
    def decode(entry: queue.Entry) -> Optional[Tuple[List[Dict[str, Any]], str]]:
        """``(ops, what to log once applied)``, or None for another database's or cluster's entry. Raises
        queue.EntryError, ValueError (an undecodable entry (``queue.replay`` sets it aside))."""
        if entry.kind == recordset.SUFFIX:
            entry_target, ops = recordset.decode(entry.data)
            return (ops, "") if entry_target == target else None
        env = pending.decode(entry.data)
        if env.get("COLOC_CONFIG", "") != config_path:
            return None  # another cluster's entry sharing the directory
        entry_target, ops = recovered_ops(env, *pending.times_of(env, entry.mtime))
        note = (f"{env['COLOC_PENDING_HOOK']} of job {env.get('SLURM_JOB_ID')} (rc "
                f"{env.get('COLOC_PENDING_RC')}) "
                f"recorded from its pending entry {os.path.join(os.path.dirname(entry.path), entry.name)} "
                f"({len(ops)} row(s))")
        return (ops, note) if entry_target == target else None

    def apply(entry: queue.Entry, item: Tuple[List[Dict[str, Any]], str]) -> None:
        """Apply one decoded entry's ops to ``db`` in one transaction and log its note."""
        recordset.apply_ops(db, item[0])
        if item[1]:
            log.warning("%s", item[1])

    return queue.replay(directories, (recordset.SUFFIX, pending.SUFFIX), decode, apply,
                        recordset.store_unusable, budget_s, max_entries)


def record_run(name: str, target: str, cfg: config_mod.Config, ops: List[Dict[str, Any]],
               state: Dict[str, Any], env: Optional[Mapping[str, str]] = None) -> None:
    """Write ``ops`` to ``target``'s database, then replay its recovery queue until ``REPLAY_MARGIN_S`` before
    the recording alarm (``REPLAY_BUDGET_S`` at most). ``state["recorded"]`` turns True once the rows are
    committed; else the caller (``runner.record_bounded``) queues them. The connection is closed with SIGALRM
    held, rolling back a transaction the alarm left open (its write lock would block the next opener). Errors
    are logged; only ``HookTerminated`` and the alarm's ``HookTimeout`` pass."""

    t0 = time.monotonic()
    busy_s = min(cfg.db_busy_timeout_s, RECORD_BUSY_S)
    env = os.environ if env is None else env
    db = None
    try:
        db = _open_target(target, cfg, busy_s)
        if ops:
            recordset.apply_ops(db, ops)
        state["recorded"] = True
        budget = min(REPLAY_BUDGET_S, RECORD_BUDGET_S - REPLAY_MARGIN_S - (time.monotonic() - t0))
        n = replay_queue(target, db, queue_dirs(cfg, env), env.get("COLOC_CONFIG", ""), budget)
        if n:
            log.info("replayed %d queued entr%s into %s", n, "y" if n == 1 else "ies", target)
    except HookTimeout:
        log.error("%s: recording timed out after %g s", name, RECORD_BUDGET_S)
    except Exception as exc:  # a hook must never fail the node
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
