"""``python -m slurm_coloc COMMAND [ARGS]...`` runs ``coloc-COMMAND [ARGS]...``.

Without a command (or with ``-h``/``--help``) it prints the commands and exits 0; ``--version`` prints the
version. An unknown command is one error line on stderr and exit 2. The command's module is imported only
when that command runs, so ``python -m slurm_coloc --help`` imports neither click nor torch.
"""
from __future__ import annotations

import importlib
import sys
from typing import Dict, List, Optional, Tuple

from slurm_coloc import __version__

#: command -> (entry point "module:function", one-line summary); the same entry points as pyproject.toml's
#: [project.scripts] ``coloc-<command>`` (tests/test_main.py checks it).
COMMANDS: Dict[str, Tuple[str, str]] = {
    "sbatch": ("slurm_coloc.cli.sbatch:main", "sbatch with the GPU memory estimate as a shard request"),
    "estimate": ("slurm_coloc.cli.estimate:main", "print the peak GPU memory a training job will hold"),
    "report": ("slurm_coloc.cli.report:main", "usage per job, user, GPU, node and cluster; plots"),
    "admin": ("slurm_coloc.cli.admin:main", "check a node and the cluster config for slurm-coloc"),
    "sampler": ("slurm_coloc.cli.sampler:main", "the node NVML sampler daemon, recorder and status"),
    "hook": ("slurm_coloc.cli.hook:main", "the entry point of the Prolog/Epilog shims (admins)"),
    "replay": ("slurm_coloc.cli.replay:main", "replay a CARMA/Philly trace, exclusive vs collocated"),
    "placer": ("slurm_coloc.cli.placer:main",
               "steer held shard jobs to GPUs by measured utilization (admins)"),
}


def usage() -> str:
    """The text ``python -m slurm_coloc --help`` prints."""
    width = max(len(c) for c in COMMANDS)
    lines = ["usage: python -m slurm_coloc COMMAND [ARGS]...", "",
             f"slurm-coloc {__version__}: pack small deep-learning training jobs onto shared GPUs.",
             "python -m slurm_coloc COMMAND ARGS runs coloc-COMMAND ARGS (see coloc-COMMAND --help).", "",
             "Commands:"]
    lines += [f"  {name:<{width}}  {summary} (coloc-{name})" for name, (_, summary) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    """Run ``argv``'s (default ``sys.argv[1:]``) command with ``sys.argv = ["coloc-<command>", *args]``, as
    its console script would (a click command also gets that program name); returns the exit status (0 for
    help and ``--version``, 2 for an unknown command) or exits through the command's ``SystemExit``."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if args[0] == "--version":
        print(f"slurm-coloc {__version__}")
        return 0
    entry = COMMANDS.get(args[0])
    if entry is None:
        print(f"python -m slurm_coloc: error: unknown command {args[0]!r} (one of: {', '.join(COMMANDS)})",
              file=sys.stderr)
        return 2
    module, func = entry[0].split(":")
    prog = f"coloc-{args[0]}"
    sys.argv = [prog, *args[1:]]
    fn = getattr(importlib.import_module(module), func)
    if callable(getattr(fn, "main", None)):  # a click command: give it the console script's name in --help
        result = fn.main(args=args[1:], prog_name=prog)
    else:
        result = fn()
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
