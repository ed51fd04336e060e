"""Upgrades and downgrades: the first released schema (tests/data/schema_v1, committed as written then)
migrates to the current one with no row lost; a database from a newer version is refused; recovery-queue
entries written before the queue was merged (tests/data/queue_v1) replay to the rows the old code wrote from
them."""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Dict, List

import pytest

from slurm_coloc.config import Config
from slurm_coloc.errors import StoreError
from slurm_coloc.hooks.context import HookContext
from slurm_coloc.hooks.runner import record_bounded
from slurm_coloc.store import jobs as store_jobs
from slurm_coloc.store.db import open_ctld_db, open_node_db

V1 = Path(__file__).resolve().parents[1] / "data" / "schema_v1"
QUEUE_V1 = Path(__file__).resolve().parents[1] / "data" / "queue_v1"
VENV_BIN = Path(__file__).resolve().parents[2] / ".venv" / "bin"


def _dump(path: Path) -> Dict[str, List[dict]]:
    conn = sqlite3.connect(str(path))
    conn.row_factory = sqlite3.Row
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' "
                                         "AND name NOT LIKE 'sqlite_%' AND name != '_sqlite_migrations'")]
    out = {t: [dict(r) for r in conn.execute(f"SELECT * FROM [{t}] ORDER BY rowid")] for t in tables}
    conn.close()
    return out


def _columns(path: Path) -> Dict[str, set]:
    conn = sqlite3.connect(str(path))
    out = {t: {r[1] for r in conn.execute(f"PRAGMA table_info([{t}])")}
           for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE "
                                    "'sqlite_%'")}
    conn.close()
    return out


#: Values an upgrade clears on purpose: script hashes that came from the job's comment, which its user writes
#: (store/schema.py m004_root_script_identity); history starts again from root's own hash.
CLEARED = {("jobs", "script_sha256"), ("oom_events", "script_sha256")}


@pytest.mark.parametrize("name,opener", [("ctld.db", open_ctld_db), ("n1.db", open_node_db)])
def test_v1_database_upgrades_with_no_row_lost(tmp_path: Path, name: str, opener) -> None:
    src = V1 / name
    before = _dump(src)
    assert sum(len(v) for v in before.values()) >= 5, "the fixture holds realistic rows"
    copy = tmp_path / name
    shutil.copy(src, copy)
    db = opener(copy)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.conn.close()
    after = _dump(copy)
    for table, rows in before.items():  # every v1 row is still there, every v1 column value unchanged
        assert len(after[table]) == len(rows), table
        for old, new in zip(rows, after[table]):
            kept = {k: v for k, v in old.items() if (table, k) not in CLEARED}
            assert {k: new[k] for k in kept} == kept, (table, old, new)
            assert all(new[k] is None for t, k in CLEARED if t == table and k in old), (table, new)
    fresh = tmp_path / f"fresh-{name}"
    opener(fresh).conn.close()
    assert _columns(copy) == _columns(fresh), "the upgraded schema is the current schema"
    again = opener(copy)  # idempotent: a second open applies nothing
    assert _dump(copy) == after
    again.conn.close()


def test_upgraded_fixture_keeps_verbatim_strings(tmp_path: Path) -> None:
    shutil.copy(V1 / "ctld.db", tmp_path / "ctld.db")
    names = {j.job_id: j.job_name for j in store_jobs.load_jobs(open_ctld_db(tmp_path / "ctld.db"))}
    assert names[102] == "x'); DROP TABLE jobs;--" and names[103] == "bert-base ünïcode name"


def test_upgraded_fixture_is_reported(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "nodes").mkdir(parents=True)
    shutil.copy(V1 / "ctld.db", state / "ctld.db")
    shutil.copy(V1 / "n1.db", state / "nodes" / "n1.db")
    open_ctld_db(state / "ctld.db").conn.close()
    open_node_db(state / "nodes" / "n1.db").conn.close()
    env = {**os.environ, "COLOC_CONFIG": str(tmp_path / "none.yaml"), "COLOC_STATE_DIR": str(state)}
    (tmp_path / "none.yaml").write_text("{}\n")
    proc = subprocess.run([str(VENV_BIN / "coloc-report"), "jobs", "--json", "--since", "2026-01-01"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    ids = {j["job_id"] for j in json.loads(proc.stdout)["jobs"]}  # root: every user's jobs
    assert {101, 102, 103} <= ids


@pytest.mark.parametrize("name,opener,mset", [("ctld.db", open_ctld_db, "slurm_coloc.ctld"),
                                              ("n1.db", open_node_db, "slurm_coloc.node")])
def test_downgrade_is_refused_and_changes_nothing(tmp_path: Path, name: str, opener, mset: str) -> None:
    copy = tmp_path / name
    shutil.copy(V1 / name, copy)
    opener(copy).conn.close()
    conn = sqlite3.connect(str(copy))
    conn.execute("INSERT INTO _sqlite_migrations (migration_set, name, applied_at) VALUES (?, "
                 "'m900_from_v9', 'x')",
                 [mset])
    conn.commit()
    conn.close()
    before = copy.read_bytes()
    with pytest.raises(StoreError) as err:
        opener(copy)
    msg = err.value.one_line()
    assert "newer slurm-coloc" in msg and "m900_from_v9" in msg and "\n" not in msg
    assert copy.read_bytes() == before


def test_concurrent_first_opens_do_not_race(tmp_path: Path) -> None:
    """16 threads open the same new database at once (50 Prologs on a fresh node): every one succeeds."""
    path = tmp_path / "nodes" / "new.db"
    errors: list = []
    barrier = threading.Barrier(16)

    def go() -> None:
        barrier.wait()
        try:
            open_node_db(path, busy_timeout_s=10).conn.close()
        except Exception as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=go) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    conn = sqlite3.connect(str(path))
    names = [r[0] for r in conn.execute("SELECT name FROM _sqlite_migrations")]
    assert len(names) == len(set(names)) >= 3


def test_a_second_open_in_the_same_process_keeps_the_first_connections_locks(tmp_path: Path) -> None:
    """The sampler holds its connection while its watchdog opens the same node database in another thread;
    then a hook process opens and closes it. Closing a descriptor of the file would drop the sampler's POSIX
    locks, and the hook, taking itself for the last user, would delete ``-wal``/``-shm`` under the sampler
    (seen on the H200: watchdog events lost, "disk I/O error"). The sampler's rows must stay readable."""
    path = tmp_path / "nodes" / "n1.db"
    sampler = open_node_db(path)
    sampler.conn.execute("CREATE TABLE t(x)")
    sampler.conn.execute("INSERT INTO t VALUES (1)")
    watchdog = open_node_db(path)
    hook = ("import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
            "c.execute('SELECT count(*) FROM t').fetchone(); c.close()")
    subprocess.run([sys.executable, "-c", hook, str(path)], check=True, timeout=30)
    assert Path(f"{path}-wal").exists() and Path(f"{path}-shm").exists()
    sampler.conn.execute("INSERT INTO t VALUES (2)")
    watchdog.conn.execute("INSERT INTO t VALUES (3)")
    assert sqlite3.connect(str(path)).execute("SELECT count(*) FROM t").fetchone() == (3,)
    assert sorted(p.name for p in path.parent.iterdir()) == ["n1.db", "n1.db-shm", "n1.db-wal"]


def test_a_database_path_that_is_a_symbolic_link_is_refused(tmp_path: Path) -> None:
    """Root never opens a database through a link planted at its path: one StoreError line, the target
    untouched, no side file made beside it."""
    target = tmp_path / "elsewhere"
    target.write_text("not yours")
    (tmp_path / "nodes").mkdir()
    (tmp_path / "nodes" / "n1.db").symlink_to(target)
    with pytest.raises(StoreError, match="symbolic link"):
        open_node_db(tmp_path / "nodes" / "n1.db")
    assert target.read_text() == "not yours"
    assert sorted(p.name for p in (tmp_path / "nodes").iterdir()) == ["n1.db"]


def test_queue_entries_of_the_old_format_replay_after_upgrade(tmp_path: Path) -> None:
    """Spool record sets (``<run_dir>/spool/*.json``) and pending environments (``*.env``, from coloc-hook and
    from the shim) as the code before the merged queue wrote them are replayed by a new hook run's recording
    phase into the rows that code's replay wrote (``expected_rows.json``), each once, and leave nothing
    queued."""
    cfg = Config(state_dir=str(tmp_path / "state"), run_dir=str(tmp_path / "run"))
    pend = tmp_path / "pending"
    for src, dst in ((QUEUE_V1 / "spool", tmp_path / "run" / "spool"), (QUEUE_V1 / "pending", pend)):
        shutil.copytree(src, dst)
        os.chmod(dst, 0o700)
        for p in dst.iterdir():
            os.chmod(p, 0o600)
    env = {"COLOC_CONFIG": "/etc/slurm-coloc/coloc.yaml", "COLOC_PENDING_DIR": str(pend)}
    for job, hook, context, node in ((600, "prolog-slurmctld", "prolog_slurmctld", ""),
                                     (601, "prolog", "prolog_slurmd", "n1")):
        ctx = HookContext.from_env({"SLURM_JOB_ID": str(job), "SLURMD_NODENAME": node,
                                    "SLURM_SCRIPT_CONTEXT": context, **env})
        record_bounded(hook, ctx, cfg, True, {}, 1795600000.0, 5.0, {},
                       env)  # a new run: records, then replays
    assert sorted(os.listdir(tmp_path / "run" / "spool")) == [] and sorted(os.listdir(pend)) == []
    expected = json.loads((QUEUE_V1 / "expected_rows.json").read_text())
    got = {**{t: rows for t, rows in _dump(tmp_path / "state" / "ctld.db").items()
              if t in ("jobs", "events")},
           **{t: rows for t, rows in _dump(tmp_path / "state" / "nodes" / "n1.db").items()
              if t in ("hook_runs", "job_runs")}}
    got["hook_runs"] = [r for r in got["hook_runs"] if r["job_id"] != 601]  # the new run's own row
    for table, rows in expected.items():
        assert _without_ids(got[table]) == _without_ids(rows), table


def _without_ids(rows: List[dict]) -> List[dict]:
    """Rows without their ids, the columns added since (``state_source``) and the values the old code took
    from the job's comment (no longer trusted: the script hash, see ``CLEARED``, and a failed hook's shard
    count, which now comes only from Slurm's GRES), as sorted JSON strings."""
    skip = {"id", "state_source", "script_sha256", "shards_req"}
    return sorted((json.dumps({k: v for k, v in r.items() if k not in skip}, sort_keys=True) for r in rows))
