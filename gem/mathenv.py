"""Procedurally generated math problems (single-turn) and a format-tolerant answer checker.

Problems are drawn from the env's RNG (or from ``task_id``), so a seed names a problem:

- ``arithmetic``: integer expressions with precedence and parentheses (exact division at
  difficulty 2, fractional results at 3);
- ``fraction``: sums, differences, products and quotients of two fractions;
- ``linear``: "solve for x" in ``a x + b = c x + d`` (fractional solutions at difficulty 3);
- ``system``: two linear equations in x and y, asking for one of them;
- ``quadratic``: a quadratic with integer roots, asking for the larger root.

``difficulty`` 1 uses arithmetic and fractions with small numbers, 2 adds linear equations,
3 adds systems and quadratics and larger numbers; ``problem_types`` overrides the choice.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

import numpy as np

from .actions import ANSWER_FORMATS, parse_action
from .core import GemEnv

__all__ = ["PROBLEM_TYPES", "MathEnv", "check_answer", "generate_problem", "parse_value", "worked_steps"]

PROBLEM_TYPES = ("arithmetic", "fraction", "linear", "system", "quadratic")
_TYPES_BY_DIFFICULTY = {1: PROBLEM_TYPES[:2], 2: PROBLEM_TYPES[:3], 3: PROBLEM_TYPES}
_INSTRUCTION = "Give only the final answer, exact (a fraction like 3/4 if needed), as \\boxed{...}."

# ---- answer checking (pure) --------------------------------------------------------------
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_FRAC = re.compile(r"\\[dt]?frac")
_VAR_PREFIX = re.compile(r"^[A-Za-z]\w*\s*=\s*")


def _brace_group(s: str, i: int) -> tuple[str, int] | None:
    """The content of the brace group starting at ``s[i] == '{'`` and the index after it."""
    if i >= len(s) or s[i] != "{":
        return None
    depth = 0
    for j in range(i, len(s)):
        depth += {"{": 1, "}": -1}.get(s[j], 0)
        if depth == 0:
            return s[i + 1 : j], j + 1
    return None


def _normalize(text: str) -> str:
    s = text.strip()
    last = max(s.rfind("\\boxed{"), -1)
    if last >= 0 and (group := _brace_group(s, last + 6)) is not None:
        s = group[0]
    s = re.sub(r"</?answer>", "", s).strip()
    s = s.replace("$", "").replace("\u2212", "-").replace("\\left", "").replace("\\right", "")
    for thin in ("\\,", "\\!", "\\;", "{,}", "\\ "):
        s = s.replace(thin, "")
    s = _VAR_PREFIX.sub("", s.strip())
    s = s.rstrip(" .").strip()
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    return re.sub(r"\s*([/+\-()])\s*", r"\1", s)


def parse_value(text: str) -> Fraction | None:
    """An exact number from answer text (``-3/4``, ``\\frac{3}{4}``, ``0.75``, ``1,234``), or None."""
    s = _normalize(text)
    while s.startswith("(") and s.endswith(")") and "(" not in s[1:-1] and ")" not in s[1:-1]:
        s = s[1:-1]
    sign = 1
    if s[:1] in "+-" and s[1:2] and not s[1:2].isdigit() and s[1:2] != ".":
        sign, s = (-1 if s[0] == "-" else 1), s[1:]
    if (match := _FRAC.match(s)) is not None:
        num = _brace_group(s, match.end())
        den = _brace_group(s, num[1]) if num else None
        if num is None or den is None or den[1] != len(s):
            return None
        top, bottom = parse_value(num[0]), parse_value(den[0])
        if top is None or bottom is None or bottom == 0:
            return None
        return sign * top / bottom
    parts = [p[1:-1] if p.startswith("(") and p.endswith(")") else p for p in s.split("/")]
    if len(parts) > 2 or not all(_NUMBER.fullmatch(p) for p in parts):
        return None
    values = [Fraction(p) for p in parts]
    if len(values) == 2:
        if values[1] == 0:
            return None
        return sign * values[0] / values[1]
    return sign * values[0]


def check_answer(pred: str, truth: str) -> bool:
    """Whether ``pred`` states the same number as ``truth``.

    Exact (``fractions.Fraction``) for integers and fractions; a prediction written with a
    decimal point or exponent may differ by 1e-6 relative (absolute when ``|truth| < 1``).
    Non-numeric truths are compared as normalized strings.
    """
    want, got = parse_value(truth), parse_value(pred)
    if want is None:
        return _normalize(pred).lower() == _normalize(truth).lower() and bool(_normalize(truth))
    if got is None:
        return False
    if got == want:
        return True
    decimal = any(c in _normalize(pred) for c in ".eE")
    return decimal and abs(got - want) <= Fraction(1, 10**6) * max(abs(want), 1)


# ---- problem generation (pure functions of a Generator) ----------------------------------
def _int(rng: np.random.Generator, low: int, high: int, nonzero: bool = False) -> int:
    while True:
        value = int(rng.integers(low, high + 1))
        if value or not nonzero:
            return value


def _linear_text(coef: int | Fraction, const: int | Fraction, var: str = "x") -> str:
    """``3x - 5``, ``-x``, ``7``: a readable linear expression."""
    terms = []
    if coef:
        terms.append({1: var, -1: f"-{var}"}.get(coef, f"{coef}{var}"))
    if const or not terms:
        terms.append(str(const) if not terms else f"{'-' if const < 0 else '+'} {abs(const)}")
    return " ".join(terms)


def _arithmetic(
    rng: np.random.Generator, depth: int, top: int, difficulty: int, root: bool = True
) -> tuple[str, Fraction, int]:
    """A random expression: (text, exact value, precedence of the outermost operator)."""
    if depth == 0 or (not root and rng.random() < 0.3):
        value = _int(rng, 1, top)
        return str(value), Fraction(value), 3
    ops = "+-*" + ("/" if difficulty >= 2 else "")
    op = ops[int(rng.integers(len(ops)))]
    left, lval, lprec = _arithmetic(rng, depth - 1, top, difficulty, root=False)
    right, rval, rprec = _arithmetic(rng, depth - 1, top, difficulty, root=False)
    if op == "/" and (rval == 0 or (lval / rval).denominator > (1 if difficulty < 3 else 12)):
        op = "*"  # exact division below difficulty 3, small denominators at 3, never by zero
    prec = 1 if op in "+-" else 2
    if lprec < prec:
        left = f"({left})"
    if rprec < prec or (rprec == prec and op in "-/"):
        right = f"({right})"
    value = {"+": lval + rval, "-": lval - rval, "*": lval * rval, "/": lval / rval if rval else 0}[op]
    return f"{left} {op} {right}", value, prec


_OPS = {"Add": "+", "Sub": "-", "Mult": "*", "Div": "/"}


def worked_steps(expression: str) -> list[str]:
    """The steps of evaluating an arithmetic ``expression`` as a person writes them, one
    binary operation a line in the order precedence evaluates them (``"1 * 10 = 10"``), each
    result written as an exact fraction when it is not whole. ``ValueError`` for anything but
    numbers, + - * / and parentheses."""
    import ast

    steps: list[str] = []

    def ev(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return Fraction(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op).__name__ in _OPS:
            left, right = ev(node.left), ev(node.right)
            op = _OPS[type(node.op).__name__]
            if op == "/" and right == 0:
                raise ValueError("division by zero")
            value = {"+": left + right, "-": left - right, "*": left * right, "/": left / right if right else 0}[op]
            steps.append(f"{_num(left)} {op} {_num(right)} = {_num(value)}")
            return value
        raise ValueError(f"not an arithmetic expression: {expression!r}")

    ev(ast.parse(expression, mode="eval").body)
    return steps


def _num(v: Fraction) -> str:
    return str(v.numerator) if v.denominator == 1 else f"({v})"


def generate_problem(
    rng: np.random.Generator, difficulty: int = 2, kind: str | None = None
) -> tuple[str, str, str]:
    """Draw one problem: ``(kind, question, answer)``, the answer as ``str(Fraction)``."""
    if difficulty not in _TYPES_BY_DIFFICULTY:
        raise ValueError(f"difficulty must be 1, 2 or 3, got {difficulty}")
    if kind is None:
        kinds = _TYPES_BY_DIFFICULTY[difficulty]
        kind = kinds[int(rng.integers(len(kinds)))]
    big = {1: 12, 2: 30, 3: 99}[difficulty]
    if kind == "arithmetic":
        text, value, _ = _arithmetic(
            rng, min(difficulty + 1, 3), {1: 12, 2: 20, 3: 30}[difficulty], difficulty
        )
        question = f"Compute: {text}"
    elif kind == "fraction":
        n1, d1, n2, d2 = _int(rng, 1, big), _int(rng, 2, 12), _int(rng, 1, big), _int(rng, 2, 12)
        a, b = Fraction(n1, d1), Fraction(n2, d2)
        op = "+-*/"[int(rng.integers(4 if difficulty >= 2 else 2))]
        value = {"+": a + b, "-": a - b, "*": a * b, "/": a / b}[op]
        question = f"Compute and simplify: {n1}/{d1} {op} {n2}/{d2}"
    elif kind == "linear":
        a, c = _int(rng, -9, 9, nonzero=True), _int(rng, -9, 9)
        while c == a:
            c = _int(rng, -9, 9)
        b = _int(rng, -big, big)
        if difficulty >= 3:
            d = _int(rng, -big, big)
            value = Fraction(d - b, a - c)
        else:
            value = Fraction(_int(rng, -12, 12))
            d = int(a * value + b - c * value)
        question = f"Solve for x: {_linear_text(a, b)} = {_linear_text(c, d)}"
    elif kind == "system":
        x, y = _int(rng, -9, 9), _int(rng, -9, 9)
        while True:
            a1, b1, a2, b2 = (_int(rng, -6, 6, nonzero=True) for _ in range(4))
            if a1 * b2 - a2 * b1:
                break
        eq1 = f"{_linear_text(a1, 0)} {'-' if b1 < 0 else '+'} {_linear_text(abs(b1), 0, 'y')} = {a1 * x + b1 * y}"
        eq2 = f"{_linear_text(a2, 0)} {'-' if b2 < 0 else '+'} {_linear_text(abs(b2), 0, 'y')} = {a2 * x + b2 * y}"
        ask = "x" if rng.random() < 0.5 else "y"
        value = Fraction(x if ask == "x" else y)
        question = f"Solve the system of equations:\n  {eq1}\n  {eq2}\nWhat is the value of {ask}?"
    elif kind == "quadratic":
        r1, r2, k = _int(rng, -9, 9), _int(rng, -9, 9), _int(rng, 1, 3)
        b, c = -k * (r1 + r2), k * r1 * r2
        poly = f"{'' if k == 1 else k}x^2" + (
            f" {'-' if b < 0 else '+'} {_linear_text(abs(b), 0)}" if b else ""
        )
        poly += f" {'-' if c < 0 else '+'} {abs(c)}" if c else ""
        value = Fraction(max(r1, r2))
        question = f"Find the largest real solution of: {poly} = 0"
    else:
        raise ValueError(f"unknown problem type {kind!r}; known: {', '.join(PROBLEM_TYPES)}")
    return kind, question, str(value)


class MathEnv(GemEnv):
    """Single-turn math: the observation is a problem, the action is an answer.

    Reward 1.0 for a correct answer (see :func:`check_answer`), 0.0 for a wrong one; a reply
    with no recognizable answer gets ``format_penalty``. Every step terminates the episode.
    Answers are read from ``\\boxed{}``, ``<answer></answer>``, a ``submit`` with an answer,
    or a reply that is nothing but a number (``3/4``, ``x = -2``).
    """

    def __init__(
        self,
        difficulty: int = 2,
        problem_types: list[str] | tuple[str, ...] | None = None,
        *,
        format_penalty: float = -0.1,
        max_obs_chars: int = 4096,
        render_mode: str | None = None,
        expert: str = "answer",
    ):
        super().__init__(
            max_turns=1, format_penalty=format_penalty, max_obs_chars=max_obs_chars, render_mode=render_mode
        )
        if expert not in ("answer", "steps"):
            raise ValueError(f"expert must be answer or steps, got {expert!r}")
        self.expert = expert
        if difficulty not in _TYPES_BY_DIFFICULTY:
            raise ValueError(f"difficulty must be 1, 2 or 3, got {difficulty}")
        unknown = set(problem_types or ()) - set(PROBLEM_TYPES)
        if unknown:
            raise ValueError(f"unknown problem types {sorted(unknown)}; known: {', '.join(PROBLEM_TYPES)}")
        self.difficulty = difficulty
        self.problem_types = tuple(problem_types) if problem_types else None
        self.kind = self.question = self.answer = ""

    def _reset(self, task_id: Any | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        rng = self._task_rng(task_id)
        kind = None
        if self.problem_types:
            kind = self.problem_types[int(rng.integers(len(self.problem_types)))]
        self.kind, self.question, self.answer = generate_problem(rng, self.difficulty, kind)
        return f"{self.question}\n\n{_INSTRUCTION}", {"problem_type": self.kind}

    def _step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        parsed = parse_action(action)
        pred = parsed.answer if parsed.kind in ("answer", "submit") else None
        if pred is None and parse_value(action) is not None:
            pred = action
        if pred is None:
            error = parsed.error if parsed.kind == "invalid" else f"a {parsed.kind} action is not an answer"
            return self._format_error(error, ANSWER_FORMATS, terminated=True)
        correct = check_answer(pred, self.answer)
        obs = "Correct." if correct else f"Incorrect. The correct answer is {self.answer}."
        return obs, 1.0 if correct else 0.0, True, {"success": correct, "answer": self.answer}

    def expert_action(self) -> str:
        """The answer, boxed: the expert of the trainer's SFT data; with ``expert="steps"`` an
        arithmetic problem's worked steps come first, one operation a line
        (:func:`worked_steps`: what a small model can learn to compute, where a bare answer
        asks it to do the whole expression in one token). ``ValueError`` once the episode is
        over (one reply ends it)."""
        if self._done or not self.answer:
            raise ValueError("no expert answer: the episode is over")
        boxed = f"\\boxed{{{self.answer}}}"
        if self.expert == "steps" and self.kind == "arithmetic":
            return "\n".join(worked_steps(self.question.removeprefix("Compute: ")) + [boxed])
        return boxed

    def _get_state(self) -> dict[str, Any]:
        return {"kind": self.kind, "question": self.question, "answer": self.answer}

    def _set_state(self, state: dict[str, Any]) -> None:
        self.kind, self.question, self.answer = state["kind"], state["question"], state["answer"]
