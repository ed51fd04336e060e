"""Who can read what, attacked as an ordinary user on the real cluster (docs/admin.md, "Who can read what").

- After colocuser2's jobs ran, colocuser cannot open the controller or node databases (sqlite3, Python, cat),
  nor their ``-wal``/``-shm`` files; ``coloc-report jobs --json`` as colocuser (answered by the reader
  service, ``coloc-report serve``) shows colocuser's own job and nothing of colocuser2's: no job id, name or
  SHA-256, whatever filters or raw requests colocuser sends.
- With ``admin_group`` set, members of that group read the databases directly and see every job.
- A database left 0644 by an older version is tightened at the next open by root.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import textwrap
from pathlib import Path

import pytest

from slurm_coloc.store.db import open_ctld_db, open_node_db
from tests.cluster.reliability.conftest import FaultCluster

pytestmark = pytest.mark.slurm  # starts a real Slurm cluster

PY = str(Path(__file__).resolve().parents[3] / ".venv" / "bin" / "python")
SECRET = "secret-name-of-colocuser2"


def _as(fc: FaultCluster, user: str, *cmd: str):
    return fc.c.run(list(cmd), user=user)


def _db_files(fc: FaultCluster):
    return [p for db in (fc.ctld_db, fc.node_db("n1")) for p in (db, Path(f"{db}-wal"), Path(f"{db}-shm"))
            if p.exists()]


@pytest.mark.slurm
def test_user_cannot_read_databases_and_report_shows_only_own_jobs(fc: FaultCluster) -> None:
    theirs_script = fc.script("priv-theirs.sh", "echo private >&2\n", mode=0o755)
    theirs = fc.run_job(theirs_script, "-J", SECRET, user="colocuser2")["job_id"]
    mine = fc.run_job(fc.script("priv-mine.sh"))["job_id"]
    sha_theirs = hashlib.sha256(theirs_script.read_bytes()).hexdigest()
    files = _db_files(fc)
    assert fc.ctld_db in files and fc.node_db("n1") in files
    for p in files:  # BASE_CONFIG has no admin_group: root only
        st = os.stat(p)
        assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o600, (p, oct(st.st_mode))
    sql = _as(fc, "colocuser", "sqlite3", str(fc.ctld_db), "SELECT job_name FROM jobs")
    assert sql.returncode != 0 and SECRET not in sql.stdout, sql
    for p in files:
        opened = _as(fc, "colocuser", PY, "-c", f"open({str(p)!r}, 'rb').read()")
        assert opened.returncode != 0 and "Permission denied" in opened.stderr, (p, opened.stderr)
    ro = _as(fc, "colocuser", PY, "-c", f"import sqlite3; sqlite3.connect('file:{fc.node_db('n1')}?mode=ro', "
                                        "uri=True).execute('SELECT * FROM job_runs').fetchall()")
    assert ro.returncode != 0, ro.stdout
    for extra in ([], ["--user", "colocuser2"], ["--job", str(theirs)],
                  ["--since", "30d", "--sort", "job_id"]):
        out = _as(fc, "colocuser", "coloc-report", "jobs", "--json", "--since", "1d", *extra)
        assert out.returncode == 0, out.stderr
        data = json.loads(out.stdout)
        ids = {j["job_id"] for j in data["jobs"]}
        assert theirs not in ids and SECRET not in out.stdout and sha_theirs not in out.stdout, (extra, ids)
        assert any("showing only colocuser's jobs" in p for p in data["problems"]), data["problems"]
        if not extra:
            assert mine in ids and {j["user"] for j in data["jobs"]} == {"colocuser"}
    for view in ("users", "gpus", "nodes", "cluster"):
        out = _as(fc, "colocuser", "coloc-report", view, "--json", "--since", "1d")
        assert out.returncode == 0 and "colocuser2" not in out.stdout and SECRET not in out.stdout, out
    table = _as(fc, "colocuser", "coloc-report", "--since", "1d")
    assert table.returncode == 0 and str(mine) in table.stdout and SECRET not in table.stdout, table
    # a hand-made request claiming another identity changes nothing: the reader takes the kernel's uid
    sock = fc.run_dir / "report.sock"
    raw = textwrap.dedent(f"""
        import json, socket
        s = socket.socket(socket.AF_UNIX); s.connect({str(sock)!r})
        s.sendall(json.dumps({{"view": "jobs", "uid": 0, "user": "root", "sees_all": True,
                              "users": ["colocuser2"], "job_ids": [{theirs}]}}).encode() + b"\\n")
        s.shutdown(socket.SHUT_WR); print(s.makefile().read())""")
    forged = _as(fc, "colocuser", PY, "-c", raw)
    assert forged.returncode == 0 and json.loads(forged.stdout)["ok"], forged
    assert json.loads(forged.stdout)["rows"] == [] and SECRET not in forged.stdout
    root = fc.c.run(["coloc-report", "jobs", "--json", "--since", "1d"], user=None)
    assert {mine, theirs} <= {j["job_id"] for j in json.loads(root.stdout)["jobs"]}  # root reads directly
    their_view = _as(fc, "colocuser2", "coloc-report", "jobs", "--json", "--since", "1d")
    assert theirs in {j["job_id"] for j in json.loads(their_view.stdout)["jobs"]}, their_view.stderr


@pytest.mark.slurm
def test_admin_group_reads_databases_directly(fc: FaultCluster) -> None:
    fc.set_config(admin_group="colocuser2")
    mine = fc.run_job(fc.script("adm-mine.sh"))["job_id"]  # its hooks open (and re-group) the databases
    gid = 2002
    for p in _db_files(fc):
        st = os.stat(p)
        assert st.st_gid == gid and stat.S_IMODE(st.st_mode) == 0o640, (p, oct(st.st_mode), st.st_gid)
    # group members can open the files: read-only and immutable, since a live WAL database's -shm (0640, as
    # SQLite copies the file's mode) is not theirs to write; committed rows not yet checkpointed reach them
    # via coloc-report
    direct = _as(fc, "colocuser2", "sqlite3", f"file:{fc.ctld_db}?immutable=1",
                 "SELECT count(*) FROM sqlite_master")
    assert direct.returncode == 0 and int(direct.stdout.strip()) > 0, direct
    seen = _as(fc, "colocuser2", "coloc-report", "jobs", "--json", "--since", "1d")
    assert mine in {j["job_id"] for j in json.loads(seen.stdout)["jobs"]}, seen.stderr
    denied = _as(fc, "colocuser", "sqlite3", str(fc.ctld_db), "SELECT count(*) FROM jobs")
    assert denied.returncode != 0, denied


def test_database_left_0644_is_tightened_at_next_root_open(tmp_path: Path) -> None:
    ctld, node = tmp_path / "ctld.db", tmp_path / "nodes" / "n1.db"
    for path, opener in ((ctld, open_ctld_db), (node, open_node_db)):
        db = opener(path, admin_group="")
        db.execute("CREATE TABLE IF NOT EXISTS t (x)")  # keep -wal/-shm open while we loosen them
        for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            os.chmod(p, 0o644)  # as an older version left them
        opener(path, admin_group="")
        for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            assert stat.S_IMODE(os.stat(p).st_mode) == 0o600, (p, oct(os.stat(p).st_mode))
        opener(path, admin_group="colocuser2")
        st = os.stat(path)
        assert stat.S_IMODE(st.st_mode) == 0o640 and st.st_gid == 2002
        db.conn.close()
    st = os.stat(node.parent)  # created by the opener (0700), then it follows admin_group
    assert stat.S_IMODE(st.st_mode) == 0o750 and st.st_gid == 2002
    shared = tmp_path / "shared"  # a directory the opener did not make is left as it is
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    open_ctld_db(shared / "ctld.db", admin_group="").conn.close()
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o755
    assert stat.S_IMODE(os.stat(shared / "ctld.db").st_mode) == 0o600
