"""Bug injection by AST mutation: the candidate bugs of ``rockroll envs build-swe``.

:func:`find_mutations` walks a Python module and proposes small, plausible bugs, each a
:class:`Mutation`: one slice of the source text replaced by another, so everything else in
the file (comments, formatting) stays as the authors wrote it and the diff is the bug.

Kinds (the bugs people actually write):

- ``flip-comparison``: ``<`` <-> ``>=``, ``<=`` <-> ``>``, ``==`` <-> ``!=``, ``in`` <->
  ``not in``, ``is`` <-> ``is not``;
- ``off-by-one``: ``x + 1`` / ``x - 1`` lose their ``1``; an integer index or slice bound
  moves by one (``s[1:]`` -> ``s[2:]``, ``s[-1]`` -> ``s[-2]``);
- ``swap-args``: the first two positional arguments of a call trade places;
- ``remove-branch``: an ``if`` without ``else`` (typically a guard clause) becomes ``pass``;
- ``wrong-constant``: ``True`` <-> ``False``, an integer constant ``k`` becomes ``k + 1``.

Which candidates make *tasks* is decided by running the tests (``rockroll.gem.swe_build``):
a mutation must break some tests and leave others passing. Everything here is a pure
function of the source text.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import re
from dataclasses import dataclass

__all__ = ["KINDS", "Mutation", "find_mutations", "unified_diff"]

KINDS = ("flip-comparison", "off-by-one", "swap-args", "remove-branch", "wrong-constant")

_FLIP = {ast.Lt: ">=", ast.GtE: "<", ast.LtE: ">", ast.Gt: "<=", ast.Eq: "!=", ast.NotEq: "==",
         ast.In: "not in", ast.NotIn: "in", ast.Is: "is not", ast.IsNot: "is"}
_OP_TEXT = {ast.Lt: "<", ast.GtE: ">=", ast.LtE: "<=", ast.Gt: ">", ast.Eq: "==", ast.NotEq: "!=",
            ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}


@dataclass(frozen=True)
class Mutation:
    """Replace ``source[start:end]`` (which reads ``before``) with ``after``."""

    file: str       # path relative to the repository root
    kind: str       # one of KINDS
    line: int       # 1-based line of the change
    function: str   # enclosing function or class path ("" at module level)
    start: int      # character offsets into the file's text
    end: int
    before: str
    after: str

    @property
    def id(self) -> str:
        """Stable short name: the same mutation of the same file always has the same id."""
        key = f"{self.file}\0{self.start}\0{self.end}\0{self.after}".encode()
        return hashlib.sha256(key).hexdigest()[:8]

    def apply(self, source: str) -> str:
        if source[self.start:self.end] != self.before:
            raise ValueError(f"{self.file}:{self.line}: the source does not read {self.before!r} there")
        return source[:self.start] + self.after + source[self.end:]


def unified_diff(path: str, old: str, new: str) -> str:
    """A ``git apply``-able diff of one file (``a/`` and ``b/`` prefixes); an empty ``old``
    creates the file, an empty ``new`` deletes it."""
    mode = "new file mode 100644\n" if not old else "deleted file mode 100644\n" if not new else ""
    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                 "/dev/null" if not old else f"a/{path}", "/dev/null" if not new else f"b/{path}", n=3)
    text = "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)
    return f"diff --git a/{path} b/{path}\n{mode}{text}" if text else ""


class _Offsets:
    """AST positions (line, UTF-8 byte column) to character offsets."""

    def __init__(self, source: str):
        self.lines = source.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def at(self, lineno: int, col: int) -> int:
        line = self.lines[lineno - 1]
        return self.starts[lineno - 1] + len(line.encode()[:col].decode(errors="ignore"))

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.at(node.lineno, node.col_offset), self.at(node.end_lineno, node.end_col_offset)


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants (never mutated: they are not behaviour)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def find_mutations(path: str, source: str) -> list[Mutation]:
    """Every candidate mutation of ``source`` (the text of ``path``), in source order.

    Unparseable sources give no candidates. Each candidate's result is checked to parse.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    pos = _Offsets(source)
    skip = _docstrings(tree)
    out: list[Mutation] = []

    def add(kind: str, node: ast.AST, function: str, start: int, end: int, after: str) -> None:
        before = source[start:end]
        if before == after:
            return
        candidate = Mutation(path, kind, node.lineno, function, start, end, before, after)
        try:
            ast.parse(candidate.apply(source))
        except SyntaxError:
            return
        out.append(candidate)

    def visit(node: ast.AST, function: str, in_annotation: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            function = f"{function}.{node.name}" if function else node.name
        if not in_annotation:
            _propose(node, function)
        for name, value in ast.iter_fields(node):
            annotation = in_annotation or name in ("annotation", "returns")
            for child in value if isinstance(value, list) else [value]:
                if isinstance(child, ast.AST):
                    visit(child, function, annotation)

    def _propose(node: ast.AST, function: str) -> None:
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _FLIP:
            # Only the operator changes: the text between the two operands, minus brackets.
            a = pos.span(node.left)[1]
            b = pos.span(node.comparators[0])[0]
            between = source[a:b]
            op = _OP_TEXT[type(node.ops[0])]
            core = re.sub(r"\s+", " ", between.strip(" \t\n()\\"))
            if core == op:
                at = between.index(op.split()[0])
                old = re.match(r"not\s+in|is\s+not|[<>=!]=?|in|is", between[at:]).group(0)
                add("flip-comparison", node, function, a + at, a + at + len(old), _FLIP[type(node.ops[0])])
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)) \
                and isinstance(node.right, ast.Constant) and node.right.value == 1 and type(node.right.value) is int:
            start, end = pos.span(node)
            add("off-by-one", node, function, start, end, source[slice(*pos.span(node.left))])
        elif isinstance(node, ast.Subscript):
            bounds = ([node.slice.lower, node.slice.upper] if isinstance(node.slice, ast.Slice) else [node.slice])
            for bound in bounds:
                value = _int_literal(bound)
                if value is not None:
                    start, end = pos.span(bound)
                    add("off-by-one", bound, function, start, end, str(value + 1 if value >= 0 else value - 1))
        elif isinstance(node, ast.Call) and len(node.args) >= 2 \
                and not any(isinstance(a, ast.Starred) for a in node.args[:2]):
            (s0, e0), (s1, e1) = pos.span(node.args[0]), pos.span(node.args[1])
            first, second = source[s0:e0], source[s1:e1]
            if first != second and "\n" not in source[s0:e1]:
                add("swap-args", node, function, s0, e1, second + source[e0:s1] + first)
        elif isinstance(node, ast.If) and not node.orelse and len(node.body) <= 3:
            start, end = pos.span(node)
            add("remove-branch", node, function, start, end, "pass")
        elif isinstance(node, ast.Constant) and id(node) not in skip:
            if isinstance(node.value, bool):
                start, end = pos.span(node)
                add("wrong-constant", node, function, start, end, str(not node.value))
            elif type(node.value) is int and node.value > 1:
                start, end = pos.span(node)
                add("wrong-constant", node, function, start, end, str(node.value + 1))

    visit(tree, "", False)
    seen, unique = set(), []
    for m in out:  # e.g. s[2]: "off-by-one" and "wrong-constant" propose the same edit
        if (m.start, m.end, m.after) not in seen:
            seen.add((m.start, m.end, m.after))
            unique.append(m)
    return unique


def _int_literal(node: ast.AST | None) -> int | None:
    """The value of ``3`` or ``-3`` written as a literal, else None."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
            and type(node.operand.value) is int:
        return -node.operand.value
    return None
