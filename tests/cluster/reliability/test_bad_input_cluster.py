"""Bad input through the real coloc-sbatch into the real cluster: scripts with CRLF, a BOM, NUL bytes, 10 MB
of text, non-UTF-8, and option values with spaces, quotes, ``=``, unicode or nothing. Either the job is
submitted exactly as asked (values verbatim in Slurm), or coloc-sbatch exits non-zero with one error line and
NO job exists.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.cluster.reliability.conftest import FaultCluster

pytestmark = pytest.mark.slurm
HEAD = b"#!/bin/bash\n#COLOC mem=2G\n"


def _write(fc: FaultCluster, name: str, data: bytes) -> Path:
    p = fc.c.jobs_dir / name
    p.write_bytes(data)
    os.chmod(p, 0o644)
    return p


def _coloc_sbatch(fc: FaultCluster, *argv: str):
    return fc.c.run(["coloc-sbatch", "--parsable", "-t", "1", "-w", "n1", *argv], timeout=120)


@pytest.mark.parametrize("name,data,why", [
    ("nul.sh", HEAD + b"echo a\0b\n", "NUL"),
    ("big.sh", HEAD + b"# padding line\n" * (10 * 1024 * 1024 // 15), "larger than"),
    ("latin1.sh", HEAD + b"echo caf\xe9\n", "not UTF-8"),
    ("crlf.sh", HEAD.replace(b"\n", b"\r\n") + b"echo hi\r\n", "DOS line breaks"),  # sbatch's own refusal
    ("badcoloc.sh", b"#!/bin/bash\n#COLOC mem=lots\necho hi\n", "mem="),
    ("empty.sh", b"", ""),
])
def test_bad_script_is_refused_with_one_line_and_nothing_submitted(fc: FaultCluster, name: str, data: bytes,
                                                                   why: str) -> None:
    before = set(fc.c.job_ids())
    proc = _coloc_sbatch(fc, str(_write(fc, name, data)))
    assert proc.returncode != 0, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and proc.stderr.strip(), proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 2, proc.stderr  # ours, or sbatch's own error line(s)
    assert why in proc.stderr, proc.stderr
    assert set(fc.c.job_ids()) == before, "a refused script must not submit a job"


def test_bom_script_runs_or_is_refused_cleanly(fc: FaultCluster) -> None:
    before = set(fc.c.job_ids())
    proc = _coloc_sbatch(fc, "-o", "bom-%j.out",
                         str(_write(fc, "bom.sh", b"\xef\xbb\xbf" + HEAD + b"echo bom-ok\n")))
    assert "Traceback" not in proc.stderr
    # Slurm 22.05 sbatch: "This does not look like a batch script" (3 lines, its own)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        assert set(fc.c.job_ids()) == before and lines, proc.stderr
        assert len(lines) == 1 or all(ln.startswith("sbatch: error:") for ln in lines), proc.stderr
        return
    job = int(proc.stdout.strip().split(";")[0])
    assert fc.c.wait_job(job)["tres_per_node"] == "gres:shard:2"


@pytest.mark.parametrize("value",
                         ["a b", "it's \"quoted\"", "k=v=w", "ünïcödé ✓", " lead and trail ", "$HOME;`id`"])
def test_option_values_reach_slurm_verbatim(fc: FaultCluster, value: str) -> None:
    script = _write(fc, "plain.sh", HEAD + b"echo hi\n")
    proc = _coloc_sbatch(fc, "-J", value, "--comment", value, str(script), value, "")
    assert proc.returncode == 0, proc.stderr
    job = int(proc.stdout.strip().split(";")[0])
    rec = fc.c.job(job)
    assert rec["name"] == value
    assert rec["comment"].startswith(value + " coloc:")
    fc.c.wait_job(job)


def test_empty_option_value_is_passed_or_refused_without_submitting(fc: FaultCluster) -> None:
    before = set(fc.c.job_ids())
    proc = _coloc_sbatch(fc, "-J", "", str(_write(fc, "plain2.sh", HEAD + b"echo hi\n")))
    assert "Traceback" not in proc.stderr
    if proc.returncode == 0:
        job = int(proc.stdout.strip().split(";")[0])
        assert fc.c.wait_job(job)["job_state"] == "COMPLETED"
    else:
        assert set(fc.c.job_ids()) == before


def test_missing_value_and_no_script_refused(fc: FaultCluster) -> None:
    before = set(fc.c.job_ids())
    for argv in (["-J"], [], ["--coloc-mem"], ["--coloc-mem", "-5G", "x.sh"], ["/nonexistent/job.sh"]):
        proc = fc.c.run(["coloc-sbatch", *argv])
        assert proc.returncode != 0 and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, (argv, proc.stderr)
    assert set(fc.c.job_ids()) == before
