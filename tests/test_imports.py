"""Imports flow one way: no module of mazerl imports, directly or through others, a module that imports it
(function-level imports count: a circle hidden in a function is still a circle), and the layers named in
docs/layout.md hold (policy/ never imports rollout/, mazes/ never imports policy/, evaluation/ never imports
the trainer package rl/). Read from the source with `ast`, so nothing is imported to check it."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

import mazerl

PACKAGE = Path(mazerl.__file__).resolve().parent


def module_files() -> dict[str, Path]:
    """Every module of the installed package by dotted name (packages mapped from outside src/ included)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ["mazerl", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    for sub in ("components", "pipelines"):  # mapped into mazerl from the repository's top level
        spec = importlib.util.find_spec(f"mazerl.{sub}")
        if spec is None or spec.submodule_search_locations is None:
            continue
        root = Path(list(spec.submodule_search_locations)[0])
        for path in root.rglob("*.py"):
            parts = ["mazerl", sub, *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The mazerl modules `name` imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            candidates = [target] + [f"{target}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        else:
            continue
        found.update(c for c in candidates if c in known)
    found.discard(name)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    files = module_files()
    return {name: imported(name, path, set(files)) for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_the_package(graph):
    assert len(graph) > 60 and "mazerl.workflow" in graph and "mazerl.cli" in graph
    assert "mazerl.config" in graph["mazerl.profiles"]  # an import it has: the reader works


def test_no_module_imports_itself_through_others(graph):
    assert cycles(graph) == []


def test_cycles_are_found_when_there_is_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("lower, higher", [("mazerl.policy", "mazerl.rollout"), ("mazerl.mazes", "mazerl.policy"),
                                           ("mazerl.evaluation", "mazerl.rl"), ("mazerl.envs", "mazerl.policy")])
def test_a_lower_layer_never_imports_a_higher_one(graph, lower, higher):
    crossing = sorted(f"{a} -> {b}" for a, deps in graph.items() if a == lower or a.startswith(lower + ".")
                      for b in deps if b == higher or b.startswith(higher + "."))
    assert crossing == []
