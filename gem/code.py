"""``rock/Code-v0``: write a Python function in a sandbox; hidden tests grade it.

Protocol (also stated in the first observation): the agent may explore and test with bash
in the sandbox, then submits its code either

- inside the submit tag, as a fenced block: ``<submit>```python ... ```</submit>`` (or
  bare code inside ``<submit>...</submit>``, or a ``submit`` tool call whose ``answer`` is
  the code), which is written to ``/workspace/solution.py``; or
- by writing ``/workspace/solution.py`` itself with bash and then sending ``<submit/>``.

Grading happens on the host; the sandbox only runs the submitted function. Each hidden test
is one ``assert`` line (our own, trusted text). On the host, :func:`compile_tests` parses it
with :mod:`ast`, evaluates the arguments of every call to the problem's entry point (plain
data such as ``"." * 9``) and replaces each call by a lookup of its result. Only those
argument tuples go into the sandbox, where a small runner loads ``solution.py``, calls the
function once per tuple (each with a timeout, each with fresh arguments) and prints the
``ascii()`` of each return value (or the exception) on a line prefixed by a per-submit nonce.
The host reads each value back with :func:`ast.literal_eval` -- so only plain literal data
ever comes out of the sandbox, and a value that is not one (an object with a rigged
``__eq__``) fails -- and evaluates the original assert with those values
(:func:`judge`). The expected values and the asserts never enter the sandbox, so code that
reads the runner's memory or files, prints forged result lines or exits early can at most
report return values it could have returned anyway: a call with no result line, or two,
fails.

Reward 1.0 iff every test passes; ``info`` has ``pass_fraction``, ``passed``, ``total`` and
``success``, and the final observation lists the first failures.

The bundled problems (``gem/data/code/problems.txt``, the record format of
:func:`rockroll.gem.tools.parse_records` with sections ``signature``, ``statement``,
``solution`` and ``tests``) are original, simple-to-medium algorithmic functions.
"""

from __future__ import annotations

import ast
import functools
import pickle
import re
import reprlib
import secrets
import types
from dataclasses import dataclass
from importlib import resources
from typing import Any, Sequence

from rockroll.sandbox import AsyncSandbox

from .actions import TOOL_FORMATS, Action
from .core import truncate_observation
from .tools import ENV_DIR, Evaluation, SandboxToolEnv, parse_records, select_tasks

__all__ = [
    "CodeEnv",
    "CodeProblem",
    "HostTest",
    "compile_tests",
    "extract_submitted_code",
    "judge",
    "load_code_problems",
]

SOLUTION_FILE = "solution.py"


@dataclass(frozen=True)
class CodeProblem:
    """One function to write: its signature, statement, hidden tests and an oracle solution."""

    id: str
    signature: str
    statement: str
    solution: str
    tests: tuple[str, ...]

    @property
    def entry_point(self) -> str:
        return re.match(r"\s*def\s+(\w+)", self.signature).group(1)


def _problem(record: dict[str, str]) -> CodeProblem:
    tests = tuple(line for line in record.pop("tests").splitlines() if line.strip())
    return CodeProblem(tests=tests, **record)


@functools.cache
def load_code_problems() -> tuple[CodeProblem, ...]:
    """The bundled problems (parsed once per process)."""
    text = (resources.files(__package__) / "data" / "code" / "problems.txt").read_text()
    return tuple(_problem(record) for record in parse_records(text))


_FENCE = re.compile(r"^[ \t]*```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)^[ \t]*```[ \t]*$", re.MULTILINE | re.DOTALL)


def extract_submitted_code(action: Action) -> str | None:
    """The code a submit carries, or None (then ``solution.py`` as written is graded).

    It is the submit's answer -- the body of ``<submit>...</submit>`` or the tool call's
    ``answer`` -- unwrapped from its ```python fence when it has one.
    """
    body = action.answer or ""
    fenced = _FENCE.search(body)
    code = fenced.group(1) if fenced else body
    return code if code.strip() else None


# ---- host-side grading -------------------------------------------------------------------------
#: The name a compiled assert calls instead of the entry point: ``__rockroll_result__(i)`` is
#: the value returned by the test's i-th call.
_RESULT = "__rockroll_result__"
_SCALARS = (type(None), bool, int, float, complex, str, bytes)


def _is_plain_data(value: Any) -> bool:
    # Arguments must unpickle in the sandbox without importing anything: builtin data only.
    if type(value) in _SCALARS:
        return True
    if type(value) in (list, tuple, set, frozenset):
        return all(map(_is_plain_data, value))
    if type(value) is dict:
        return all(map(_is_plain_data, value)) and all(map(_is_plain_data, value.values()))
    return False


def _capture(*args: Any, **kwargs: Any) -> tuple[tuple, dict]:
    return args, kwargs


@dataclass(frozen=True)
class HostTest:
    """A hidden test split for grading on the host.

    ``calls``: one pickled ``(args, kwargs)`` per call of the entry point in the assert, in
    evaluation order -- all that is sent to the sandbox. ``check``: the assert's expression
    with call ``i`` replaced by ``__rockroll_result__(i)``, evaluated by :func:`judge`.
    """

    source: str
    calls: tuple[bytes, ...]
    check: types.CodeType


class _CallsToResults(ast.NodeTransformer):
    """Evaluates the arguments of each entry-point call and swaps the call for a result lookup."""

    def __init__(self, entry: str):
        self.entry = entry
        self.calls: list[bytes] = []

    def visit_Call(self, node: ast.Call) -> ast.AST:
        if not (isinstance(node.func, ast.Name) and node.func.id == self.entry):
            return self.generic_visit(node)
        arguments = [*node.args, *node.keywords]
        if any(isinstance(n, ast.Name) and n.id == self.entry for arg in arguments for n in ast.walk(arg)):
            raise ValueError(f"a call of {self.entry} inside the arguments of another cannot be sent")
        # `_capture(<the same arguments>)` evaluates them exactly as the call would (*args included).
        capture = ast.Expression(ast.Call(ast.Name("_capture", ast.Load()), node.args, node.keywords))
        try:
            args = eval(compile(ast.fix_missing_locations(capture), "<test>", "eval"), {"_capture": _capture})
        except Exception as exc:  # e.g. a name bound by a comprehension around the call
            raise ValueError(f"its arguments cannot be evaluated on their own ({type(exc).__name__}: {exc})") from None
        if not _is_plain_data(args):
            raise ValueError("its arguments are not plain data (None, bool, numbers, str, bytes, containers)")
        # Pickled, not repr'd: a million-element argument takes seconds and hundreds of MB to
        # parse back from text in a small sandbox. Unpickling there can at worst harm the
        # sandbox; the host never unpickles anything that comes back (values return as text).
        # Protocol 4: any sandbox Python >= 3.4 reads it.
        self.calls.append(pickle.dumps(args, protocol=4))
        lookup = ast.Call(ast.Name(_RESULT, ast.Load()), [ast.Constant(len(self.calls) - 1)], [])
        return ast.copy_location(lookup, node)


@functools.lru_cache(maxsize=4096)  # argument values are evaluated once per test and process
def _compile_test(source: str, entry: str) -> HostTest:
    tree = ast.parse(source)
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        raise ValueError("a test must be exactly one assert statement")
    transformer = _CallsToResults(entry)
    expression = ast.Expression(transformer.visit(tree.body[0].test))
    if not transformer.calls:
        raise ValueError(f"the assert never calls {entry}")
    if any(isinstance(n, ast.Name) and n.id == entry for n in ast.walk(expression)):
        raise ValueError(f"the assert uses {entry} other than by calling it")
    check = compile(ast.fix_missing_locations(expression), "<test>", "eval")
    return HostTest(source, tuple(transformer.calls), check)


def compile_tests(problem: CodeProblem) -> tuple[HostTest, ...]:
    """The problem's tests in host-graded form.

    Raises ValueError naming the problem and test when a test cannot be graded this way:
    not a single ``assert``, no call of the entry point, the entry point used but not called
    or called inside another call's arguments, or arguments that are not plain data or
    depend on names bound inside the assert (a comprehension's variable).
    """
    if not problem.tests:
        raise ValueError(f"problem {problem.id!r} has no tests")
    compiled = []
    for number, source in enumerate(problem.tests, 1):
        try:
            compiled.append(_compile_test(source, problem.entry_point))
        except (SyntaxError, ValueError) as exc:
            raise ValueError(f"problem {problem.id!r}, test {number} ({source!r}): {exc}") from None
    return tuple(compiled)


class _CallFailed(Exception):
    """A call of the entry point had no usable result (the message says why)."""


def judge(test: HostTest, results: Sequence[tuple[bool, Any]]) -> str | None:
    """Why ``test`` failed, or None if it passed.

    ``results[i]`` is ``(True, value)`` for the test's i-th call, or ``(False, why)`` when it
    raised, timed out or returned nothing usable. The assert's expression runs here, on the
    host, over plain values only: nothing from the sandbox executes.
    """

    def result(i: int) -> Any:
        ok, value = results[i]
        if not ok:
            raise _CallFailed(value)
        return value

    try:
        if eval(test.check, {_RESULT: result}):
            return None
    except _CallFailed as failed:
        return str(failed)
    except Exception as exc:  # e.g. len() of a returned int
        return f"the result could not be checked ({type(exc).__name__}: {exc})"[:300]
    returned = ", ".join(reprlib.repr(value) for ok, value in results if ok)
    return f"wrong result (returned {returned})"


def _read_results(stdout: str, nonce: str, total: int) -> list[tuple[bool, Any]]:
    """``(True, value)`` or ``(False, why)`` per call, from the runner's nonce-prefixed lines.

    A call with no line (a crash, a timeout, an early exit) or more than one (forged
    output) failed. Each value is parsed with :func:`ast.literal_eval`, which builds plain
    data and runs nothing; text that is not a literal fails.
    """
    lines: dict[int, list[tuple[str, str]]] = {}
    for line in stdout.split("\n"):
        parts = line.split(" ", 3)
        if len(parts) == 4 and parts[0] == nonce and parts[1].isdecimal() and int(parts[1]) < total:
            lines.setdefault(int(parts[1]), []).append((parts[2], parts[3]))
    results: list[tuple[bool, Any]] = []
    for i in range(total):
        reported = lines.get(i, [])
        if len(reported) != 1:
            why = "more than one result line for one call" if reported else "no result (the process crashed, exited or ran out of time)"
            results.append((False, why))
            continue
        status, text = reported[0]
        try:
            value = ast.literal_eval(text)
        except Exception:  # SyntaxError, ValueError, MemoryError, RecursionError: not plain data
            results.append((False, f"returned a value that is not a plain Python literal: {text[:100]}"))
            continue
        results.append((True, value) if status == "ok" else (False, str(value)))
    return results


# Runs in the sandbox: calls the function once per pickled (args, kwargs) and prints each
# result's ascii() (one line, whatever the value). The leading newline ends any partial line
# the solution wrote to the real stdout; the nonce tells our lines from the solution's own
# output. Nothing here is trusted: the host only parses the values and judges them.
_RUNNER = r'''
import contextlib, os, pickle, signal, sys
nonce = os.environ.pop("ROCKROLL_NONCE")
solution, calls_file, entry, per_call = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
with open(calls_file, "rb") as f:
    calls = pickle.load(f)
out, quiet = sys.stdout, open(os.devnull, "w")
def report(i, status, text):
    out.write(f"\n{nonce} {i} {status} {text}\n"); out.flush()
def alarm(*_): raise TimeoutError(f"took more than {per_call:g}s")
signal.signal(signal.SIGALRM, alarm)
def limited(seconds, fn):
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        with contextlib.redirect_stdout(quiet):
            return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
def describe(exc): return f"{type(exc).__name__}: {exc}"[:300]
sys.path.insert(0, os.path.dirname(os.path.abspath(solution)))
namespace = {"__name__": "solution"}
try:
    code = compile(open(solution).read(), solution, "exec")
    limited(per_call * 5, lambda: exec(code, namespace))
    fn = namespace.get(entry)
    if not callable(fn):
        raise NameError(f"solution.py defines no function {entry}")
except BaseException as exc:
    for i in range(len(calls)): report(i, "error", ascii("solution failed to load: " + describe(exc)))
    sys.exit(0)
for i, blob in enumerate(calls):
    args, kwargs = pickle.loads(blob)  # fresh arguments for every call
    try:
        text = limited(per_call, lambda: ascii(fn(*args, **kwargs)))
    except BaseException as exc:
        report(i, "error", ascii(f"{entry}() raised " + describe(exc)))
    else:
        report(i, "ok", text)
'''


def _first_observation(problem: CodeProblem, workdir: str) -> str:
    formats = "\n".join(f"- {form}" for form in TOOL_FORMATS)
    return (
        "Write a Python 3 function.\n\n"
        f"{problem.signature}\n\n{problem.statement}\n\n"
        f"You have a Linux sandbox (bash, python3, no network); the working directory is {workdir}. "
        f"Act with exactly one action per reply, in one of these formats:\n{formats}\n\n"
        "To submit, either put your code in the submit tag as a fenced block:\n"
        "<submit>\n```python\n# your solution, defining the function above\n```\n</submit>\n"
        f"or write it to {workdir}/{SOLUTION_FILE} with bash and send <submit/>. "
        "Hidden tests then call the function; the episode ends."
    )


class CodeEnv(SandboxToolEnv):
    """Python function problems graded by hidden tests; see the module docstring.

    ``per_test_timeout`` bounds each call of the function (loading ``solution.py`` gets five
    times that); ``test_timeout`` bounds the whole run in the sandbox.
    """

    def __init__(
        self,
        *,
        problems: Sequence[CodeProblem] | None = None,
        task_ids: Sequence[str] | None = None,
        test_timeout: float = 30.0,
        per_test_timeout: float = 2.0,
        **kwargs: Any,
    ):
        problems = select_tasks(load_code_problems() if problems is None else problems, task_ids)
        for problem in problems:  # a test that cannot be graded on the host fails here, not at submit
            compile_tests(problem)
        super().__init__(problems, **kwargs)
        self.test_timeout = float(test_timeout)
        self.per_test_timeout = float(per_test_timeout)

    async def _setup(self, sandbox: AsyncSandbox, problem: CodeProblem) -> str:
        return _first_observation(problem, sandbox.spec.workdir)

    async def _evaluate(self, sandbox: AsyncSandbox, problem: CodeProblem, action: Action, text: str) -> Evaluation:
        tests = compile_tests(problem)
        total = len(tests)
        code = extract_submitted_code(action)
        if code is not None:
            await sandbox.write_file(SOLUTION_FILE, code)
        elif not await sandbox.exists(SOLUTION_FILE):
            msg = f"Submitted, but there is no code: no code in the submit tag and no {SOLUTION_FILE}."
            return Evaluation(0.0, msg, {"pass_fraction": 0.0, "passed": 0, "total": total, "success": False})
        calls = [blob for test in tests for blob in test.calls]
        nonce = secrets.token_hex(16)
        await sandbox.write_file(f"{ENV_DIR}/calls.pickle", pickle.dumps(calls, protocol=4))
        await sandbox.write_file(f"{ENV_DIR}/runner.py", _RUNNER)
        script = (
            f"ROCKROLL_NONCE={nonce} python3 -I {ENV_DIR}/runner.py {SOLUTION_FILE} {ENV_DIR}/calls.pickle "
            f"{problem.entry_point} {self.per_test_timeout}\nrm -f {ENV_DIR}/calls.pickle {ENV_DIR}/runner.py\n"
        )
        result = await self._env_run(sandbox, "grade.sh", script, timeout=self.test_timeout)
        results = _read_results(result.stdout, nonce, len(calls))
        failures, first = [], 0
        for number, test in enumerate(tests, 1):
            why = judge(test, results[first : first + len(test.calls)])
            first += len(test.calls)
            if why is not None:
                failures.append(f"test {number} failed: {why}")
        passed = total - len(failures)
        lines = [f"Submitted. Hidden tests passed: {passed}/{total}."]
        if result.timed_out:
            lines.append(f"The tests were stopped after {self.test_timeout:.0f}s.")
        lines += failures[:5]
        info = {"pass_fraction": passed / total, "passed": passed, "total": total, "success": passed == total}
        return Evaluation(1.0 if passed == total else 0.0, truncate_observation("\n".join(lines), 4000), info)
