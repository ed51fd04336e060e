"""The hook process itself: the forked child's answer reaches the parent as valid JSON whatever its size, and
``coloc-hook`` keeps numpy and torch out of its own process without changing a process that imports it."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

from slurm_coloc.config import Config
from slurm_coloc.hooks import context, runner
from slurm_coloc.hooks.context import HookContext
from slurm_coloc.hooks.record import record_ops
from slurm_coloc.store import queue, recordset

VENV_BIN = Path(__file__).resolve().parents[2] / ".venv" / "bin"
CTX = HookContext.from_env({"SLURM_JOB_ID": "5", "SLURMD_NODENAME": "n1",
                            "SLURM_SCRIPT_CONTEXT": "epilog_slurmd"})


def _run(result: Any) -> tuple:
    return runner.run_bounded(lambda ctx, cfg, env: result, CTX, Config(hook_timeout_s=20), {}, "epilog")


def test_a_detail_over_1_mib_arrives_cut_with_a_marker() -> None:
    big = "x" * (2 << 20)
    ok, detail, result = _run({"state": "COMPLETED", "summary": big, "samples": list(range(300_000))})
    # before: "the hook's child ended without a result (crashed?)"
    assert ok is True and result is None, detail
    assert detail["state"] == "COMPLETED"
    assert detail["summary"].startswith("xxx") and detail["summary"].endswith(" ... [cut]")
    assert "samples" not in detail
    assert detail["truncated"]["cut"] == ["summary", "samples"] and detail["truncated"]["bytes"] > 2 << 20
    assert len(json.dumps(detail)) <= context.MAX_DETAIL_BYTES
    # the run's rows, failed or not, still fit one queue entry
    data = recordset.encode("node:n1", record_ops("epilog", CTX, False, detail, 1795000000.0, 10.0))
    assert len(data) <= queue.MAX_ENTRY_BYTES


def test_a_detail_of_many_small_items_keeps_only_the_marker() -> None:
    ok, detail, _ = _run({f"k{i}": "y" * 500 for i in range(4000)})
    assert ok is True and detail == {"truncated": {"bytes": detail["truncated"]["bytes"],
                                                   "limit": context.MAX_DETAIL_BYTES, "cut": "all"}}, detail


def test_task_prolog_lines_over_the_limit_fail_the_run_with_their_size() -> None:
    lines = [f"export COLOC_X{i}={'z' * 1000}" for i in range(2000)]  # 2 MB of lines
    ok, detail, result = _run(lines)
    assert ok is False and result is None and "over 1048576" in detail["error"], detail
    small = _run(lines[:3])
    assert small == (True, {}, lines[:3])


def test_importing_the_hook_cli_leaves_numpy_importable_and_sigterm_alone() -> None:
    code = ("import signal, sys; import slurm_coloc.cli.hook as h; import numpy; "
            "assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL; "
            "sys.argv = ['coloc-hook', '--help']\n"
            "try:\n    h.main()\nexcept SystemExit as e:\n    assert e.code == 0\n"
            "del sys.modules['numpy']; import numpy; print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr


def test_a_hook_process_imports_neither_numpy_nor_torch(tmp_path: Path) -> None:
    conf = tmp_path / "coloc.yaml"
    conf.write_text(f"state_dir: {tmp_path}/state\nrun_dir: {tmp_path}/run\nlog_dir: {tmp_path}/log\n")
    env: Dict[str, str] = {"PATH": "/usr/bin:/bin", "COLOC_CONFIG": str(conf), "SLURM_JOB_ID": "77",
                           "SLURMD_NODENAME": "n1", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
                           "SLURM_JOB_USER": "colocuser", "SLURM_JOB_UID": "2001",
                           "COLOC_PENDING_DIR": str(tmp_path / "pending")}
    proc = subprocess.run([str(VENV_BIN / "python"), "-X", "importtime", str(VENV_BIN / "coloc-hook"),
                           "prolog"],
                          env=env, capture_output=True, text=True, timeout=120)
    imported = [ln.rsplit("|", 1)[-1].strip() for ln in proc.stderr.splitlines()
                if ln.startswith("import time:")]
    assert proc.returncode == 0 and "slurm_coloc.hooks.runner" in imported, proc.stderr[-2000:]
    assert not [m for m in imported if m.split(".")[0] in ("numpy", "torch")], imported
    assert (tmp_path / "log" / "hooks.log").read_text().count("prolog done in") == 1
