"""``rock/Code-v0``: write a Python function in a sandbox; hidden tests grade it.

Protocol (also stated in the first observation): the agent may explore and test with bash
in the sandbox, then submits its code either

- inside the submit tag, as a fenced block: ``<submit>```python ... ```</submit>`` (or
  bare code inside ``<submit>...</submit>``, or a ``submit`` tool call whose ``answer`` is
  the code), which is written to ``/workspace/solution.py``; or
- by writing ``/workspace/solution.py`` itself with bash and then sending ``<submit/>``.

At submit the hidden tests (one ``assert`` per line) and a small runner are written to the
sandbox and run with a timeout: reward 1.0 iff every test passes,
``info["pass_fraction"]`` is the fraction that passed.

The bundled problems (``gem/data/code/problems.txt``, the record format of
:func:`rockroll.gem.tools.parse_records` with sections ``signature``, ``statement``,
``solution`` and ``tests``) are original, simple-to-medium algorithmic functions.
"""

from __future__ import annotations

import functools
import json
import re
import secrets
from dataclasses import dataclass
from importlib import resources
from typing import Any, Sequence

from rockroll.sandbox import AsyncSandbox

from .actions import TOOL_FORMATS, Action
from .core import truncate_observation
from .tools import ENV_DIR, Evaluation, SandboxToolEnv, parse_records, select_tasks

__all__ = ["CodeEnv", "CodeProblem", "extract_submitted_code", "load_code_problems"]

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


def extract_submitted_code(action: Action, text: str) -> str | None:
    """The code a submit carries, or None (then ``solution.py`` as written is graded).

    The parser drops a fenced block inside ``<submit>`` (fences are read before tags), so
    the code is taken from the raw reply: the body of ``<submit>...</submit>`` (or the
    tool call's ``answer``), unwrapped from its ```python fence when it has one.
    """
    body = action.answer
    if body is None:
        start, end = text.find("<submit>"), text.rfind("</submit>")
        body = text[start + len("<submit>") : end] if 0 <= start < end else ""
    fenced = _FENCE.search(body)
    code = fenced.group(1) if fenced else body
    return code if code.strip() else None


# Runs the hidden tests: one line per test, prefixed by a nonce so nothing the solution
# prints can pass for a result (its own output is captured while it runs).
_RUNNER = r'''
import contextlib, io, json, os, signal, sys, traceback
nonce = os.environ.pop("ROCKROLL_NONCE")
solution, tests_file, per_test = sys.argv[1], sys.argv[2], float(sys.argv[3])
tests = json.load(open(tests_file))
out = sys.stdout
def report(i, ok, msg=""):
    out.write(f"{nonce} {i} {'PASS' if ok else 'FAIL'} {msg}\n"); out.flush()
def alarm(*_): raise TimeoutError(f"test took more than {per_test}s")
signal.signal(signal.SIGALRM, alarm)
sys.path.insert(0, os.path.dirname(os.path.abspath(solution)))
namespace = {"__name__": "solution"}
sink = io.StringIO()
try:
    with contextlib.redirect_stdout(sink):
        signal.setitimer(signal.ITIMER_REAL, per_test * 5)
        exec(compile(open(solution).read(), solution, "exec"), namespace)
        signal.setitimer(signal.ITIMER_REAL, 0)
except BaseException:
    signal.setitimer(signal.ITIMER_REAL, 0)
    msg = traceback.format_exc(limit=2).strip().splitlines()[-1]
    for i in range(len(tests)): report(i, False, "solution failed to load: " + msg)
    sys.exit(0)
for i, test in enumerate(tests):
    try:
        with contextlib.redirect_stdout(sink):
            signal.setitimer(signal.ITIMER_REAL, per_test)
            exec(test, dict(namespace))
            signal.setitimer(signal.ITIMER_REAL, 0)
        report(i, True)
    except BaseException as exc:
        signal.setitimer(signal.ITIMER_REAL, 0)
        report(i, False, f"{type(exc).__name__}: {exc}"[:200].replace("\n", " "))
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
    """Python function problems graded by hidden tests; see the module docstring."""

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
        super().__init__(problems, **kwargs)
        self.test_timeout = float(test_timeout)
        self.per_test_timeout = float(per_test_timeout)

    async def _setup(self, sandbox: AsyncSandbox, problem: CodeProblem) -> str:
        return _first_observation(problem, sandbox.spec.workdir)

    async def _evaluate(self, sandbox: AsyncSandbox, problem: CodeProblem, action: Action, text: str) -> Evaluation:
        code = extract_submitted_code(action, text)
        if code is not None:
            await sandbox.write_file(SOLUTION_FILE, code)
        elif not await sandbox.exists(SOLUTION_FILE):
            msg = f"Submitted, but there is no code: no code in the submit tag and no {SOLUTION_FILE}."
            return Evaluation(0.0, msg, {"pass_fraction": 0.0, "passed": 0, "total": len(problem.tests)})
        nonce = secrets.token_hex(8)
        await sandbox.write_file(f"{ENV_DIR}/tests.json", json.dumps(list(problem.tests)))
        script = (
            f"ROCKROLL_NONCE={nonce} python3 -I {ENV_DIR}/runner.py {SOLUTION_FILE} {ENV_DIR}/tests.json "
            f"{self.per_test_timeout}\nrm -f {ENV_DIR}/tests.json\n"
        )
        await sandbox.write_file(f"{ENV_DIR}/runner.py", _RUNNER)
        result = await self._env_run(sandbox, "grade.sh", script, timeout=self.test_timeout)
        passed, failures = _read_results(result.stdout, nonce, len(problem.tests))
        total = len(problem.tests)
        fraction = passed / total if total else 0.0
        lines = [f"Submitted. Hidden tests passed: {passed}/{total}."]
        if result.timed_out:
            lines.append(f"The tests were stopped after {self.test_timeout:.0f}s.")
        lines += failures[:5]
        info = {"pass_fraction": fraction, "passed": passed, "total": total, "success": passed == total}
        return Evaluation(1.0 if total and passed == total else 0.0, truncate_observation("\n".join(lines), 4000), info)


def _read_results(stdout: str, nonce: str, total: int) -> tuple[int, list[str]]:
    """Count the runner's PASS lines; a test with no line (a crash, a timeout) failed."""
    status: dict[int, tuple[bool, str]] = {}
    for line in stdout.splitlines():
        parts = line.split(" ", 3)
        if len(parts) >= 3 and parts[0] == nonce and parts[1].isdigit() and int(parts[1]) < total:
            status[int(parts[1])] = (parts[2] == "PASS", parts[3] if len(parts) > 3 else "")
    passed = sum(ok for ok, _ in status.values())
    failures = [f"test {i + 1} failed: {msg}" for i, (ok, msg) in sorted(status.items()) if not ok]
    return passed, failures
