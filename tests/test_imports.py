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
    # adapters for other trainers: they serve envs, so they stand beside the trainer, not on it;
    # nothing else may import them (no other entry lists them)
    "rockroll.integrations": {"rockroll.gem", "rockroll.registry", "rockroll.envhub", "rockroll.sandbox"},
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


def imports_of(name: str, path: Path, known: dict[str, Path], *, type_checking: bool = False) -> set[str]:
    """The rockroll modules ``name`` imports (``from pkg import mod`` counts as ``pkg.mod``);
    ``type_checking``: those under ``if TYPE_CHECKING:`` too."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if not type_checking and _type_checking_only(node):
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


def graph(*, type_checking: bool = False) -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known, type_checking=type_checking) for name, path in known.items()}


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


# ------------------------------------------------------------------ inside rockroll.sandbox
# Its rooms, lowest floor first. A module may import its own room and the rooms of lower
# floors, never a room of its own floor or a higher one. Annotations count (imports under
# ``if TYPE_CHECKING:``): a type a low room names is still a room it depends on.
SANDBOX_FLOORS: list[tuple[str, ...]] = [
    ("errors", "lifecycle", "home", "protocol", "protocol.frames", "protocol.tokens"),  # ground: no rockroll import
    ("egress",),             # EgressPolicy, address classes (the spec's network policy)
    ("spec",),               # SandboxSpec, CommandResult, Snapshot
    ("protocol.wire",),      # the HTTP models of rockroll serve and its SDK
    ("guest",),              # pid 1 of a sandbox: the standard library and protocol.frames only
    ("storage",),            # layers, snapshots, temps, limits
    ("factory",),            # the backend table: classes named as strings
    ("terminal",),           # AsyncTerminal: the contract of a terminal in a sandbox
    ("base",),               # the contract, AsyncSandbox
    ("sync",),               # the sync twin
    ("pool",),               # the generic pool
    ("modelservice",),       # the model service (answers sandboxes' model calls)
    ("deployment",),         # where sandboxes run
    ("runtime", "server"),   # clients of one sandbox; the HTTP service (neither imports the other)
    ("",),                   # the package's __init__: the public API
]
# What pid 1 of a sandbox runs of rockroll (``python -S -E``): its package, the frames of
# the protocol, and the (empty) ``__init__`` of the protocol's package.
GUEST_MAY_IMPORT = ("rockroll.sandbox.guest", "rockroll.sandbox.protocol.frames")
GUEST_RUNS = ("rockroll.sandbox.protocol",)


def room(module: str) -> str:
    """The room of a ``rockroll.sandbox`` module: the longest room name it starts with."""
    rel = module.removeprefix("rockroll.sandbox").lstrip(".")
    rooms = [r for floor in SANDBOX_FLOORS for r in floor if rel == r or (r and rel.startswith(r + "."))]
    assert rooms, f"{module} is in no room: add its room to SANDBOX_FLOORS"
    return max(rooms, key=len)


def floor_of(room_name: str) -> int:
    return next(level for level, floor in enumerate(SANDBOX_FLOORS) if room_name in floor)


def arrows_against_the_floors(edges: dict[str, set[str]]) -> list[str]:
    """``src -> dst`` for each import inside rockroll.sandbox that reaches a room on the
    same floor or a higher one (a room's own modules excepted)."""
    wrong = []
    for src, dsts in edges.items():
        if src != "rockroll.sandbox" and not src.startswith("rockroll.sandbox."):
            continue
        for dst in dsts:
            if dst != "rockroll.sandbox" and not dst.startswith("rockroll.sandbox."):
                continue
            a, b = room(src), room(dst)
            if a != b and floor_of(b) >= floor_of(a):
                wrong.append(f"{src} -> {dst}")
    return sorted(wrong)


def sandbox_graph() -> dict[str, set[str]]:
    return {m: d for m, d in graph(type_checking=True).items() if m.startswith("rockroll.sandbox")}


def test_every_sandbox_module_is_in_a_room_on_a_floor():
    assert {room(m) for m in sandbox_graph()} == {r for floor in SANDBOX_FLOORS for r in floor}


def test_the_floor_check_finds_an_arrow_up_and_one_across():
    edges = {"rockroll.sandbox.deployment.disk": {"rockroll.sandbox.guest.layers", "rockroll.sandbox.runtime.guest"},
             "rockroll.sandbox.runtime.guest": {"rockroll.sandbox.server.fleet", "rockroll.sandbox.runtime.batch"},
             "rockroll.sandbox.base": {"rockroll.sandbox.factory"}}
    assert arrows_against_the_floors(edges) == ["rockroll.sandbox.deployment.disk -> rockroll.sandbox.runtime.guest",
                                                "rockroll.sandbox.runtime.guest -> rockroll.sandbox.server.fleet"]


def test_no_arrow_runs_up_or_across_inside_the_sandbox():
    assert arrows_against_the_floors(sandbox_graph()) == []


def test_no_circle_inside_the_sandbox_even_through_annotations():
    assert circles(sandbox_graph()) == []


def test_the_guest_needs_only_the_standard_library():
    """pid 1 of a sandbox runs with ``python -S -E``: its modules may import the standard
    library, each other and the frames of the protocol, nothing else."""
    known = modules()
    shipped = [m for m in known if m.startswith(GUEST_MAY_IMPORT) or m in GUEST_RUNS]
    assert "rockroll.sandbox.protocol.frames" in shipped and len(shipped) > 2
    for name in shipped:
        tree = ast.parse(known[name].read_text())
        absolute = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        absolute |= {n.module.split(".")[0] for n in ast.walk(tree)
                     if isinstance(n, ast.ImportFrom) and n.module and not n.level}
        assert absolute - {"__future__", "rockroll"} <= set(sys.stdlib_module_names), name  # rockroll: see ours
        ours = imports_of(name, known[name], known, type_checking=True)
        assert all(m.startswith(GUEST_MAY_IMPORT) for m in ours), (name, ours)


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
    {"rockroll.trainer.config", "rockroll.trainer.config_doc", "rockroll.trainer.envs", "rockroll.trainer.models",
     "rockroll.trainer.model_store"},
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
