"""``coloc-hook``: the entry point the Prolog/Epilog shims in prolog_epilog/ call. Always exits 0.

``main`` first catches SIGTERM (``StartUpTerminated``), then imports the rest: a run SIGTERMed before
``run_hook`` took over writes its pending environment (hooks/pending.py), appends its one ``done ...
(TERMINATED during start-up ...)`` line to ``<log_dir>/hooks.log`` and exits 0. ``main`` also keeps numpy out
of the process (``_keep_numpy_out``): sqlite_utils imports it when installed, and no hook uses it. Importing
this module changes neither the signal handlers nor the importable modules of the importing process.
"""
from __future__ import annotations

import os
import signal
import sys
import time

HOOK_NAMES = ("epilog", "epilog-slurmctld", "prolog", "prolog-slurmctld",
              "task-prolog")  # = hooks.runner.HOOKS


class StartUpTerminated(BaseException):
    """SIGTERM before ``run_hook`` took over (the shim's timeout during start-up)."""


def _on_term_early(signum: int, frame: object) -> None:
    raise StartUpTerminated()


def _log_start_up_terminated(hook: str) -> None:
    """Write the run's pending environment (os only: first, while time is short), then append the run's one
    line to ``<log_dir>/hooks.log`` without the logging setup. Never raises."""
    entry = None
    try:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        from slurm_coloc.hooks.pending import write_entry
        entry = write_entry(hook, os.environ, "startup")
    except BaseException:  # never fail the node
        pass
    try:
        from slurm_coloc import config as config_mod
        from slurm_coloc.hooks.pending import process_age_s
        cfg = config_mod.load_fallback(environ=os.environ)
        job = os.environ.get("SLURM_JOB_ID", "")
        now = time.time()
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f",{int(now % 1 * 1000):03d}"
        line = (f"{stamp} ERROR coloc[{job if job.isdigit() else None}] {hook} done in 0 ms (TERMINATED "
                "during "
                f"start-up, {process_age_s() * 1000:.0f} ms after exec: the shim's timeout; "
                + (f"pending entry {entry}, recorded by the next hook run)\n" if entry else
                   "no pending entry could be written: nothing recorded)\n"))
        fd = os.open(os.path.join(cfg.log_dir, "hooks.log"),
                     os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except BaseException:  # never fail the node
        pass


def _hook_arg() -> str:
    arg = sys.argv[1] if len(sys.argv) > 1 else ""
    return arg if arg in HOOK_NAMES else "hook"


def _keep_numpy_out() -> bool:
    """Make ``import numpy`` raise ImportError in this process, unless numpy is already imported; True if
    done."""
    if "numpy" in sys.modules:
        return False
    sys.modules["numpy"] = None  # type: ignore[assignment]
    return True


def _let_numpy_in(kept_out: bool) -> None:
    """Undo ``_keep_numpy_out`` (for callers of ``main`` that go on running, such as tests)."""
    if kept_out and "numpy" in sys.modules and sys.modules["numpy"] is None:
        del sys.modules["numpy"]


def _command() -> object:
    """The click command (click is imported here, after SIGTERM is caught)."""
    import click

    from slurm_coloc.cli import version_option

    @click.command(context_settings={"help_option_names": ["-h", "--help"]})
    @click.argument("hook", type=click.Choice(sorted(HOOK_NAMES)))
    @version_option("coloc-hook")
    def cli(hook: str) -> None:
        """Run one slurm-coloc hook for the job in the environment (called by Slurm, as root).

        \b
        Example (slurm.conf):
          Prolog=/usr/lib/slurm-coloc/hooks/prolog.sh
        where prolog.sh runs: coloc-hook prolog

        \f
        Args:
            hook: the hook's name (one of ``HOOK_NAMES``: ``prolog``, ``epilog``, ``task-prolog``, ...).

        Raises:
            Never raises: ``run_hook`` catches every error, logs it and returns.
        """
        from slurm_coloc.hooks.runner import run_hook
        lines = run_hook(hook)
        signal.signal(signal.SIGTERM,
                      signal.SIG_IGN)  # its line is logged: a late SIGTERM must not add another
        for line in lines:
            click.echo(line)

    return cli


def main() -> None:
    """Console-script entry: run the hook named by ``argv[1]`` and exit 0 whatever happened (errors are in
    hooks.log; a usage error is printed to stderr)."""
    signal.signal(signal.SIGTERM, _on_term_early)  # before any other import
    kept_out = _keep_numpy_out()
    try:
        import click
        try:
            _command().main(standalone_mode=False)  # type: ignore[attr-defined]
        except click.ClickException as exc:
            exc.show()
    except StartUpTerminated:
        _log_start_up_terminated(_hook_arg())
    except Exception as exc:  # never fail the node
        print(f"coloc-hook: {exc}", file=sys.stderr)
    finally:
        _let_numpy_in(kept_out)
    sys.exit(0)
