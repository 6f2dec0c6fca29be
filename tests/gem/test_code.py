"""rock/Code-v0: submit protocols, partial credit, and every bundled problem solved by its
oracle and failed by a do-nothing agent."""

from __future__ import annotations

import gymnasium
import pytest
import rockroll  # noqa: F401 - registers the rock/ ids
from gymnasium.utils.env_checker import check_env
from rockroll.gem import CodeEnv, parse_action
from rockroll.gem.code import extract_submitted_code, load_code_problems


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
        assert extract_submitted_code(parse_action(text), text).strip() == code
    for text in ("<submit/>", "submit", "<submit>  </submit>"):
        assert extract_submitted_code(parse_action(text), text) is None


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
    from rockroll.gem import CodeProblem

    problem = CodeProblem(id="double", signature="def double(x: int) -> int:", statement="Return 2x.",
                          solution="def double(x):\n    return 2 * x", tests=("assert double(2) == 4",))
    env = CodeEnv(problems=[problem])
    try:
        env.reset()
        assert env.step(fenced_submit(problem.solution))[1] == 1.0
    finally:
        env.close()
