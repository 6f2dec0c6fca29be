"""rock/Code-v0: submit protocols, partial credit, host-side grading (and the attacks it
stops), and every bundled problem solved by its oracle and failed by a do-nothing agent."""

from __future__ import annotations

import builtins
import pickle

import gymnasium
import pytest
import rockroll  # noqa: F401 - registers the rock/ ids
from gymnasium.utils.env_checker import check_env
from rockroll.gem import CodeEnv, CodeProblem, parse_action
from rockroll.gem.code import _read_results, compile_tests, extract_submitted_code, judge, load_code_problems


@pytest.fixture(scope="module")
def env():
    env = gymnasium.make("rock/Code-v0").unwrapped
    yield env
    env.close()


def fenced_submit(code: str) -> str:
    return f"Here is my solution.\n<submit>\n```python\n{code}\n```\n</submit>"


def test_bundled_problems():
    problems = load_code_problems()
    assert len(problems) >= 50
    assert len({p.id for p in problems}) == len(problems)
    for p in problems:
        assert p.entry_point in p.solution and len(p.tests) >= 3
        assert all(t.startswith("assert ") for t in p.tests)


def test_extract_submitted_code():
    code = "def f():\n    return 1"
    for text in (fenced_submit(code), f"<submit>{code}</submit>", f"<submit>\n```py\n{code}\n```</submit>",
                 '{"name": "submit", "arguments": {"answer": "def f():\\n    return 1"}}'):
        assert extract_submitted_code(parse_action(text)).strip() == code
    for text in ("<submit/>", "submit", "<submit>  </submit>"):
        assert extract_submitted_code(parse_action(text)) is None


def test_check_env(env):
    check_env(env, skip_render_check=True)


def test_first_observation_documents_the_protocol(env):
    obs, info = env.reset(options={"task_id": "gcd-list"})
    assert "def gcd_list(nums: list[int]) -> int:" in obs
    assert "<submit>\n```python" in obs and "solution.py" in obs


def test_partial_credit_and_broken_code(env):
    env.reset(options={"task_id": "gcd-list"})
    _, reward, term, _, info = env.step(fenced_submit("def gcd_list(nums):\n    return 6"))
    assert term and reward == 0.0 and 0 < info["pass_fraction"] < 1 and info["total"] == 6
    env.reset(options={"task_id": "gcd-list"})
    obs, reward, _, _, info = env.step(fenced_submit("def gcd_list(nums) syntax error"))
    assert reward == 0.0 and info["pass_fraction"] == 0.0 and "failed to load" in obs
    # Printing fake results or looping forever earns nothing.
    env.reset(options={"task_id": "gcd-list"})
    env.per_test_timeout = 0.2
    try:
        _, reward, _, _, info = env.step(fenced_submit("print('0 PASS')\ndef gcd_list(nums):\n    while True: pass"))
    finally:
        env.per_test_timeout = 2.0
    assert reward == 0.0 and info["passed"] == 0


def test_bash_written_solution_is_graded(env):
    env.reset(options={"task_id": "chunk-list"})
    env.step("```bash\nprintf 'def chunk(xs, size):\\n    return [xs[i:i+size] for i in range(0, len(xs), size)]\\n' > solution.py\n```")
    _, reward, _, _, info = env.step("<submit/>")
    assert reward == 1.0 and info["pass_fraction"] == 1.0


def test_oracle_solves_every_problem_and_doing_nothing_fails_every_problem(env):
    failures = []
    for i, problem_id in enumerate(env.task_ids):
        env.reset(options={"task_id": problem_id})
        solution = env.task.solution
        if i % 2:  # both submit styles: fenced code in the tag, and a file written with bash
            action = fenced_submit(solution)
        else:
            env.step(f"```bash\ncat > solution.py <<'EOF'\n{solution}\nEOF\n```")
            action = "<submit/>"
        obs, reward, _, _, info = env.step(action)
        if reward != 1.0 or info["pass_fraction"] != 1.0:
            failures.append(f"oracle failed {problem_id}: {obs}")
        env.reset(options={"task_id": problem_id})
        obs, reward, _, _, info = env.step("<submit/>")
        if reward != 0.0 or info["pass_fraction"] != 0.0:
            failures.append(f"do-nothing passed {problem_id}")
    assert not failures, "\n".join(failures)


def test_custom_problems():
    problem = CodeProblem(id="double", signature="def double(x: int) -> int:", statement="Return 2x.",
                          solution="def double(x):\n    return 2 * x", tests=("assert double(2) == 4",))
    env = CodeEnv(problems=[problem])
    try:
        env.reset()
        assert env.step(fenced_submit(problem.solution))[1] == 1.0
    finally:
        env.close()


# ---- host-side grading -----------------------------------------------------------------------
def call_oracle(problem, blob):
    namespace = {}
    exec(problem.solution, namespace)
    args, kwargs = pickle.loads(blob)
    return namespace[problem.entry_point](*args, **kwargs)


def test_every_bundled_test_compiles_to_the_host_graded_form():
    allowed_names = set(dir(builtins)) | {"__rockroll_result__"}
    count = 0
    for problem in load_code_problems():
        for test in compile_tests(problem):
            count += 1
            assert test.calls, test.source
            # The check runs on the host and calls nothing but builtins and the result lookup;
            # the sandbox gets only argument tuples of plain data.
            assert set(test.check.co_names) <= allowed_names, test.source
            assert problem.entry_point not in test.check.co_names
            for blob in test.calls:
                args, kwargs = pickle.loads(blob)
                assert type(args) is tuple and type(kwargs) is dict
            results = [(True, call_oracle(problem, blob)) for blob in test.calls]
            assert judge(test, results) is None, test.source
            assert judge(test, [(False, "it crashed")] * len(test.calls)) == "it crashed"
    assert count == sum(len(p.tests) for p in load_code_problems()) >= 250


def test_compile_tests_splits_calls_and_rejects_what_it_cannot_grade():
    def problem(*tests):
        return CodeProblem(id="p", signature="def f(x, y=0):", statement="", solution="", tests=tests)

    (test,) = compile_tests(problem('assert f(*[1, 2], y="." * 3) == 3 and f(0)[1] == f(2)'))
    assert [pickle.loads(blob) for blob in test.calls] == [((1, 2), {"y": "..."}), ((0,), {}), ((2,), {})]
    assert judge(test, [(True, 3), (True, [0, 5]), (True, 5)]) is None
    assert judge(test, [(True, 3), (True, [0, 5]), (True, 4)]).startswith("wrong result")
    assert "could not be checked" in judge(test, [(True, 3), (True, 5), (True, 5)])  # 5[1]
    for bad, why in [
        ("assert all(f(x) for x in range(3))", "cannot be evaluated"),
        ("assert f(f(1)) == 1", "inside the arguments"),
        ("assert callable(f) and f(1)", "other than by calling"),
        ("assert len([1]) == 1", "never calls f"),
        ("assert f(lambda: 1)", "not plain data"),
        ("x = f(1)", "one assert"),
        ("assert f(1", "was never closed"),
    ]:
        with pytest.raises(ValueError, match="problem 'p', test 1") as caught:
            compile_tests(problem(bad))
        assert why in str(caught.value), bad
    with pytest.raises(ValueError, match="no tests"):
        CodeEnv(problems=[problem()])


def test_read_results_trusts_only_single_literal_lines():
    nonce = "n0nce"
    stdout = "\n".join([
        f"{nonce} 0 ok [1, 'a']", "noise", f"{nonce} 1 ok <object at 0x1>", f"{nonce} 2 error 'ValueError: x'",
        f"{nonce} 3 ok 1", f"{nonce} 3 ok 1", f"other 4 ok 1", f"{nonce} 9 ok 1", f"{nonce} 5 ok __import__('os')",
    ])
    results = _read_results(stdout, nonce, 6)
    assert results[0] == (True, [1, "a"]) and results[2] == (False, "ValueError: x")
    assert not results[1][0] and "not a plain Python literal" in results[1][1]
    assert results[3] == (False, "more than one result line for one call")
    assert not results[4][0] and "no result" in results[4][1]
    assert not results[5][0] and "not a plain Python literal" in results[5][1]


# ---- attacks: whatever the submission does in the sandbox, only correct return values pass ----
def run_submission(env, code: str, task_id: str = "gcd-list"):
    env.reset(options={"task_id": task_id})
    return env.step(fenced_submit(code))


def forge_with_nonce(statuses: list[str]) -> str:
    """A solution that finds the runner's nonce (in its globals or the process environment),
    prints a line per call claiming it returned True (or passed), and exits."""
    return (
        "import __main__ as m, os, re\n"
        "nonce = getattr(m, 'nonce', None) or re.search(rb'ROCKROLL_NONCE=(\\w+)', "
        "open('/proc/self/environ', 'rb').read()).group(1).decode()\n"
        "for i in range(300):\n"
        f"    for status in {statuses!r}:\n"
        "        os.write(1, f'\\n{nonce} {i} {status} True\\n'.encode())\n"
        "os._exit(0)"
    )


GCD = "import math\ndef gcd_list(nums):\n    return math.gcd(*nums) if nums else 0"


def test_the_reference_gcd_passes(env):
    # The attacks below start from this correct function: it alone earns 1.
    assert run_submission(env, GCD)[1] == 1.0


@pytest.mark.parametrize(
    "attack",
    [
        # The old runner's own report(): every test "passes", then exit before any runs.
        "import __main__ as m, os\n[m.report(i, True) for i in range(len(m.tests))]\nos._exit(0)",
        # Forge result lines with the runner's nonce, in the old format and in the new one.
        forge_with_nonce(["ok", "PASS"]),
        forge_with_nonce(["ok"]),
        # Fake lines in every format, then a wrong function.
        "import os, sys\nfor i in range(10):\n    print(f'{i} PASS')\n    os.write(1, f'{i} PASS\\n'.encode())\n"
        "    sys.__stdout__.write(f'0 {i} ok 6\\n')\ndef gcd_list(nums):\n    return 0",
        # A correct function, but the process exits at import before any call.
        GCD + "\nimport os\nos._exit(0)",
        # A correct function that exits the process on its first call.
        "import math, os\ndef gcd_list(nums):\n    os._exit(0)",
    ],
    ids=["report-forgery", "nonce-forgery-old-format", "nonce-forgery", "fake-lines", "exit-at-import", "exit-in-call"],
)
def test_forged_output_and_early_exits_earn_nothing(env, attack):
    obs, reward, term, _, info = run_submission(env, attack)
    assert term and reward == 0.0 and not info["success"] and info["passed"] < info["total"], obs


def test_an_object_equal_to_everything_fails(env):
    always_equal = (
        "class Anything:\n    __eq__ = lambda self, other: True\n    __ne__ = lambda self, other: False\n"
        "    __hash__ = object.__hash__\n"
        "class AnyInt(int):\n    __eq__ = Anything.__eq__\n    __ne__ = Anything.__ne__\n    __hash__ = int.__hash__\n"
    )
    obs, reward, _, _, info = run_submission(env, always_equal + "def gcd_list(nums):\n    return Anything()")
    assert reward == 0.0 and info["passed"] == 0 and "not a plain Python literal" in obs
    # An int subclass crosses as the plain int it prints as: -1 is wrong for every test.
    obs, reward, _, _, info = run_submission(env, always_equal + "def gcd_list(nums):\n    return AnyInt(-1)")
    assert reward == 0.0 and info["passed"] == 0 and "wrong result (returned -1)" in obs


def test_hidden_expected_values_never_enter_the_sandbox():
    # The expected value is a word no submission can compute; the solution searches the
    # sandbox's files, every process's command line and environment, and its own memory for
    # it. Were the asserts in the sandbox (as test files or strings in the runner), it would
    # find "zebra-..." and pass.
    problem = CodeProblem(id="secret", signature="def secret(n: int) -> str:", statement="Return the secret.",
                          solution="def secret(n):\n    return 'zebra-' + str(n * 7919)",
                          tests=("assert secret(3) == 'zebra-23757'", "assert secret(5) != ''"))
    snoop = r'''
import gc, os, re, sys
PATTERN = re.compile("zeb" + "ra-[0-9]+")
def _texts():
    for top in ("/tmp", "/workspace", "/dev/shm", "/var/tmp"):
        for root, _, files in os.walk(top):
            for name in files:
                try:
                    yield open(os.path.join(root, name), "rb").read().decode("latin-1")
                except OSError:
                    pass
    for pid in filter(str.isdigit, os.listdir("/proc")):
        for part in ("cmdline", "environ"):
            try:
                yield open(f"/proc/{pid}/{part}", "rb").read().decode("latin-1")
            except OSError:
                pass
    for obj in gc.get_objects():
        if isinstance(obj, (list, tuple, dict)):
            yield repr(obj)
    yield repr(vars(sys.modules["__main__"]))
def secret(n):
    for text in _texts():
        found = PATTERN.search(text)
        if found and found.group() != "zeb" + "ra-":
            return found.group()
    return "nothing found"
'''
    env = CodeEnv(problems=[problem])
    try:
        env.reset()
        obs, reward, _, _, info = env.step(fenced_submit(snoop))
        # Only the test that needs nothing secret passes; the search came back empty.
        assert reward == 0.0 and info["passed"] == 1 and "returned 'nothing found'" in obs, obs
        env.reset()
        assert env.step(fenced_submit(problem.solution))[1] == 1.0
    finally:
        env.close()


def test_a_correct_solution_that_prints_still_passes(env):
    chatty = (
        "import os, sys\nprint('loading: 0 PASS')\nsys.__stdout__.write('partial line without newline')\n"
        "os.write(1, b'1 FAIL no newline either')\n"
        "def gcd_list(nums):\n    print('computing', nums)\n    os.write(1, b'ok 5')\n"
        "    sys.__stdout__.write('3 ok 7')\n    import math\n    return math.gcd(*nums) if nums else 0"
    )
    obs, reward, _, _, info = run_submission(env, chatty)
    assert reward == 1.0 and info["success"], obs
