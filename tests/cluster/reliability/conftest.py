"""Fixtures of the reliability campaign: a real local Slurm cluster of its own (faults are injected into ITS
config, databases and directories, never into the shared session cluster), and helpers to submit jobs, read
the hook log and the databases.
"""
from __future__ import annotations

import os
import re
import sqlite3
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest

from tests.slurm_cluster import Cluster, start_cluster, stop_cluster

# The fault cluster's config: short budgets so a fault shows within seconds; the per-user rerun cap out of
# the way (the session's reruns add up in one window: a test that needs a rerun must not depend on how many
# earlier tests made; the cap's own test sets it and counts those). Bound of one hook process
# (hooks/runner.py bound_s): hook_timeout_s + db_busy_timeout_s + 3 s recording + 1 s = 4 + 1 + 4 = 9 s.
BASE_CONFIG = """\
state_dir: {dir}/coloc/state
run_dir: {dir}/coloc/run
log_dir: {dir}/log
slurm_bin_dir: {bin_dir}
gpu_mem_gib: 80
hook_timeout_s: 4
db_busy_timeout_s: 1
mps_start_timeout_s: 2
sampler_autostart: false
oom_rerun_per_user_max: 1000
"""
HOOK_BOUND_S = 9.0
_DONE = re.compile(r"(?:INFO|WARNING|ERROR) coloc\[(\d+)\] (\S+) done in (\d+) ms")


class FaultCluster:
    """The campaign's cluster plus helpers. ``set_config(**extra)`` rewrites coloc.yaml (hooks read it per
    run)."""

    def __init__(self, cluster: Cluster) -> None:
        self.c = cluster

    def __getattr__(self, name: str):
        return getattr(self.c, name)

    @property
    def hooks_log(self) -> Path:
        return self.c.dir / "log" / "hooks.log"

    @property
    def run_dir(self) -> Path:
        return self.c.dir / "coloc" / "run"

    def set_config(self, text: Optional[str] = None, **extra: object) -> None:
        body = text if text is not None else BASE_CONFIG.format(dir=self.c.dir,
                                                                bin_dir=self.c.bin_dir) + "".join(
            f"{k}: {v}\n" for k, v in extra.items())
        self.c.coloc_config.write_text(body)

    def script(self, name: str, body: str = "echo ran-$SLURM_JOB_ID\n", mode: int = 0o644) -> Path:
        path = self.c.jobs_dir / name
        path.write_text("#!/bin/sh\n" + body)
        os.chmod(path, mode)
        return path

    def sbatch(self, script: Path, *opts: str, node: str = "n1", user: str = "colocuser") -> int:
        """Plain sbatch (Slurm's own client: unaffected by faults in our config) on ``node``, 4 shards."""
        proc = self.c.run(["sbatch", "--parsable", "-w", node, "--gres=shard:4", "-t", "2",
                           "-o", f"{script.stem}-%j.out", *opts, str(script)], user=user)
        assert proc.returncode == 0, proc.stderr
        return int(proc.stdout.strip().split(";")[0])

    def run_job(self, script: Path, *opts: str, timeout: float = 120, **kw: str) -> Dict:
        job_id = self.sbatch(script, *opts, **kw)
        rec = self.c.wait_job(job_id, timeout=timeout)
        self.wait_hooks(job_id)
        return rec

    def wait_hooks(self, job_id: int, hooks=("epilog", "epilog-slurmctld"), timeout: float = 30) -> None:
        """Wait until the named hooks of the job logged their end (EpilogSlurmctld runs after the state
        flips)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            done = {h for h, _ in self.hook_durations_ms(job_id)}
            if set(hooks) <= done:
                return
            time.sleep(0.3)

    def hook_durations_ms(self, job_id: int) -> List[tuple]:
        """``[(hook, ms)]`` of every root hook process of the job that logged its end to hooks.log."""
        if not self.hooks_log.exists():
            return []
        out = []
        for line in self.hooks_log.read_text(errors="replace").splitlines():
            m = _DONE.search(line)
            if m and int(m.group(1)) == job_id:
                out.append((m.group(2), int(m.group(3))))
        return out

    def drained(self) -> Dict[str, str]:
        return {n: s for n, s in self.c.node_states().items()
                if s.startswith(("drain", "drng", "drai", "down"))}

    def rows(self, db: Path, sql: str, args: tuple = ()) -> List[Dict]:
        if not db.exists():
            return []
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        conn.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in conn.execute(sql, args)]
        finally:
            conn.close()

    def spooled(self) -> List[Path]:
        out: List[Path] = []
        for d in (self.run_dir / "spool", self.c.state_dir / "spool"):
            if d.is_dir():
                out += sorted(p for p in d.iterdir() if p.name.endswith(".json"))
        return out


@pytest.fixture(scope="session")
def fault_cluster() -> Iterator[FaultCluster]:
    """A cluster for this campaign only (own ports and directory), with BASE_CONFIG."""
    if os.geteuid() != 0:
        pytest.skip("the local Slurm cluster needs root")
    cluster = start_cluster()
    fc = FaultCluster(cluster)
    fc.set_config()
    try:
        yield fc
    finally:
        stop_cluster(cluster)


@pytest.fixture
def fc(fault_cluster: FaultCluster) -> Iterator[FaultCluster]:
    """The fault cluster with its base config restored and no node drained after the test."""
    fault_cluster.set_config()
    yield fault_cluster
    fault_cluster.set_config()
    for node in fault_cluster.drained():  # leave it usable for the next test (the test itself failed already)
        fault_cluster.c.scontrol("update", f"nodename={node}", "state=resume")
