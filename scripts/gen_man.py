#!/usr/bin/env python3
"""Write a man page (section 1) for every console script of pyproject.toml from its --help text (and each
subcommand's), so the pages cannot drift from the CLI. Used by scripts/build_deb.sh; the commands are run from
the bin directory of the Python that runs this script.

Usage: <venv>/bin/python scripts/gen_man.py OUT_DIR      (writes OUT_DIR/coloc-*.1)
"""
from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parents[1]


def console_scripts() -> Dict[str, str]:
    """``{"coloc-admin": "slurm_coloc.cli.admin:main", ...}`` from pyproject.toml's [project.scripts]."""
    out: Dict[str, str] = {}
    section = ""
    for line in (REPO / "pyproject.toml").read_text().splitlines():
        if line.startswith("["):
            section = line.strip()
        elif section == "[project.scripts]" and "=" in line:
            name, target = (x.strip().strip('"') for x in line.split("=", 1))
            out[name] = target
    return out


def help_text(argv: List[str]) -> str:
    exe = Path(sys.executable).parent / argv[0]
    env = {**os.environ, "COLUMNS": "100", "TERM": "dumb", "COLOC_CONFIG": os.devnull}
    proc = subprocess.run([str(exe), *argv[1:], "--help"], capture_output=True, text=True, env=env,
                          timeout=120)
    return (proc.stdout or proc.stderr).rstrip()


def subcommands(target: str) -> List[str]:
    """Names of the subcommands when the entry point's module has a click group ``cli``."""
    module = importlib.import_module(target.split(":")[0])
    group = getattr(module, "cli", None)
    commands = getattr(group, "commands", None)
    return sorted(commands) if isinstance(commands, dict) else []


def roff(text: str) -> str:
    """Preformatted roff of plain text: backslashes escaped, lines starting with . or ' protected."""
    lines = []
    for line in text.replace("\\", "\\e").splitlines():
        lines.append("\\&" + line if line.startswith((".", "'")) else line)
    return ".nf\n" + "\n".join(lines) + "\n.fi\n"


def page_summary(help_out: str) -> str:
    """The NAME line's text: the first sentence of the first paragraph after the ``Usage:`` block (which
    click wraps over several lines: a wrapped usage line is not the summary)."""
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", help_out) if p.strip()]
    text = next((p for p in paragraphs if not p.startswith("Usage")), "slurm-coloc command")
    return " ".join(text.split()).split(". ")[0].rstrip(".")


def page(name: str, target: str, version: str) -> str:
    main = help_text([name])
    summary = page_summary(main)
    parts = [f'.TH {name.upper()} 1 "" "slurm-coloc {version}" "slurm-coloc"\n',
             f".SH NAME\n{name} \\- {summary}\n", ".SH DESCRIPTION\n", roff(main)]
    subs = subcommands(target)
    if subs:
        parts.append(".SH COMMANDS\n")
        for sub in subs:
            parts += [f".SS {name} {sub}\n", roff(help_text([name, sub]))]
    others = ", ".join(f"\\fB{n}\\fR(1)" for n in sorted(console_scripts()) if n != name)
    parts.append(".SH FILES\n/etc/slurm-coloc/coloc.yaml (\\fBcoloc-admin config\\fR prints the effective "
                 "values)\n"
                 f".SH SEE ALSO\n{others}; /usr/share/doc/slurm-coloc/\n")
    return "".join(parts)


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    version = re.search(r'__version__ = "(.*)"', (REPO / "slurm_coloc" / "__init__.py").read_text())
    for name, target in console_scripts().items():
        (out / f"{name}.1").write_text(page(name, target, version.group(1) if version else "?"))
    print(f"gen_man.py: wrote {len(console_scripts())} pages to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
