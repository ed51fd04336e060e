"""The package's shape rules that ruff does not state: no module over 400 lines, no function over 60 lines
(docstring included), and no help or docstring that names the issue or run a piece of code came from (that
history is docs/reliability.md's)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "slurm_coloc"
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 400
NOT_YET: tuple = ()  # functions allowed over the limit for now: none


def _functions():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield rel, node


def test_no_function_is_over_60_lines() -> None:
    long = [f"{rel}:{node.name} ({node.end_lineno - node.lineno + 1} lines)" for rel, node in _functions()
            if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
            and not any(f"{rel}:{node.name}".startswith(n) for n in NOT_YET)]
    assert long == [], "split these into named steps: " + ", ".join(long)


def test_no_module_is_over_400_lines() -> None:
    long = [f"{p.relative_to(PACKAGE).as_posix()} ({n} lines)" for p in sorted(PACKAGE.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    assert long == [], "split these into modules named for what they hold: " + ", ".join(long)


def test_a_too_long_function_is_found() -> None:
    """The rule above can fail: a 61-line function is counted as one."""
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    node = ast.parse(f"def f():\n{body}\n").body[0]
    assert node.end_lineno - node.lineno + 1 == 61 > MAX_FUNCTION_LINES


def test_no_docstring_names_an_issue_or_run() -> None:
    history = re.compile(r"\(issue \d+|issue \d+,? (run|N)\d*|\brun \d+\)")
    found = []
    for rel, node in [(p.relative_to(PACKAGE).as_posix(), ast.parse(p.read_text()))
                      for p in PACKAGE.rglob("*.py")]:
        for sub in ast.walk(node):
            if isinstance(sub, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(sub) or ""
                if history.search(doc):
                    found.append(f"{rel}:{getattr(sub, 'name', '<module>')}")
    assert found == []
