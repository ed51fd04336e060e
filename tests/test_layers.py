"""The package's import layers, read from the source with ``ast`` (every import, also inside functions).

Rules (DEVELOPERS.md, docs/design.md): data flows down the layers below and nothing imports upwards or
sideways; there are no import cycles between modules; each outside system has one gateway (click: ``cli/``;
rich: ``report/render.py``; pynvml: ``nvml/``; prometheus_client: ``node/exporter.py``; Slurm's commands:
``slurm/``); research code (scikit-learn) stays out of the package.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Set

PKG = Path(__file__).resolve().parents[1] / "slurm_coloc"

#: Subpackage (or top-level module) -> layer; a part may import only parts of a lower layer.
LAYER = {
    "errors": 0,
    "atomic": 1, "units": 1, "config": 1, "comment": 1, "userfiles": 1, "coruns": 1,
    "slurm": 2, "nvml": 2, "estimate": 2, "probe": 3,
    "store": 3,
    "node": 4, "report": 4, "submit": 4, "placement": 4,
    "hooks": 5, "admin": 5, "replay": 5,
    "cli": 6,
    "__main__": 7,
}
GATEWAYS = {"click": ("slurm_coloc.cli",), "rich": ("slurm_coloc.report.render",),
            "pynvml": ("slurm_coloc.nvml",), "prometheus_client": ("slurm_coloc.node.exporter",)}
#: Slurm's client commands: only ``slurm/`` runs them (``slurm/run.py``).
SLURM_COMMANDS = frozenset({"sbatch", "squeue", "scontrol", "scancel", "sacct", "sacctmgr", "sinfo", "srun",
                            "salloc", "sattach", "sstat", "sreport", "sprio", "sshare", "sdiag", "strigger",
                            "sbcast"})
#: Calls that start a program from an argv: ``subprocess.*``, ``os.exec*``/``os.spawn*``/``os.posix_spawn*``.
_SPAWNERS = ("subprocess.", "os.exec", "os.spawn", "os.posix_spawn")
NEVER = ("sklearn",)


def _modules() -> Dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(path: Path) -> Set[str]:
    """Absolute names imported anywhere in ``path``; ``from pkg import sub`` counts as ``pkg.sub``."""
    names: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            mod = node.module or ""
            subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in MODULES]
            names.update(subs if len(subs) == len(node.names) else [mod, *subs])
    return names


def _internal(name: str) -> str:
    """The package module ``name`` lives in (``slurm_coloc.estimate.spec.ModelSpec`` -> ``...spec``)."""
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


IMPORTS = {mod: _imports(path) for mod, path in MODULES.items()}
GRAPH = {mod: {_internal(n) for n in names if n.startswith("slurm_coloc.")} - {mod}
         for mod, names in IMPORTS.items()}


def _part(mod: str) -> str:
    return mod.split(".")[1] if "." in mod else "(root)"


def test_every_part_has_a_layer() -> None:
    assert {_part(m) for m in MODULES} - {"(root)"} <= set(LAYER), "add new subpackages to LAYER"


def test_imports_go_down_the_layers() -> None:
    wrong = sorted(f"{a} -> {b}" for a, bs in GRAPH.items() for b in bs
                   if _part(a) != _part(b) and _part(a) in LAYER and _part(b) in LAYER
                   and LAYER[_part(b)] >= LAYER[_part(a)])
    assert not wrong, "imports up or sideways: " + ", ".join(wrong)


def test_estimate_imports_only_errors() -> None:
    out = sorted(f"{a} -> {b}" for a, bs in GRAPH.items() if _part(a) == "estimate" for b in bs
                 if _part(b) not in ("estimate", "errors"))
    assert not out, out


def test_no_import_cycles() -> None:
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    cycles: List[List[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert not cycles, cycles


def test_gateways() -> None:
    users: Dict[str, Set[str]] = defaultdict(set)
    for mod, names in IMPORTS.items():
        for name in names:
            users[name.split(".")[0]].add(mod)
    for lib, allowed in GATEWAYS.items():
        outside = sorted(m for m in users[lib] if not any(m == a or m.startswith(a + ".") for a in allowed))
        assert not outside, f"{lib} imported outside {allowed}: {outside}"
    for lib in NEVER:
        assert not users[lib], f"{lib} imported by {sorted(users[lib])}"


def _slurm_commands_run(path: Path) -> List[str]:
    """``line: call`` of every place ``path`` runs a Slurm command itself: a spawning call (``_SPAWNERS``)
    whose argv literal starts with a name in ``SLURM_COMMANDS`` (also a path to one), or an import of
    ``slurm.run.run``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module == "slurm_coloc.slurm.run" \
                and any(a.name == "run" for a in node.names):
            out.append(f"{node.lineno}: imports slurm.run.run")
        if not isinstance(node, ast.Call) or not node.args \
                or not ast.unparse(node.func).startswith(_SPAWNERS):
            continue
        argv = node.args[0]
        first = argv.elts[0] if isinstance(argv, (ast.List, ast.Tuple)) and argv.elts else None
        if isinstance(first, ast.Constant) and isinstance(first.value, str) \
                and first.value.rsplit("/", 1)[-1] in SLURM_COMMANDS:
            out.append(f"{node.lineno}: {ast.unparse(node)[:80]}")
    return out


def test_slurm_commands_run_only_in_slurm() -> None:
    found = {mod: _slurm_commands_run(path) for mod, path in MODULES.items() if _part(mod) != "slurm"}
    assert not {m: f for m, f in found.items() if f}, found


def test_the_controller_hooks_do_not_load_the_report_pipeline() -> None:
    """EpilogSlurmctld records the figures the node Epilog computed (hooks/figures.py): nothing the controller
    hooks import, at any depth (imports inside functions included), is in ``report/``."""
    seen: Set[str] = set()
    todo = ["slurm_coloc.hooks.ctld"]
    while todo:
        mod = todo.pop()
        if mod not in seen:
            seen.add(mod)
            todo.extend(GRAPH[mod])
    assert "slurm_coloc.store.summaries" in seen  # the node figures AdminComment is written from
    assert not sorted(m for m in seen if _part(m) == "report" or m == "slurm_coloc.hooks.figures")


def _reached(root: str) -> Set[str]:
    """Every package module ``root`` imports, at any depth (imports inside functions included)."""
    seen: Set[str] = set()
    todo = [root]
    while todo:
        mod = todo.pop()
        if mod not in seen:
            seen.add(mod)
            todo.extend(GRAPH[mod])
    return seen


def test_the_node_hooks_load_only_the_reports_facts() -> None:
    """The node Prolog/Epilog/TaskProlog (root; hooks/runner.py) record facts: of ``report/`` they reach only
    ``report/facts.py`` (``store/`` reads for the AdminComment figures), never the findings, diagnosis, usage
    or rendering (judgement runs as the user who asks: coloc-report, the reader service)."""
    for root in ("slurm_coloc.hooks.runner", "slurm_coloc.hooks.node"):
        seen = _reached(root)
        assert "slurm_coloc.hooks.figures" in seen, root
        assert sorted(m for m in seen if _part(m) == "report") == ["slurm_coloc.report.facts"], root
    assert {_part(m) for m in GRAPH["slurm_coloc.report.facts"]} <= {"store", "units"}


def test_the_rules_see_a_violation(tmp_path: Path) -> None:
    """The walker finds an upward import and a cycle in code written like the package's."""
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from slurm_coloc.cli import estimate\n    import click\n")
    assert {"slurm_coloc.cli.estimate", "click"} <= _imports(src)
    src.write_text("import subprocess\nfrom slurm_coloc.slurm.run import run as r\n"
                   "subprocess.run(['/usr/bin/scancel', '5'])\nshlex.join(['sbatch', 'x'])\n")
    assert [f.split(":")[0] for f in _slurm_commands_run(src)] == ["2", "3"]
