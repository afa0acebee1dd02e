"""Imports flow one way: every module's imports, read from its source (those inside functions too), go to its
own floor or one below, and no modules import each other in a circle. The floors, lowest first, are docs/layout.md's
layout table."""

from __future__ import annotations

import ast
from pathlib import Path

from rlperf.machine import REPO_ROOT

FLOORS = ("rlperf", "reference_trainer", "profilers", "decisions", "reports", "benches", "studies", "command")
# `python -m rlperf` runs the command: a script that no module imports, so it stands on the command's floor while
# the rest of rlperf/ stays the ground floor.
PLACED = {"rlperf.__main__": "command"}


def modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules that `name`'s source imports anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for target in targets:
            # `import a.b.c` loads a, a.b and a.b.c: the deepest project module named stands for them
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    known = modules(root, packages)
    return {name: imports(name, path, known) for name, path in known.items()}


def floor(name: str, floors: tuple[str, ...] = FLOORS) -> int:
    return floors.index(PLACED.get(name, name.split(".")[0]))


def upward(edges: dict[str, set[str]], floors: tuple[str, ...] = FLOORS) -> list[str]:
    return sorted(f"{source} -> {target}" for source, targets in edges.items() for target in targets
                  if floor(target, floors) > floor(source, floors))


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that reach each other through imports (Tarjan's strongly connected components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in edges.get(module, ()):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while not group or group[-1] != module:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return found


def project_graph() -> dict[str, set[str]]:
    edges = graph(REPO_ROOT, FLOORS)
    # the command table imports its subcommands' modules by name, when chosen
    from command.cli import SUBCOMMANDS

    edges["command.cli"] |= {module for module, _ in SUBCOMMANDS.values()}
    return edges


def test_no_module_imports_one_on_a_floor_above_its_own():
    assert upward(project_graph()) == []


def test_no_modules_import_each_other_in_a_circle():
    assert circles(project_graph()) == []


def test_nothing_imports_the_command_but_python_m_rlperf():
    edges = project_graph()
    assert "command.cli" in edges["rlperf.__main__"]
    assert not [source for source, targets in edges.items() if "rlperf.__main__" in targets]


def test_an_upward_import_and_a_circle_are_both_found(tmp_path):
    """The walk itself: a ground-floor module importing a floor above (inside a function, by a relative import
    of its sibling package's module) and two modules importing each other."""
    for path, text in {"low/__init__.py": "", "low/base.py": "def late():\n    from high import tool\n",
                       "high/__init__.py": "", "high/tool.py": "from . import other\nimport low.base\n",
                       "high/other.py": "from .tool import something\n"}.items():
        (tmp_path / path).parent.mkdir(exist_ok=True)
        (tmp_path / path).write_text(text)
    edges = graph(tmp_path, ("low", "high"))
    assert upward(edges, ("low", "high")) == ["low.base -> high", "low.base -> high.tool"]
    assert circles(edges) == [["high.other", "high.tool", "low.base"]]
