"""The SPANK plugin (spank/coloc_spank.c) against a real Slurm 22.05 cluster.

The plugin is built from the files git tracks in ``spank/`` (a clean checkout), then enabled through
``PlugStackConfig`` in a cluster of its own (``scripts/cluster.sh`` with ``COLOC_CLUSTER_DIR`` a fresh
``/tmp/coloc-spank-<port>-XXXXXXXX`` and ``COLOC_PORT_BASE`` a port block reserved for this session, as
tests/slurm_cluster.py's clusters), so other tests' clusters, and another session's SPANK cluster, are never
touched. That cluster's Prolog and PrologSlurmctld are replaced by test-only scripts that record the hook
environment and, like the real Prolog, write the per-job env file ``<run_dir>/jobs/<job id>.env`` (mode 0600,
root) for ``--coloc-share=mps`` jobs.

Run: ``sudo .venv/bin/pytest -m slurm tests/test_spank.py`` (root: slurmd and runuser need it).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

from tests.slurm_cluster import new_cluster_dir, reserve_port_base, slurm_bin_dir, slurm_version

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
USER = "colocuser"
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"}
ENV_FILE = """CUDA_MPS_PIPE_DIRECTORY={run}/mps/pipe
CUDA_MPS_LOG_DIRECTORY={run}/mps/log
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50
COLOC_MEM_LIMIT_MIB=6144
CUDA_VISIBLE_DEVICES=7
# a comment line
LD_LIBRARY_PATH=/coloc-test-evil
coloc_lower=1
COLOC_DIGIT9=1
NO_EQUALS_SIGN
COLOC_LONG={long}
"""
TEST_PROLOG = """#!/bin/sh
# Test-only Prolog (tests/test_spank.py): record the hook environment; for mps jobs write the env file.
env > {hookenv}/prolog-$SLURM_JOB_ID.env
f={run}/jobs/$SLURM_JOB_ID.env
if [ "$SPANK_COLOC_SHARE" = mps ] && [ ! -e "$f" ] && [ ! -L "$f" ]; then
  umask 077
  cat > "$f" <<'EOF'
{env_file}EOF
fi
exit 0
"""
JOB = """#!/bin/sh
echo '== batch'; env
echo '== step'; srun -n1 env
"""


@dataclass
class SpankCluster:
    """The test cluster: its directory, env for client commands and the plugin's run_dir."""

    dir: Path
    env: Dict[str, str]
    run_dir: Path
    plugstack: Path

    def run(self, argv: List[str], as_user: bool = True, **kw) -> subprocess.CompletedProcess:
        """Run a Slurm client command (as the test user by default); never raises on rc != 0."""
        prefix = ["runuser", "-u", USER, "--", "env",
                  f"SLURM_CONF={self.env['SLURM_CONF']}"] if as_user else []
        return subprocess.run(prefix + argv, env=self.env, cwd=self.dir / "jobs", capture_output=True,
                              text=True,
                              timeout=60, **kw)

    def sbatch(self, *args: str, script: str = JOB) -> int:
        """Submit ``script`` (written to the jobs dir) with ``args``; return the job id."""
        path = self.dir / "jobs" / f"spank-job-{time.monotonic_ns()}.sh"
        path.write_text(script)
        path.chmod(0o644)
        out = self.run(["sbatch", "--parsable", "-o", str(self.dir / "jobs" / "spank-%j.out"), *args,
                        str(path)])
        assert out.returncode == 0, out.stderr
        return int(out.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> Dict[str, str]:
        """``scontrol show job -o`` as a dict (the values we read have no spaces)."""
        out = self.run(["scontrol", "show", "job", "-o", str(job_id)], as_user=False)
        return dict(kv.split("=", 1) for kv in out.stdout.split() if "=" in kv)

    def wait(self, job_id: int, timeout_s: float = 60) -> Dict[str, str]:
        """Wait until the job has ended; return its scontrol fields."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in TERMINAL:
                return info
            time.sleep(0.3)
        raise AssertionError(f"job {job_id} did not end in {timeout_s} s: {self.job(job_id)}")

    def step_envs(self, job_id: int) -> Dict[str, Dict[str, str]]:
        """The env of the batch step and of the srun step, as printed by JOB."""
        text = (self.dir / "jobs" / f"spank-{job_id}.out").read_text()
        envs: Dict[str, Dict[str, str]] = {}
        for block in text.split("== ")[1:]:
            name, _, body = block.partition("\n")
            envs[name] = dict(line.split("=", 1) for line in body.splitlines() if "=" in line)
        return envs

    def hook_env(self, hook: str, job_id: int) -> Dict[str, str]:
        """The env the test Prolog (or PrologSlurmctld) saw for the job."""
        text = (self.dir / "hookenv" / f"{hook}-{job_id}.env").read_text()
        return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)

    def wait_hook_env(self, hook: str, job_id: int, timeout_s: float = 15) -> Dict[str, str]:
        """Like hook_env, waiting for the hook to have run (PrologSlurmctld runs beside the client)."""
        path = self.dir / "hookenv" / f"{hook}-{job_id}.env"
        deadline = time.monotonic() + timeout_s
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(0.2)  # let the hook finish writing
        return self.hook_env(hook, job_id)

    def all_job_ids(self) -> List[str]:
        """Every job slurmctld knows (MinJobAge keeps finished ones)."""
        return self.run(["squeue", "-h", "-t", "all", "-o", "%i"], as_user=False).stdout.split()


def _cluster_sh(cmd: str, env: Dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(REPO / "scripts" / "cluster.sh"), cmd], env=env, capture_output=True,
                          text=True,
                          timeout=180)


@pytest.fixture(scope="module")
def spank_base() -> Iterator[Tuple[Path, int]]:
    """(directory, port base) of this module's cluster: a fresh directory and a port block held by this
    session (``reserve_port_base``) until the module ends; the directory is then removed (kept with
    COLOC_TEST_KEEP=1)."""
    if os.geteuid() != 0:
        pytest.skip("needs root (slurmd, runuser)")
    port_base, lock = reserve_port_base()
    base = new_cluster_dir(port_base, "spank")
    try:
        yield base, port_base
    finally:
        os.close(lock)
        if os.environ.get("COLOC_TEST_KEEP") != "1":
            shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def plugin_build(spank_base: Tuple[Path, int]) -> Path:
    """Build spank/ from the files git tracks into a fresh directory; return the build dir."""
    build = spank_base[0] / "build"
    build.mkdir()
    tracked = subprocess.run(["git", "ls-files", "spank"], cwd=REPO, capture_output=True, text=True,
                             check=True)
    for rel in tracked.stdout.split():
        shutil.copy(REPO / rel, build / Path(rel).name)
    assert not (build / "coloc_spank.so").exists()
    make = subprocess.run(["make", "-C", str(build)], capture_output=True, text=True, timeout=120)
    assert make.returncode == 0, make.stdout + make.stderr
    return build


@pytest.fixture(scope="module")
def spank_cluster(plugin_build: Path, spank_base: Tuple[Path, int]) -> Iterator[SpankCluster]:
    """A running cluster with the freshly built plugin enabled and test-only Prolog hooks."""
    base, port_base = spank_base
    run_dir = base / "spank-run"
    plugstack = base / "plugstack.conf"
    # the version's clients
    path = f"{slurm_bin_dir(slurm_version())}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    env = {**os.environ, "PATH": path, "COLOC_CLUSTER_DIR": str(base), "COLOC_PORT_BASE": str(port_base),
           "COLOC_PLUGSTACK": str(plugstack), "SLURM_CONF": str(base / "etc" / "slurm.conf")}
    for d, mode in ((run_dir, 0o755), (run_dir / "jobs", 0o755), (base / "hookenv", 0o755)):
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(mode)
    plugstack.write_text(f"required {plugin_build / 'coloc_spank.so'} run_dir={run_dir}\n")
    started = _cluster_sh("start", env)
    if started.returncode != 0:
        _cluster_sh("stop", env)  # no daemon of a half-started cluster left behind
    assert started.returncode == 0, started.stdout + started.stderr
    hooks = base / "etc" / "hooks"
    env_file = ENV_FILE.format(run=run_dir, long="x" * 5000)
    (hooks / "prolog.sh").write_text(TEST_PROLOG.format(hookenv=base / "hookenv", run=run_dir,
                                                        env_file=env_file))
    (hooks / "prolog_slurmctld.sh").write_text(
        f"#!/bin/sh\nenv > {base / 'hookenv'}/prolog_slurmctld-$SLURM_JOB_ID.env\nexit 0\n")
    for name in ("epilog.sh", "epilog_slurmctld.sh", "task_prolog.sh"):
        (hooks / name).write_text("#!/bin/sh\nexit 0\n")
    try:
        yield SpankCluster(dir=base, env=env, run_dir=run_dir, plugstack=plugstack)
    finally:
        _cluster_sh("stop", env)


def test_plugin_builds_hardened_and_exports_only_hooks(plugin_build: Path) -> None:
    so = plugin_build / "coloc_spank.so"
    exported = subprocess.run(["nm", "-D", "--defined-only", str(so)], capture_output=True, text=True,
                              check=True)
    names = [line.split()[-1] for line in exported.stdout.splitlines()]
    expected = {"slurm_spank_init", "slurm_spank_init_post_opt", "plugin_name", "plugin_type",
                "plugin_version"}
    assert expected <= set(names)
    assert [n for n in names if not n.startswith(("slurm_spank_", "plugin_"))] == []
    dynamic = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True, check=True).stdout
    assert "BIND_NOW" in dynamic or re.search(r"FLAGS.*NOW", dynamic)
    segments = subprocess.run(["readelf", "-lW", str(so)], capture_output=True, text=True, check=True).stdout
    assert "GNU_RELRO" in segments
    check = subprocess.run(["make", "-C", str(plugin_build), "check"], capture_output=True, text=True)
    assert check.returncode == 0 and "exports ok" in check.stdout


@pytest.mark.parametrize("command", ["sbatch", "srun", "salloc"])
def test_help_lists_options(spank_cluster: SpankCluster, command: str) -> None:
    out = spank_cluster.run([command, "--help"])
    assert out.returncode == 0
    assert re.search(r"--coloc-mem=SIZE\|auto\s+\[coloc\]", out.stdout)
    assert re.search(r"--coloc-share=mps\|timeslice\|exclusive\s+\[coloc\]", out.stdout)


@pytest.mark.parametrize("value, mib", [
    ("6G", "6144"), ("6144M", "6144"), ("6GiB", "6144"), ("6gb", "6144"), ("6", "6144"), ("1.5G", "1536"),
    ("512K", "1"), ("1M", "1"), ("1T", "1048576"), ("1024G", "1048576"), (" 6 G ", "6144"), ("auto", "auto"),
    ("AUTO", "auto"),
])
def test_mem_value_normalized_to_mib_like_coloc_sbatch(spank_cluster: SpankCluster, value: str,
                                                       mib: str) -> None:
    out = spank_cluster.run(["sbatch", "-v", "--test-only", "--gres=shard:1", f"--coloc-mem={value}",
                             "--wrap", "true"])
    assert out.returncode == 0, out.stderr
    assert f"coloc: job control env COLOC_MEM={mib}\n" in out.stderr
    # a bare number is GiB, unlike sbatch --mem's MB: the plugin says so (and only then)
    note = f"coloc: --coloc-mem {value} is read as {value} GiB (sbatch --mem {value} would be MB)"
    assert (note in out.stderr) == value.strip().replace(".", "").isdigit(), out.stderr
    if mib != "auto":  # the same grammar as coloc-sbatch's parser, so both agree on the size
        from slurm_coloc.units import parse_size_mib
        assert parse_size_mib(value) == int(mib)


@pytest.mark.parametrize("option, message", [
    ("--coloc-mem=6x", "coloc: invalid --coloc-mem value '6x': expected SIZE"),
    ("--coloc-mem=0", "coloc: invalid --coloc-mem value '0': must be more than 0"),
    ("--coloc-mem=-1G", "coloc: invalid --coloc-mem value '-1G': expected SIZE"),
    ("--coloc-mem=1025G", "coloc: invalid --coloc-mem value '1025G': more than 1T"),
    ("--coloc-mem=0x10", "coloc: invalid --coloc-mem value '0x10': expected SIZE"),
    ("--coloc-mem=", "coloc: invalid --coloc-mem value '': expected SIZE"),
    ("--coloc-share=shared", "coloc: invalid --coloc-share value 'shared': use mps, timeslice or exclusive"),
])
def test_invalid_values_rejected_and_nothing_submitted(spank_cluster: SpankCluster, option: str,
                                                       message: str) -> None:
    before = spank_cluster.all_job_ids()
    out = spank_cluster.run(["sbatch", "--gres=shard:1", option, "--wrap", "true"])
    assert out.returncode != 0
    assert message in out.stderr
    assert spank_cluster.all_job_ids() == before


def test_command_line_overrides_sbatch_directive(spank_cluster: SpankCluster) -> None:
    script = spank_cluster.dir / "jobs" / "spank-directive.sh"
    script.write_text("#!/bin/sh\n#SBATCH --gres=shard:6\n#SBATCH --coloc-mem=6G\ntrue\n")
    script.chmod(0o644)
    from_script = spank_cluster.run(["sbatch", "-v", "--test-only", str(script)])
    overridden = spank_cluster.run(["sbatch", "-v", "--test-only", "--coloc-mem=4G", str(script)])
    assert "coloc: job control env COLOC_MEM=6144\n" in from_script.stderr
    assert "coloc: job control env COLOC_MEM=4096\n" in overridden.stderr
    assert "warning" not in from_script.stderr  # the GPU request came from an #SBATCH line


def test_mem_without_gres_warns_but_submits(spank_cluster: SpankCluster) -> None:
    bare = spank_cluster.run(["sbatch", "--parsable", "--coloc-mem=5.5G", "--wrap", "true"])
    assert bare.returncode == 0 and bare.stdout.strip().isdigit()
    assert "coloc: warning: --coloc-mem without --gres reserves no GPU; submit with coloc-sbatch or add " \
           "--gres=shard:6" in bare.stderr
    with_gres = spank_cluster.run(["sbatch", "--parsable", "--coloc-mem=5.5G", "--gres=shard:6", "--wrap",
                                   "true"])
    assert with_gres.returncode == 0 and "warning" not in with_gres.stderr


def test_a_job_held_for_the_placer_gets_no_gres_warning_and_no_marker(spank_cluster: SpankCluster) -> None:
    """coloc-sbatch submits a job held for coloc-placer without GRES (the placer adds shard:N) and says so
    with COLOC_SBATCH_PLACER=1: no warning, and the marker does not reach the job."""
    out_file = spank_cluster.dir / "jobs" / f"held-env-{time.monotonic_ns()}.txt"
    held = spank_cluster.run(["env", "COLOC_SBATCH_PLACER=1", "sbatch", "--parsable", "--hold",
                              "--coloc-mem=5.5G", "--wrap", f"env > {out_file}"])
    assert held.returncode == 0 and "warning" not in held.stderr, held.stderr
    job_id = int(held.stdout.strip())
    assert spank_cluster.run(["scontrol", "release", str(job_id)]).returncode == 0
    assert spank_cluster.wait(job_id)["JobState"] == "COMPLETED"
    env = out_file.read_text()
    assert "SLURM_JOB_ID=" in env and "COLOC_SBATCH_PLACER" not in env


def test_mps_job_env_in_batch_and_srun_step_and_hooks(spank_cluster: SpankCluster) -> None:
    job_id = spank_cluster.sbatch("--gres=shard:6", "--coloc-mem=6G", "--coloc-share=mps")
    assert spank_cluster.wait(job_id)["JobState"] == "COMPLETED"
    run = spank_cluster.run_dir
    envs = spank_cluster.step_envs(job_id)
    assert set(envs) == {"batch", "step"}
    for env in envs.values():
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == f"{run}/mps/pipe"
        assert env["CUDA_MPS_LOG_DIRECTORY"] == f"{run}/mps/log"
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
        assert env["COLOC_MEM_LIMIT_MIB"] == "6144"
        assert env["COLOC_SHARE"] == "mps"
        assert env["CUDA_VISIBLE_DEVICES"] == "7"  # the env file wins over Slurm's global index (MPS shows 0)
        assert env.get("LD_LIBRARY_PATH") != "/coloc-test-evil"  # key not allowed
        for ignored in ("coloc_lower", "COLOC_DIGIT9", "COLOC_LONG", "NO_EQUALS_SIGN"):
            assert ignored not in env
    for hook in ("prolog", "prolog_slurmctld"):
        hook_env = spank_cluster.hook_env(hook, job_id)
        assert hook_env["SPANK_COLOC_MEM"] == "6144"
        assert hook_env["SPANK_COLOC_SHARE"] == "mps"


def test_srun_and_salloc_allocations_pass_options(spank_cluster: SpankCluster) -> None:
    out = spank_cluster.run(["srun", "--gres=shard:6", "--coloc-mem=6G", "--coloc-share=mps", "env"])
    assert out.returncode == 0, out.stderr
    env = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == f"{spank_cluster.run_dir}/mps/pipe"
    assert env["COLOC_SHARE"] == "mps"
    assert spank_cluster.wait_hook_env("prolog", int(env["SLURM_JOB_ID"]))["SPANK_COLOC_MEM"] == "6144"
    alloc = spank_cluster.run(["salloc", "--gres=shard:2", "--coloc-mem=auto", "--coloc-share=timeslice",
                               "sh", "-c", "echo JOB=$SLURM_JOB_ID"])
    assert alloc.returncode == 0, alloc.stderr
    hook = spank_cluster.wait_hook_env("prolog_slurmctld",
                                       int(re.search(r"JOB=(\d+)", alloc.stdout).group(1)))
    assert (hook["SPANK_COLOC_MEM"], hook["SPANK_COLOC_SHARE"]) == ("auto", "timeslice")


def test_whole_gpu_job_gets_no_mps_variables(spank_cluster: SpankCluster) -> None:
    job_id = spank_cluster.sbatch("--gres=gpu:1", "--coloc-share=exclusive", "--coloc-mem=auto")
    assert spank_cluster.wait(job_id)["JobState"] == "COMPLETED"
    for env in spank_cluster.step_envs(job_id).values():
        assert env["COLOC_SHARE"] == "exclusive"
        assert not [k for k in env if k.startswith("CUDA_MPS_")]
    assert spank_cluster.hook_env("prolog", job_id)["SPANK_COLOC_MEM"] == "auto"


def _plant(path: Path, kind: str, target: Path) -> None:
    target.write_text("CUDA_MPS_PIPE_DIRECTORY=/planted\n")
    target.chmod(0o644)
    if kind == "symlink":
        path.symlink_to(target)
    elif kind == "fifo":
        os.mkfifo(path, 0o644)
    else:
        shutil.copy(target, path)
        if kind == "user-owned":
            shutil.chown(path, USER)
        else:
            path.chmod(0o664 if kind == "group-writable" else 0o646)


@pytest.mark.parametrize("kind, logged", [
    ("symlink", "Too many levels of symbolic links"), ("user-owned", "not owned by root"),
    ("group-writable", "group/other-writable"), ("other-writable", "group/other-writable"),
    ("fifo", "not a regular file"),
])
def test_unsafe_env_file_is_ignored_and_job_runs(spank_cluster: SpankCluster, kind: str, logged: str) -> None:
    job_id = spank_cluster.sbatch("--hold", "--gres=shard:2", "--coloc-share=mps")
    env_file = spank_cluster.run_dir / "jobs" / f"{job_id}.env"
    _plant(env_file, kind, spank_cluster.dir / "hookenv" / f"planted-{job_id}")
    assert spank_cluster.run(["scontrol", "release", str(job_id)], as_user=False).returncode == 0
    assert spank_cluster.wait(job_id, timeout_s=30)["JobState"] == "COMPLETED"  # a FIFO must not block
    for env in spank_cluster.step_envs(job_id).values():
        assert "CUDA_MPS_PIPE_DIRECTORY" not in env
        assert env["COLOC_SHARE"] == "mps"
    log = "".join(p.read_text() for p in (spank_cluster.dir / "log").glob("slurmd-n*.log"))
    assert re.search(rf"\[{job_id}\.batch\] error: coloc: .*{re.escape(logged)}", log)


def test_bad_plugstack_argument_fails_submission_but_not_running_jobs(spank_cluster: SpankCluster) -> None:
    good = spank_cluster.plugstack.read_text()
    job_id = spank_cluster.sbatch("--hold", "--gres=shard:2", "--coloc-share=timeslice")
    try:
        spank_cluster.plugstack.write_text(good.strip() + " bogus=1\n")
        refused = spank_cluster.run(["sbatch", "--wrap", "true"])
        assert refused.returncode != 0
        assert "coloc: plugstack.conf: bad argument 'bogus=1'" in refused.stderr
        assert spank_cluster.run(["scontrol", "release", str(job_id)], as_user=False).returncode == 0
        assert spank_cluster.wait(job_id)["JobState"] == "COMPLETED"
    finally:
        spank_cluster.plugstack.write_text(good)
    envs = spank_cluster.step_envs(job_id)  # srun inside the job still works, too
    assert {name: env.get("COLOC_SHARE") for name, env in envs.items()} == {"batch": "timeslice",
                                                                           "step": "timeslice"}
    log = "".join(p.read_text() for p in (spank_cluster.dir / "log").glob("slurmd-n*.log"))
    assert re.search(rf"\[{job_id}\.batch\] error: coloc: bad plugstack.conf arguments ignored", log)


def test_coloc_sbatch_and_plain_sbatch_agree(spank_cluster: SpankCluster) -> None:
    coloc_sbatch = REPO / ".venv" / "bin" / "coloc-sbatch"
    script = spank_cluster.dir / "jobs" / "spank-agree.sh"
    script.write_text(JOB)
    script.chmod(0o644)
    env_args = [f"COLOC_CONFIG={spank_cluster.dir / 'etc' / 'coloc.yaml'}"]
    via_tool = spank_cluster.run(["env", *env_args, str(coloc_sbatch), "--parsable", "--coloc-mem", "6G",
                                  "-o", str(spank_cluster.dir / "jobs" / "spank-%j.out"), str(script)])
    assert via_tool.returncode == 0, via_tool.stderr
    tool_id = int(via_tool.stdout.strip())
    plain_id = spank_cluster.sbatch("--coloc-mem=6G", "--gres=shard:6")
    tool, plain = spank_cluster.wait(tool_id), spank_cluster.wait(plain_id)
    assert tool["TresPerNode"] == plain["TresPerNode"]
    hook = {i: spank_cluster.hook_env("prolog", i) for i in (tool_id, plain_id)}
    assert hook[tool_id].get("SPANK_COLOC_MEM") == hook[plain_id].get("SPANK_COLOC_MEM") == "6144"
