"""OOM detection and recovery, the parts that need no cluster: message patterns on recorded messages, the
decision table, the rerun's sbatch options, the history the estimator reads, and the as-user file access
(real files, real fork/setuid; needs root)."""
from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from slurm_coloc.comment import JobComment
from slurm_coloc.comment.values import MAX_ARG_CHARS
from slurm_coloc.config import Config
from slurm_coloc.hooks import oom, rerun
from slurm_coloc.slurm.jobinfo import job_info_from_json, parse_squeue_json
from slurm_coloc.store import oom as store_oom
from slurm_coloc.store.db import open_ctld_db
from slurm_coloc.userfiles import append_line_as_user, read_tail_as_user

DATA = Path(__file__).parent / "data" / "oom"
SLURM_DATA = Path(__file__).parent / "data" / "slurm-22.05"
POSITIVE = sorted(p for p in DATA.glob("*.txt") if p.name != "negatives.txt")


@pytest.mark.parametrize("path", POSITIVE, ids=[p.stem for p in POSITIVE])
def test_every_recorded_oom_message_is_recognised(path: Path) -> None:
    found = oom.find_oom_messages(path.read_text())
    assert found, f"no OOM pattern matched {path.name}"


NEGATIVES = [line for line in (DATA / "negatives.txt").read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("line", NEGATIVES)
def test_other_failures_are_not_oom_messages(line: str) -> None:
    assert oom.find_oom_messages(line) == []


def test_messages_come_last_first_and_bounded() -> None:
    text = "\n".join(["CUDA out of memory. Tried to allocate 1 GiB"] * 20 + ["RuntimeError: cuDNN error: "
                                                                             "CUDNN_STATUS_ALLOC_FAILED"])
    found = oom.find_oom_messages(text)
    assert len(found) == oom.MAX_MESSAGES
    assert found[0][0] == "CUDNN_STATUS_ALLOC_FAILED"


MSG = [("torch.OutOfMemoryError", "torch.OutOfMemoryError: CUDA out of memory.")]


@pytest.mark.parametrize("state",
                         ["CANCELLED", "TIMEOUT", "NODE_FAIL", "COMPLETED", "PREEMPTED", "OUT_OF_MEMORY"])
def test_only_failed_jobs_can_be_oom_even_with_the_message(state: str) -> None:
    assert not oom.decide_oom(state, "None", MSG).oom


def test_failed_with_message_is_oom_without_is_not() -> None:
    assert oom.decide_oom("FAILED", "NonZeroExitCode", MSG).oom
    assert not oom.decide_oom("FAILED", "NonZeroExitCode", []).oom
    assert not oom.decide_oom("FAILED", "NodeDown", MSG).oom


def test_memory_at_the_fence_is_evidence() -> None:
    assert oom.decide_oom("FAILED", "", [], peak_mib=4090, fence_mib=4096).oom
    assert not oom.decide_oom("FAILED", "", [], peak_mib=2000, fence_mib=4096).oom


def test_retry_decision() -> None:
    assert oom.retry_decision("shard", 4, 80, None).rerun
    assert not oom.retry_decision("shard", 4, 80, 12).rerun          # a retry is never retried
    assert not oom.retry_decision("whole-gpu", 80, 80, None).rerun   # whole GPU: nothing bigger to give
    assert not oom.retry_decision("gpu", None, 80, None).rerun
    assert not oom.retry_decision("none", None, 80, None).rerun


def test_retry_marker_in_comment() -> None:
    assert oom.retry_of_comment('oom-retry-of-12 coloc:{"v":1}') == 12
    assert oom.retry_of_comment("my run oom-retry-of-7") == 7
    assert oom.retry_of_comment("xoom-retry-of-7") is None
    assert oom.retry_of_comment("") is None


def test_every_directive_of_every_dialect_is_neutralised() -> None:
    """N1: before, only GPU ``#SBATCH`` lines were neutralised, so ``#PBS -p -1000`` gave root's
    rerun Nice=-1000. Now no line of the rerun's script starts with a directive of any dialect."""
    script = ("#!/bin/bash\n#SBATCH --gres=shard:4\n#SBATCH --nice=-1000\n#SLURM --exclusive\n#PBS -p -1000\n"
              "  #pbs -l walltime=1\n#BSUB -q x\n#$ -l h_vmem=1\n#MSUB -l x\n#flux: -N1\n# an ordinary "
              "comment\n"
              "echo start\r#SBATCH --uid=0\n#SBATCH --begin=now\necho --gres  # #SBATCH\n")
    out, changed = rerun.neutralise_directives(script)
    lines = re.split(r"\r\n|\n|\r", out)
    assert lines[0] == "#!/bin/bash" and "echo start" in lines and "echo --gres  # #SBATCH" in lines
    assert not [ln for ln in lines
                if re.match(r"\s*#\s*(SBATCH|SLURM|PBS|BSUB|MSUB|\$|flux:)", ln, re.I)], lines
    assert changed == 12  # 11 directive lines (one after a \r) + the header's ordinary comment
    assert rerun.neutralise_directives("#!/usr/bin/env python3\nprint(1)\n") == (
        "#!/usr/bin/env python3\nprint(1)\n", 0)


def test_array_task_is_rerun_alone_and_pbs_is_ignored() -> None:
    """N2: the rerun of task 0 of an array names that task alone, from Slurm's record."""
    job = job_info_from_json({"job_id": 41, "array_job_id": 40, "array_task_id": 0, "name": "a",
                              "tres_per_node": "gres:shard:2", "partition": "debug",
                              "current_working_directory": "/w", "standard_output": "/w/o-%A_%a"})
    args = rerun.retry_sbatch_args(job, Config(gpu_mem_gib=80))
    assert "--array=0" in args and "--ignore-pbs" in args and "--output=/w/o-40_0" in args
    plain = rerun.retry_sbatch_args(job_info_from_json({"job_id": 7, "partition": "debug"}), Config())
    assert not any(a.startswith("--array") for a in plain)


def test_rerun_options_keep_the_job_and_take_a_whole_gpu() -> None:
    job = next(j for j in parse_squeue_json((SLURM_DATA / "squeue_json_running.json").read_text())
               if j.job_id == 1)
    args = rerun.retry_sbatch_args(job, Config(gpu_mem_gib=80))
    assert "--gres=shard:80" in args and "--open-mode=append" in args and "--export=NONE" in args
    assert "--job-name=small" in args and "--partition=debug" in args and "--time=525600" in args
    assert "--chdir=/tmp/coloc-cluster/jobs" in args and "--output=/tmp/coloc-cluster/jobs/1.out" in args
    assert not any(a.startswith("--error=") for a in args)  # stderr goes to stdout
    assert not any(a.startswith("--account=") for a in args)  # no account
    comment = next(a for a in args if a.startswith("--comment="))
    assert comment.startswith("--comment=oom-retry-of-1 coloc:") and '"mode":"whole-gpu"' in comment
    assert oom.retry_of_comment(comment[len("--comment="):]) == 1
    assert comment == JobComment.oom_rerun(1, 80, 81920).comment_arg()  # written by the comment's one writer
    assert JobComment.read(comment[len("--comment="):], 1).retry_of == 1


def test_rerun_options_pass_a_forged_name_as_one_opaque_word() -> None:
    """A name holding option-like text stays inside --job-name; the GRES is still the one whole-GPU
    request."""
    job = job_info_from_json({"job_id": 4, "name": "x --gres=shard:1 TresPerNode=gres:shard:79",
                              "tres_per_node": "gres:shard:2", "partition": "debug",
                              "current_working_directory": "/w", "standard_output": "o%j"})
    args = rerun.retry_sbatch_args(job, Config(gpu_mem_gib=80))
    assert "--job-name=x --gres=shard:1 TresPerNode=gres:shard:79" in args
    assert [a for a in args if a.startswith("--gres=")] == ["--gres=shard:80"] and "--output=/w/o4" in args


def test_script_args_from_squeue_command() -> None:
    def job(command: str):
        return job_info_from_json({"job_id": 3, "command": command})

    assert rerun.script_args(job("./run.sh a1 b2"), None) == (["a1", "b2"], True)
    assert rerun.script_args(job("./run.sh a 1"), ["a 1"]) == (["a 1"], True)  # agrees with Slurm's words
    assert rerun.script_args(job("./run.sh a1 b2"), ["--evil"]) == (["a1", "b2"], True)  # the comment lies
    assert rerun.script_args(job("/j/run.sh"), None) == ([], True)
    assert rerun.script_args(job("/j/run.sh a  b"), None)[1] is False
    assert rerun.script_args(None, None) == ([], True)


def _argv(coloc: dict):
    """The argv the hooks pass: the typed comment's (None where the comment breaks the protocol)."""
    return JobComment.read("coloc:" + json.dumps(coloc), 5).argv


def test_script_args_where_slurm_keeps_only_the_script() -> None:
    """24.11 and later record ``command`` as the script path alone (tests/data/slurm-24.11): the comment's
    argv is the only source of the rerun's arguments there, within bounds; on 22.05 the same comment cannot
    add words."""
    import dataclasses

    j = job_info_from_json({"job_id": 5, "command": "/j/run.sh"})
    new = dataclasses.replace(j, slurm_release="24.11.5")
    assert rerun.script_args(new, ["a", "b c", "200"]) == (["a", "b c", "200"], True)
    assert rerun.script_args(new, None) == ([], False)  # not known: reported as inexact
    assert rerun.script_args(new, _argv({"argv": ["x" * (MAX_ARG_CHARS + 1)]})) == ([], False)
    assert rerun.script_args(new, _argv({"argv": "a b"})) == ([], False)
    assert rerun.script_args(dataclasses.replace(j, slurm_release="22.05.8"), ["--evil"]) == ([], True)


@pytest.fixture()
def db(tmp_path: Path):
    return open_ctld_db(tmp_path / "ctld.db")


def test_claim_is_once_and_history_returns_fences(db) -> None:
    rec = store_oom.OomRecord(job_id=5, ts=1.0, uid=2001, script_sha256="s1", shards=4, fence_mib=4096,
                              retry_status="submitting")
    assert store_oom.claim_retry(db, rec)
    assert not store_oom.claim_retry(db, rec)
    store_oom.record_retry_submitted(db, 5, 6)
    assert store_oom.original_of(db, 6) == 5 and store_oom.original_of(db, 5) is None
    assert store_oom.record_retry_outcome(db, 6, "COMPLETED", 10.0, 20.0)
    assert not store_oom.record_retry_outcome(db, 99, "COMPLETED", 10.0, 20.0)
    store_oom.claim_retry(db, store_oom.OomRecord(job_id=8, ts=2.0, uid=2001, script_sha256="s1", shards=6,
                                                  fence_mib=6144))
    store_oom.claim_retry(db, store_oom.OomRecord(job_id=9, ts=3.0, uid=2001, script_sha256="other",
                                                  fence_mib=1024))
    store_oom.claim_retry(db, store_oom.OomRecord(job_id=10, ts=4.0, uid=2002, script_sha256="s1",
                                                  fence_mib=81920))
    assert store_oom.history_peaks_mib(db, "s1", 2001) == [4096,
                                                           6144]  # uid 2002's row is not uid 2001's history
    assert store_oom.history_peaks_mib(db, "s1", 2002) == [81920]
    assert store_oom.history_peaks_mib(db, "nope", 2001) == []
    got = store_oom.load_oom_event(db, 5)
    assert got is not None and got.retry_status == "submitted" and got.retry_job_id == 6
    assert got.retry_state == "COMPLETED"


def test_history_makes_the_estimator_ask_for_more_than_the_fence() -> None:
    from slurm_coloc.estimate.decision import history_bound

    assert history_bound([4096]) > 4096


# ---- as-user file access (root only) ----

USER = "colocuser"


@pytest.fixture()
def user_dir() -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    try:
        pw = pwd.getpwnam(USER)
    except KeyError:
        pytest.skip(f"no user {USER} (scripts/cluster.sh creates it)")
    d = Path(tempfile.mkdtemp(prefix="oomio-"))
    os.chmod(d, 0o755)
    os.chown(d, pw.pw_uid, pw.pw_gid)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _ids() -> tuple:
    pw = pwd.getpwnam(USER)
    return pw.pw_uid, pw.pw_gid


def _user_file(path: Path, text: str) -> None:
    path.write_text(text)
    uid, gid = _ids()
    os.chown(path, uid, gid)


def test_tail_is_bounded_and_read(user_dir: Path) -> None:
    f = user_dir / "err.txt"
    _user_file(f, "x" * 200_000 + "\ntorch.OutOfMemoryError: CUDA out of memory.\n")
    tail = read_tail_as_user(str(f), *_ids(), max_bytes=1000)
    assert tail.error is None and len(tail.text) == 1000 and tail.size_bytes == f.stat().st_size
    assert oom.find_oom_messages(tail.text)


def test_symlink_as_last_component_is_not_followed(user_dir: Path, tmp_path: Path) -> None:
    secret = tmp_path / "root-file"
    secret.write_text("torch.OutOfMemoryError: CUDA out of memory.\n")
    os.chmod(secret, 0o644)
    link = user_dir / "err.txt"
    link.symlink_to(secret)
    tail = read_tail_as_user(str(link), *_ids())
    assert tail.text == "" and "symbolic link" in (tail.error or "")


def test_symlinked_directory_to_another_owner_is_refused(user_dir: Path) -> None:
    # root-owned, world-readable: only the owner check stops it
    root_dir = Path(tempfile.mkdtemp(prefix="oomroot-"))
    os.chmod(root_dir, 0o755)
    request_cleanup = root_dir
    (root_dir / "err.txt").write_text("torch.OutOfMemoryError: CUDA out of memory.\n")
    os.chmod(root_dir / "err.txt", 0o644)
    (user_dir / "d").symlink_to(root_dir)
    try:
        tail = read_tail_as_user(str(user_dir / "d" / "err.txt"), *_ids())
    finally:
        shutil.rmtree(request_cleanup, ignore_errors=True)
    assert tail.text == "" and "owned by uid 0" in (tail.error or "")


def test_unreadable_for_the_user_is_unreadable_for_us(user_dir: Path, tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o700)  # root-only directory on the path
    f = tmp_path / "err.txt"
    _user_file(f, "torch.OutOfMemoryError: CUDA out of memory.\n")
    tail = read_tail_as_user(str(f), *_ids())
    assert tail.text == "" and "permission denied" in (tail.error or "")


def test_fifo_does_not_block(user_dir: Path) -> None:
    fifo = user_dir / "err.fifo"
    os.mkfifo(fifo)
    os.chown(fifo, *_ids())
    tail = read_tail_as_user(str(fifo), *_ids(), timeout_s=3)
    assert "not a regular file" in (tail.error or "")


def test_append_as_user_appends_and_refuses_symlinks(user_dir: Path, tmp_path: Path) -> None:
    f = user_dir / "out.txt"
    _user_file(f, "first\n")
    assert append_line_as_user(str(f), *_ids(), "slurm-coloc: hello") is None
    assert f.read_text() == "first\nslurm-coloc: hello\n"
    target = tmp_path / "root-owned"
    target.write_text("")
    os.chmod(target, 0o666)
    (user_dir / "evil").symlink_to(target)
    assert "symbolic link" in (append_line_as_user(str(user_dir / "evil"), *_ids(), "x") or "")
    assert target.read_text() == ""
    assert append_line_as_user(str(user_dir / "missing"), *_ids(), "x") is not None
    assert not (user_dir / "missing").exists()


def test_never_acts_as_root(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("CUDA out of memory")
    assert read_tail_as_user(str(f), 0, 0).error is not None


def test_script_args_from_26_05_submit_line() -> None:
    """26.05 records sbatch's whole command line (``submit_line``; ``command`` is the script as given, or the
    resolved path when given without ``/``: both seen on a 26.05.5 cluster); the rerun's arguments come from
    it."""
    def job(command: str, line: str):
        return job_info_from_json({"job_id": 6, "command": command, "current_working_directory": "/w",
                                   "submit_line": line}, release="26.05.5")

    assert rerun.script_args(job("./s.sh", "sbatch --parsable -o /dev/null ./s.sh a b 200"), None) == \
        (["a", "b", "200"], True)
    assert rerun.script_args(job("/w/s.sh", "sbatch --parsable s.sh x"), None) == (["x"], True)
    assert rerun.script_args(job("/w/s.sh", "/usr/bin/sbatch /w/s.sh"), None) == ([], True)
    # an option's value naming the script: the word after the option is skipped, and the result marked inexact
    assert rerun.script_args(job("./s.sh", "sbatch -J ./s.sh ./s.sh 7"), None) == (["7"], False)
    # an argument's own spaces: the comment's argv restores them where its words agree, never adds any
    line = "sbatch ./s.sh a b  c 200"
    assert rerun.script_args(job("./s.sh", line), None)[1] is False
    assert rerun.script_args(job("./s.sh", line), ["a", "b  c", "200"]) == (["a", "b  c", "200"], True)
    assert rerun.script_args(job("./s.sh", line), ["--evil"]) == (["a", "b", "c", "200"], False)
    # the script not in the line (read from stdin): not known, the comment's argv is the only source as on
    # 24.11
    assert rerun.script_args(job("/w/s.sh", "sbatch --parsable"), None) == ([], False)
    # --wrap: no script arguments
    assert rerun.script_args(job("", "sbatch --wrap sleep 8"), None) == ([], True)


def test_recorded_script_args_on_the_26_05_recording() -> None:
    """The recorded 26.05 job is a ``--wrap`` job: no command, so no arguments (its submit_line is not
    read)."""
    data = json.loads((Path(__file__).parent / "data" / "slurm-26.05" / "squeue_json_running.json")
                      .read_text())
    j = job_info_from_json(data["jobs"][0], release="26.05.5")
    assert j.raw["submit_line"].startswith("/var/cache/slurm-coloc/26.05/bin/sbatch ")
    assert j.command == "" and j.recorded_script_args() == ([], True)
