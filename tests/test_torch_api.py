"""The code runs on every torch from rlperf.torch_api.TORCH_FLOOR up, checked without installing an old torch:
the code's syntax tree is walked for every torch name and keyword it uses, API newer than the floor must be
reached through a guard, and a name nobody has checked against the floor fails until someone has."""

import ast
import re
import sys
from pathlib import Path

import pytest
import torch

from rlperf import machine
from rlperf.errors import BadInput, MachineFault
from rlperf.torch_api import TORCH_FLOOR, VERSIONED_API, release, supported_torch, torch_has

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("rlperf", "reference_trainer", "profilers", "decisions", "reports", "benches", "studies", "command", "tests")
# Every torch name, method of what a torch call returns (`()`), and keyword the code uses, each checked present
# in torch TORCH_FLOOR (its wheel's Python sources and type stubs); VERSIONED_API holds the rest.
AT_FLOOR = ROOT / "tests" / "torch_api_at_floor.txt"
GATED = {api: since for api, since in VERSIONED_API.items() if since.release > TORCH_FLOOR}


def sources() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(), str(path))
            for folder in FOLDERS for path in sorted((ROOT / folder).rglob("*.py"))}


def torch_aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> torch path, from every import in the file (`import torch.distributed as dist`)."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch":
                    aliases[alias.asname or "torch"] = alias.name if alias.asname else "torch"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "torch":
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return aliases


def torch_path(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """`torch.cuda.get_device_properties().uuid` for `torch.cuda.get_device_properties(i).uuid`."""
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    if isinstance(node, ast.Attribute):
        base = torch_path(node.value, aliases)
        return base and f"{base}.{node.attr}"
    if isinstance(node, ast.Call):
        base = torch_path(node.func, aliases)
        return base and f"{base}()"
    return None


def torch_uses(tree: ast.Module) -> dict[str, int]:
    """Every torch path and keyword (`torch.optim.Adam(fused=)`) the file uses -> the first line using it."""
    aliases, uses = torch_aliases(tree), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (path := torch_path(node, aliases)):
            uses.setdefault(path, node.lineno)
        elif isinstance(node, ast.Call) and node.keywords and (path := torch_path(node.func, aliases)):
            for keyword in node.keywords:
                if keyword.arg:
                    uses.setdefault(f"{path}({keyword.arg}=)", node.lineno)
    return uses


def at_floor() -> set[str]:
    return {line.strip() for line in AT_FLOOR.read_text().splitlines() if line.strip() and not line.startswith("#")}


def scopes(tree: ast.Module):
    """The module and every function, each with the nodes that belong to it and not to a function inside it."""
    def own_nodes(scope):
        for child in ast.iter_child_nodes(scope):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield child
                yield from own_nodes(child)

    yield tree, list(own_nodes(tree))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield node, list(own_nodes(node))


def constant_args(call: ast.Call) -> list:
    return [arg.value for arg in call.args if isinstance(arg, ast.Constant)]


def unguarded_uses(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, API) of each use of API newer than the floor that no guard protects. Guarded: `getattr(x, name,
    default)`, `hasattr(x, name)`, or any use in a function that asks `torch_has(api)` first."""
    by_name = {api.rpartition(".")[2]: api for api in GATED}
    found = []
    for _, nodes in scopes(tree):
        asked = {value for node in nodes if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                 and node.func.id == "torch_has" for value in constant_args(node)}
        for node in nodes:
            if isinstance(node, ast.Attribute) and node.attr in by_name:
                name = node.attr
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in ("getattr", "setattr") and len(node.args) >= 2
                  and isinstance(node.args[1], ast.Constant) and node.args[1].value in by_name):
                name = node.args[1].value
                if node.func.id == "getattr" and len(node.args) == 3:
                    continue
            else:
                continue
            if by_name[name] not in asked:
                found.append((node.lineno, by_name[name]))
    return found


def test_the_declared_floor_is_the_one_the_code_is_checked_against():
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    [declared] = [re.fullmatch(r"torch>=(\d+)\.(\d+)", spec) for spec in dependencies if spec.startswith("torch")]
    assert declared and tuple(map(int, declared.groups())) == TORCH_FLOOR


def test_every_torch_name_the_code_uses_has_been_checked_against_the_floor():
    floor = ".".join(map(str, TORCH_FLOOR))
    unchecked = sorted(f"{path.relative_to(ROOT)}:{line}: {api}" for path, tree in sources().items()
                       for api, line in torch_uses(tree).items() if api not in at_floor() and api not in VERSIONED_API)
    assert not unchecked, (
        f"torch API not yet checked against torch {floor}: if torch {floor} has it, add it to {AT_FLOOR.name}; "
        f"if not, add it to rlperf.torch_api.VERSIONED_API with its release and evidence, and reach it through "
        f"torch_has or getattr with a default:\n" + "\n".join(unchecked))


def test_api_newer_than_the_floor_is_only_reached_through_a_guard():
    unguarded = [f"{path.relative_to(ROOT)}:{line}: {api} (torch {'.'.join(map(str, GATED[api].release))})"
                 for path, tree in sources().items() for line, api in unguarded_uses(tree)]
    assert not unguarded, "newer than the floor, used without torch_has or getattr(..., default):\n" + "\n".join(
        unguarded)


def test_the_guard_walker_sees_an_unguarded_use_and_accepts_guarded_ones():
    def uses(code: str) -> list[tuple[int, str]]:
        return unguarded_uses(ast.parse(code))

    api = "torch.backends.cudnn.rnn.fp32_precision"
    assert uses("def f(rnn):\n    return rnn.fp32_precision\n") == [(2, api)]
    assert uses("def f(rnn):\n    setattr(rnn, 'fp32_precision', 'ieee')\n") == [(2, api)]
    assert uses(f"def f(rnn):\n    if torch_has({api!r}):\n        return rnn.fp32_precision\n") == []
    assert uses("def f(rnn):\n    return getattr(rnn, 'fp32_precision', None)\n") == []
    # a guard in another function protects nothing here
    assert uses(f"def g():\n    torch_has({api!r})\ndef f(rnn):\n    return rnn.fp32_precision\n") == [(4, api)]


def test_torch_has_is_asked_only_of_listed_api_newer_than_the_floor():
    asked = {value for tree in sources().values() for node in ast.walk(tree)
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "torch_has"
             for value in constant_args(node)}
    assert asked and asked <= set(GATED)
    for api in GATED:
        assert torch_has(api) == (release(torch.__version__) >= VERSIONED_API[api].release), api
    at_the_floor = "torch.cuda.get_device_properties().uuid"  # used directly, never asked about
    with pytest.raises(KeyError):
        torch_has(at_the_floor)


@pytest.mark.parametrize("version, expected", [("2.5.1+cu124", (2, 5)), ("2.6.0a0+ecf3bae40a.nv25.01", (2, 6)),
                                               ("2.13.0", (2, 13))])
def test_releases_read_from_version_strings(version, expected):
    assert release(version) == expected


def test_a_torch_below_the_floor_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.4.1+cu121")
    with pytest.raises(BadInput) as refused:
        supported_torch()
    assert str(refused.value) == ("torch: 2.4.1+cu121 is older than 2.5, the oldest rlperf supports "
                                  "(allowed: torch 2.5 or newer)")
    monkeypatch.setattr(torch, "__version__", "2.5.0")
    supported_torch()


def test_the_probe_says_in_one_line_why_it_cannot_describe_this_torch(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch, "__version__", "2.4.1")
    assert machine.main() == machine.BAD_TORCH
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("torch: 2.4.1 is older than 2.5")

    def python_that_fails(exit_code: int, line: str) -> str:
        script = tmp_path / f"python{exit_code}"
        script.write_text(f"#!/bin/sh\necho 'a warning first' >&2\necho '{line}' >&2\nexit {exit_code}\n")
        script.chmod(0o755)
        return str(script)

    with pytest.raises(BadInput, match=r"^torch: 2.4.1 is older than 2.5$"):
        machine.probe(python_that_fails(machine.BAD_TORCH, "torch: 2.4.1 is older than 2.5"))
    with pytest.raises(MachineFault, match=r"^torch: `.*python1 -m rlperf.machine` failed: RuntimeError: no driver$"):
        machine.probe(python_that_fails(1, "RuntimeError: no driver"))


def test_before_torch_2_9_full_fp32_rnns_are_asked_of_cudnns_one_switch(monkeypatch):
    from reference_trainer import policy

    monkeypatch.setattr(policy, "torch_has", lambda api: False)  # a torch without rnn.fp32_precision
    before = torch.backends.cudnn.allow_tf32
    with policy.full_fp32_rnn():
        assert torch.backends.cudnn.allow_tf32 is False
    assert torch.backends.cudnn.allow_tf32 == before
