"""The import graph of every rockroll subpackage: no circles, dependencies one way.

Read from the source (``ast``), not by importing, so every import counts: top-level and
the lazy ones inside functions alike. Imports under ``if TYPE_CHECKING:`` do not run and
are left out. The layers: ``trainer -> gem/registry -> envhub -> sandbox`` (``rockroll``
itself, the umbrella with the CLI, may import any of them).
"""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
# What each subpackage may import of the others (itself always).
ALLOWED = {
    "rockroll.sandbox": set(),
    "rockroll.envhub": {"rockroll.sandbox"},
    "rockroll.gem": {"rockroll.registry", "rockroll.envhub", "rockroll.sandbox"},
    "rockroll.registry": {"rockroll.gem", "rockroll.envhub", "rockroll.sandbox"},
    "rockroll.trainer": {"rockroll.gem", "rockroll.registry", "rockroll.envhub", "rockroll.sandbox"},
}
# Known before this test existed, outside the sandbox: the trainer's split (issue #12,
# trainer/loop.py + roles.py) removes them; delete an entry once it is gone. Anything
# else is a new circle or a new upward import, and fails.


def modules() -> dict[str, Path]:
    """Every module of the distribution by dotted name (a package by its ``__init__``)."""
    found = {}
    for package, folder in PACKAGE_DIRS.items():
        base = ROOT / folder
        for path in base.rglob("*.py"):
            rel = path.relative_to(base).with_suffix("").parts
            parts = rel[:-1] if rel[-1] == "__init__" else rel
            found[".".join((package, *parts))] = path
    return found


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The rockroll modules ``name`` imports (``from pkg import mod`` counts as ``pkg.mod``)."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if _type_checking_only(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in known else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return {m for m in out if m in known}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module, or a module importing itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                connect(w)
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
            if len(component) > 1 or v in edges[v]:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(edges):
        if v not in index:
            connect(v)
    return found


def subpackage(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_the_walk_sees_every_subpackage_and_their_imports():
    edges = graph()
    assert {subpackage(m) for m in edges} >= set(ALLOWED) | {"rockroll"}
    # lazy imports inside functions count: the service is imported inside the CLI's serve command
    assert "rockroll.sandbox.server.app" in edges["rockroll.cli"]
    assert "rockroll.sandbox.storage.layers" in edges["rockroll.sandbox.base"]


def test_the_circle_finder_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"a"}}) == [["a"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles():
    assert circles(graph()) == []


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_dependencies_flow_one_way(package):
    wrong = sorted(f"{src} -> {dst}" for src, dsts in graph().items() if subpackage(src) == package
                   for dst in dsts if subpackage(dst) not in ALLOWED[package] | {package})
    assert wrong == []


def test_the_in_sandbox_agent_needs_only_the_standard_library():
    tree = ast.parse((ROOT / "sandbox" / "runtime" / "_agent.py").read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(tree))
    assert names - {"__future__"} <= set(sys.stdlib_module_names)


def _extra_closure(extras: dict[str, list[str]], name: str) -> set[str]:
    """The distribution names an extra installs, following ``rockroll[other]`` references."""
    import re

    out = set()
    for req in extras[name]:
        dist = re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower()
        if dist == "rockroll":
            for inner in re.search(r"\[(.*)\]", req).group(1).split(","):
                out |= _extra_closure(extras, inner.strip())
        else:
            out.add(dist)
    return out


def test_the_train_extra_brings_what_agent_training_runs():
    """Issue #41: `pip install rockroll[train]` then training `rock/Agent-v0` failed on a bare
    ModuleNotFoundError (uvicorn): the model service's packages come with the train extra."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    needs = _extra_closure(extras, "service")
    assert {"fastapi", "uvicorn", "httpx"} <= needs
    assert needs <= _extra_closure(extras, "train")


# The trainer's rooms, lowest first: a module imports only from its own room or from lower ones
# (the config reads the algorithm table to validate a run; the loop and train() sit on top).
TRAINER_ROOMS = [
    {"rockroll.trainer.algorithms"},
    {"rockroll.trainer.config", "rockroll.trainer.config_doc", "rockroll.trainer.envs", "rockroll.trainer.models"},
    {"rockroll.trainer.engines"},
    {"rockroll.trainer.rollout"},
    {"rockroll.trainer.roles"},
    {"rockroll.trainer.loop", "rockroll.trainer.controller", "rockroll.trainer.sft", "rockroll.trainer"},
]


def trainer_room(module: str) -> int:
    """The floor of ``module``'s room in :data:`TRAINER_ROOMS` (a room is a subpackage of the
    trainer, or a module at its top)."""
    name = ".".join(module.split(".")[:3])
    floors = [i for i, room in enumerate(TRAINER_ROOMS) if name in room]
    assert floors, f"{module} is in no room of TRAINER_ROOMS"
    return floors[0]


def test_the_trainer_rooms_depend_one_way():
    edges = {src: dsts for src, dsts in graph().items() if subpackage(src) == "rockroll.trainer"}
    assert len(edges) > 20
    up = sorted(f"{src} -> {dst}" for src, dsts in edges.items() for dst in dsts
                if subpackage(dst) == "rockroll.trainer" and trainer_room(dst) > trainer_room(src))
    assert up == []
