"""Every command has --help with an example, and docs/cli.md is generated from the current help."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import gen_cli_docs

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", gen_cli_docs.console_scripts())
def test_help_has_example(name):
    text = gen_cli_docs.help_text(name)
    assert "Example" in text, f"{name} --help has no example:\n{text}"


@pytest.mark.slow
def test_cli_md_is_current():
    assert (REPO / "docs" / "cli.md").read_text() == gen_cli_docs.render(), \
        "docs/cli.md is stale: run .venv/bin/python scripts/gen_cli_docs.py"


def test_readme_has_two_commands_and_ci_calls_the_test_one():
    readme = (REPO / "README.md").read_text()
    blocks = [b.split("```", 1)[0].strip() for b in readme.split("```sh\n")[1:]]
    assert blocks == ["scripts/main.sh", "scripts/test.sh"]
    ci = (REPO / ".ci" / "run").read_text()
    assert "exec scripts/test.sh" in ci


def test_markdown_links_resolve():
    for md in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for part in md.read_text().split("](")[1:]:
            target = part.split(")", 1)[0].split("#", 1)[0]
            if not target or target.startswith(("http://", "https://", "mailto:")):
                continue
            assert (md.parent / target).exists(), f"{md.name}: broken link {target}"
