"""Security list of the campaign, on the real cluster (docs/reliability.md, table "Security").

- Hooks never import user code: a job whose ``#COLOC`` model is a module that drops a marker when imported;
  the
  marker appears for the user's own coloc-sbatch (proof the module works) and never for uid 0, through the
  job, its OOM death and its rerun (every root hook ran).
- Databases, run and queue directories are root-owned and not writable by users; a planted queue directory
  symlink
  is refused, a user-owned or symlinked queue entry is set aside, never applied.
- A job named ``x'); DROP TABLE jobs;--`` is stored and reported verbatim.
- A user sees only their own jobs in coloc-report; root sees all.
- MPS pipe and log directories in per-user mode admit the job's user only; the daemon runs as that user.
Planted stderr symlinks (file and directory) are covered by tests/test_oom_cluster.py.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import time
from pathlib import Path

import pytest

from slurm_coloc.errors import StoreError
from slurm_coloc.hooks.record import replay_queue
from slurm_coloc.store import queue
from slurm_coloc.store.db import open_ctld_db
from tests.cluster.reliability.conftest import FaultCluster

pytestmark = pytest.mark.slurm
OOM_LINE = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
MARKER_MOD = """\
import os
from pathlib import Path
Path({markers!r}, f"imported-uid{{os.getuid()}}-pid{{os.getpid()}}").touch()
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3 * 8 * 8, 10)

    def forward(self, x):
        return self.fc(x.flatten(1))
"""
MARKER_JOB = """\
#!/bin/bash
#COLOC model=markermod.py:Net input=3x8x8 batch=2
# First run: die like a CUDA OOM (the EpilogSlurmctld reruns it on a whole GPU as root); the rerun succeeds.
if [ -e ran-once ]; then echo rerun-ok; exit 0; fi
touch ran-once
echo '{oom}' >&2
exit 1
"""


def _user_dir(fc: FaultCluster, name: str) -> Path:
    d = fc.c.jobs_dir / f"{name}-{os.getpid()}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    shutil.chown(d, "colocuser", "colocuser")
    return d


def test_hooks_never_import_the_users_model(fc: FaultCluster) -> None:
    markers = fc.c.dir / "markers"
    markers.mkdir(mode=0o777, exist_ok=True)
    os.chmod(markers, 0o1777)
    work = _user_dir(fc, "marker")
    (work / "markermod.py").write_text(MARKER_MOD.format(markers=str(markers)))
    (work / "job.sh").write_text(MARKER_JOB.format(oom=OOM_LINE))
    for p in work.iterdir():
        shutil.chown(p, "colocuser", "colocuser")
    proc = fc.c.run(["coloc-sbatch", "--parsable", "-w", "n1", "-t", "2", "-o", "out-%j.txt", "-e",
                     "err-%j.txt",
                     "job.sh"], cwd=work, timeout=300)
    assert proc.returncode == 0, proc.stderr
    job = int(proc.stdout.strip().split(";")[0])
    user_marks = sorted(p.name for p in markers.iterdir())
    assert any(m.startswith("imported-uid2001-") for m in user_marks), user_marks  # the marker works
    assert fc.c.wait_job(job, timeout=120)["job_state"] == "FAILED"
    deadline, retry = time.time() + 120, None
    while time.time() < deadline and retry is None:
        retry = next((j for j in fc.c.squeue() if f"oom-retry-of-{job}" in (j.get("comment") or "")), None)
        time.sleep(0.5)
    assert retry is not None, "the OOM death was rerun (EpilogSlurmctld, as root, read the job)"
    assert fc.c.wait_job(retry["job_id"], timeout=180)["job_state"] == "COMPLETED"
    fc.wait_hooks(retry["job_id"])
    ran = {h for h, _ in fc.hook_durations_ms(job)} | {h for h, _ in fc.hook_durations_ms(retry["job_id"])}
    assert {"prolog-slurmctld", "prolog", "epilog", "epilog-slurmctld"} <= ran
    root_marks = [p.name for p in markers.iterdir() if p.name.startswith("imported-uid0-")]
    assert not root_marks, f"a root process imported the user's model: {root_marks}"


def _runuser_ok(fc: FaultCluster, *cmd: str) -> bool:
    return fc.c.run(list(cmd), user="colocuser").returncode == 0


def test_databases_and_dirs_root_owned_not_user_writable(fc: FaultCluster) -> None:
    rec = fc.run_job(fc.script("perm.sh"))
    assert rec["job_state"] == "COMPLETED"
    run_dir = fc.run_dir
    paths = [fc.c.state_dir, fc.c.state_dir / "nodes", fc.ctld_db, fc.node_db("n1"), run_dir,
             run_dir / "jobs"]
    for p in paths:
        st = os.lstat(p)
        assert st.st_uid == 0 and not st.st_mode & 0o022 and not stat.S_ISLNK(st.st_mode), (p,
                                                                                            oct(st.st_mode))
    assert not _runuser_ok(fc, "sh", "-c", f"echo x >> {fc.ctld_db}")
    assert not _runuser_ok(fc, "touch", str(fc.c.state_dir / "nodes" / "planted.db"))
    py = str(Path(__file__).resolve().parents[3] / ".venv" / "bin" / "python")
    assert not _runuser_ok(fc, py, "-c", f"import sqlite3; c = sqlite3.connect({str(fc.ctld_db)!r}); "
                           "c.execute('DELETE FROM jobs'); c.commit()")
    assert fc.rows(fc.ctld_db, "SELECT count(*) AS n FROM jobs")[0]["n"] >= 1


def test_spool_refuses_planted_symlink_and_foreign_entries(tmp_path: Path) -> None:
    user_dir = tmp_path / "user"
    user_dir.mkdir()
    os.chown(user_dir, 2001, 2001)
    link = tmp_path / "run" / "spool"
    link.parent.mkdir()
    link.symlink_to(user_dir)
    ops = [{"op": "event", "row": {"job_id": 1, "kind": "k", "ts": 1.0, "detail_json": "{}"}}]
    entry = json.dumps({"target": "ctld", "ops": ops}).encode()
    with pytest.raises(StoreError, match="not a directory"):
        queue.write(str(link), "1-1.json", entry)
    assert not list(user_dir.iterdir())
    owned = tmp_path / "owned"
    owned.mkdir()
    os.chown(owned, 2001, 2001)
    with pytest.raises(StoreError, match="owned by uid 2001"):
        queue.write(str(owned), "1-1.json", entry)
    good = tmp_path / "good"
    queue.write(str(good), "1-1.json", entry)
    assert oct(os.stat(good).st_mode & 0o777) == "0o700"
    forged = good / "0-1.json"  # an entry not written by us (owner 2001) is never replayed
    forged.write_text(json.dumps({"target": "ctld", "ops": [{"op": "event", "row": {"job_id": 666}}]}))
    os.chown(forged, 2001, 2001)
    (good / "1-2.json").symlink_to(forged)
    db = open_ctld_db(tmp_path / "ctld.db")
    assert replay_queue("ctld", db, [str(good)], "") == 1
    assert [r["job_id"] for r in db.query("SELECT job_id FROM events")] == [1]
    assert sorted(p.name for p in good.iterdir()) == ["0-1.json.bad", "1-2.json.bad"]
    assert (good / "1-2.json.bad").is_symlink()
    planted = user_dir / "2-1.json"  # well-formed and root-owned, but behind a planted directory symlink
    planted.write_bytes(entry)
    planted.chmod(0o600)
    assert replay_queue("ctld", open_ctld_db(tmp_path / "ctld2.db"), [str(link)], "") == 0
    assert planted.exists()


def test_sql_injection_job_name_stored_and_reported_verbatim(fc: FaultCluster) -> None:
    name = "x'); DROP TABLE jobs;--"
    rec = fc.run_job(fc.script("inject.sh"), "-J", name)
    job = rec["job_id"]
    rows = fc.rows(fc.ctld_db, "SELECT job_name FROM jobs WHERE job_id = ?", (job,))
    assert rows == [{"job_name": name}]
    assert fc.rows(fc.ctld_db, "SELECT count(*) AS n FROM jobs")[0]["n"] >= 2  # the table is still there
    out = fc.c.run(["coloc-report", "jobs", "--json", "--since", "1d", "--job", str(job)])
    assert out.returncode == 0, out.stderr
    reported = json.loads(out.stdout)["jobs"]
    assert [r for r in reported if r["job_id"] == job and name in json.dumps(r, ensure_ascii=False)
            and (r.get("job_name") == name or r.get("name") == name)], reported


def test_user_sees_only_own_jobs(fc: FaultCluster) -> None:
    mine = fc.run_job(fc.script("mine.sh"))["job_id"]
    theirs = fc.run_job(fc.script("theirs.sh", mode=0o755), user="colocuser2")["job_id"]
    for user, own, other in (("colocuser", mine, theirs), ("colocuser2", theirs, mine)):
        for extra in ([], ["--user", "colocuser"], ["--user", "colocuser2"], ["--job", str(other)]):
            out = fc.c.run(["coloc-report", "jobs", "--json", "--since", "1d", *extra], user=user)
            assert out.returncode == 0, out.stderr
            ids = {j["job_id"] for j in json.loads(out.stdout)["jobs"]}
            assert other not in ids, (user, extra, ids)
            if not extra or extra == ["--user", user]:
                assert own in ids, (user, extra, ids)
    root = fc.c.run(["coloc-report", "jobs", "--json", "--since", "1d"], user=None)
    assert {mine, theirs} <= {j["job_id"] for j in json.loads(root.stdout)["jobs"]}


FAKE_MPS = """#!/bin/bash
# TEST DOUBLE of nvidia-cuda-mps-control (CI has no driver): daemonizes a sleeper, writes the pid file.
P=$CUDA_MPS_PIPE_DIRECTORY
if [ "$1" = -d ]; then
  setsid bash -c 'exec -a nvidia-cuda-mps-control sleep 600' </dev/null >/dev/null 2>&1 &
  echo $! > "$P/nvidia-cuda-mps-control.pid"; exit 0
fi
read -r cmd
[ "$cmd" = quit ] && kill "$(cat "$P/nvidia-cuda-mps-control.pid")" && rm -f "$P/nvidia-cuda-mps-control.pid"
"""


def test_per_user_mps_pipe_dir_admits_only_the_jobs_user(fc: FaultCluster) -> None:
    fake = fc.c.dir / "fakebin" / "nvidia-cuda-mps-control"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(FAKE_MPS)
    fake.chmod(0o755)
    fc.set_config(mps_mode="per-user", mps_control_bin=str(fake))
    job = fc.sbatch(fc.script("mps.sh", "sleep 8\n"))
    fc.c.wait_state(job, ["RUNNING"], timeout=60)
    time.sleep(1.5)
    pipes = [p for p in (fc.run_dir / "mps").glob("*/pipe") if (p.parent / "members" / str(job)).exists()]
    assert pipes, "an MPS pipe directory serves the shard job while it runs"
    try:
        for p in pipes:
            for d in (p, p.parent / "log"):
                assert fc.c.run(["test", "-x", str(d)], user="colocuser").returncode == 0
                assert fc.c.run(["test", "-x", str(d)],
                                user="colocuser2").returncode != 0, oct(d.stat().st_mode)
            daemon = int((p / "nvidia-cuda-mps-control.pid").read_text())
            assert os.stat(f"/proc/{daemon}").st_uid == 2001  # the daemon runs as the job's user, not root
            # the per-(GPU, uid) directory itself stays root-owned, not user-writable
            parent = os.lstat(p.parent)
            assert parent.st_uid == 0 and not parent.st_mode & 0o022, oct(parent.st_mode)
    finally:
        fc.c.wait_job(job, timeout=60)
