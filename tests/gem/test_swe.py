"""rock/SWE-v0 on the default task set (real sdists, real sandboxes, real pytest runs).

The set is the one `make test` publishes to the user's default hub (the `swe_hub`
fixture builds it if it is missing). Oracle (the reference fix) and null (submit at once)
agents run over every task."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import shlex

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

from rockroll.gem.swe import SWEEnv, hub_swe_tasks
from rockroll.gem.tools import _POOLS, close_pools
from rockroll.registry.hub import register_hub
from rockroll.sandbox.deployment.reaper import current_run
from rockroll.sandbox.sync import run_sync


def bash(command: str) -> str:
    # The JSON tool-call form: a patch may hold anything a fence or a tag could trip on.
    return json.dumps({"name": "bash", "arguments": {"command": command}})


def apply_patch(patch: str) -> str:
    return bash(f"git apply <<'ROCKROLL_PATCH'\n{patch}ROCKROLL_PATCH")


@pytest.fixture(scope="module")
def tasks(swe_hub):
    return hub_swe_tasks(swe_hub)


@pytest.fixture(scope="module")
def env(swe_hub):
    e = SWEEnv(hub=swe_hub)
    yield e
    e.close()


def test_default_set_is_three_packages_times_ten(tasks):
    repos = {t.repo for t in tasks}
    assert len(repos) >= 3 and len(tasks) >= 30
    for repo in repos:
        assert sum(t.repo == repo for t in tasks) >= 10
    kinds = {t.extra["mutation"]["kind"] for t in tasks}
    assert len(kinds) >= 4  # bugs of several kinds, not one operator everywhere
    for t in tasks:
        assert t.fail_to_pass and t.pass_to_pass and not set(t.fail_to_pass) & set(t.pass_to_pass)
        assert t.patch.startswith("diff --git") and "fail" in t.problem_statement


# 60 graded runs of real test suites: minutes on a slow machine, past the default timeout.
@pytest.mark.timeout(2400)
def test_oracle_solves_and_null_fails_every_task(env, tasks):
    failures = []
    for task in tasks:
        obs, info = env.reset(options={"task_id": task.id})
        assert info["task_id"] == task.id and task.problem_statement in obs
        _, reward, terminated, _, info = env.step("<submit/>")
        if not (terminated and reward == 0.0 and info["f2p_pass_fraction"] == 0.0 and info["p2p_pass_fraction"] == 1.0):
            failures.append(("null", task.id, reward, info))
        env.reset(options={"task_id": task.id})  # the gold patch through the shell: the SFT expert
        obs, reward, terminated, _, info = env.step(env.expert_action())
        assert "exit code: 0" in obs, obs
        assert env.expert_action() == "<submit/>"
        obs, reward, terminated, _, info = env.step(env.expert_action())
        if not (terminated and reward == 1.0 and info["resolved"]):
            failures.append(("oracle", task.id, reward, obs))
    assert failures == []


def test_the_expert_applies_the_gold_patch_through_the_shell(env, tasks):
    """The SFT data's expert on one task: its first reply is the gold patch applied by
    ``git apply`` from a here-document in a fenced bash block (the marker never a line of the
    patch), its second ``<submit/>``, and the task is resolved (every task: the oracle test above)."""
    task = tasks[0]
    env.reset(options={"task_id": task.id})
    first = env.expert_action()
    assert first.startswith("```bash\ngit apply <<'ROCKROLL_GOLD_PATCH'\n") and task.patch in first
    obs, *_ = env.step(first)
    assert "exit code: 0" in obs, obs
    obs, reward, terminated, _, info = env.step(env.expert_action())
    assert terminated and reward == 1.0 and info["resolved"], obs
    marked = dataclasses.replace(task, patch=task.patch + "ROCKROLL_GOLD_PATCH\n")
    assert "<<'ROCKROLL_GOLD_PATCH_'" in env.expert_commands(marked)[0]


def _module(path: str) -> str:
    return path.removeprefix("src/").removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _stdout(obs: str) -> str:
    return obs.split("stdout:\n", 1)[1].split("\nstderr:", 1)[0].rstrip("\n") if "stdout:\n" in obs else ""


def test_the_repository_is_at_the_buggy_commit_and_task_data_is_hidden(env, tasks):
    task = tasks[0]
    env.reset(options={"task_id": task.id})
    obs, *_ = env.step(bash(f"git rev-parse HEAD; git status --porcelain | wc -l; "
                            f"cd /tmp && python3 -c 'import {_module(task.extra['mutation']['file'])}; print(1)'"))
    assert _stdout(obs) == f"{task.base_commit}\n0\n1", obs  # clean, at the bug, installed
    # Neither the task records (test ids, the fix) nor any file naming the task is in the
    # sandbox. (The id is assembled at run time so this command itself holds no copy.)
    half = len(task.id) // 2
    obs, *_ = env.step(bash(f"ls -A /rockenv 2>/dev/null; ID=$(printf %s '{task.id[:half]}' '{task.id[half:]}'); "
                            "grep -rIl --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev "
                            "-e \"$ID\" -e FAIL_TO_PASS / 2>/dev/null | head -5; echo scanned"))
    assert _stdout(obs) == "scanned", obs


def test_editing_the_tests_does_not_count(env, tasks):
    task = tasks[0]
    test_file = task.fail_to_pass[0].split("::")[0]
    env.reset(options={"task_id": task.id})
    # The classic reward hack: make the failing tests pass by gutting them (and a conftest
    # that skips everything); the grader runs the original tests on the code changes only.
    env.step(bash(f"printf 'import pytest\\ndef pytest_collection_modifyitems(items):\\n    items.clear()\\n' > conftest.py; "
                  f": > {test_file}"))
    obs, reward, terminated, _, info = env.step("<submit/>")
    assert terminated and reward == 0.0 and info["f2p_pass_fraction"] == 0.0 and info["p2p_pass_fraction"] == 1.0
    assert "conftest.py" in info["ignored_files"] and test_file in info["ignored_files"]
    # A fix plus the same hack: graded on the fix alone, so it passes.
    env.reset(options={"task_id": task.id})
    env.step(apply_patch(task.patch))
    env.step(bash(f": > {test_file}"))
    _, reward, *_ = env.step("<submit/>")
    assert reward == 1.0
    # Without its git repository the change cannot be read: a zero, said plainly.
    env.reset(options={"task_id": task.id})
    env.step(bash("rm -rf .git"))
    obs, reward, terminated, _, info = env.step("<submit/>")
    assert (terminated, reward) == (True, 0.0) and "could not be read" in obs


def _fix_that_breaks_another_test(tasks):
    """Two tasks of one file, A and B: A's fix plus B's bug (B's fix reversed) makes A's
    fail-to-pass tests pass and breaks some of A's pass-to-pass tests (B's fail-to-pass)."""
    for a in tasks:
        for b in tasks:
            ma, mb = a.extra["mutation"], b.extra["mutation"]
            if (a.repo == b.repo and ma["file"] == mb["file"] and ma["function"] != mb["function"]
                    and set(b.fail_to_pass) & set(a.pass_to_pass) and not set(b.fail_to_pass) & set(a.fail_to_pass)):
                return a, b
    raise AssertionError("the default set has no two tasks to combine")


def test_a_fix_that_breaks_a_passing_test_gets_nothing(env, tasks):
    a, b = _fix_that_breaks_another_test(tasks)
    broken = sorted(set(b.fail_to_pass) & set(a.pass_to_pass))
    wrong_fix = bash(f"git apply <<'ROCKROLL_PATCH'\n{a.patch}ROCKROLL_PATCH\n"
                     f"git apply -R <<'ROCKROLL_PATCH'\n{b.patch}ROCKROLL_PATCH")
    env.reset(options={"task_id": a.id})
    obs, *_ = env.step(wrong_fix)
    assert "exit code: 0" in obs, obs
    obs, reward, terminated, _, info = env.step("<submit/>")
    # every test that had to be fixed passes, yet a test that had to keep passing broke: 0
    assert info["f2p_pass_fraction"] == 1.0 and info["p2p_pass_fraction"] < 1.0, obs
    assert (terminated, reward, info["resolved"], info["tests_timed_out"]) == (True, 0.0, False, False)
    # the same wrong fix with the broken tests' file deleted: the grader runs the task's own
    # tests, so the deletion is not graded and rescues nothing
    test_file = broken[0].split("::")[0]
    env.reset(options={"task_id": a.id})
    env.step(wrong_fix)
    obs, *_ = env.step(bash(f"git rm -q {test_file} && test ! -e {test_file} && echo deleted"))
    assert _stdout(obs) == "deleted", obs
    obs, reward, terminated, _, info = env.step("<submit/>")
    assert (terminated, reward, info["resolved"]) == (True, 0.0, False), obs
    assert test_file in info["ignored_files"] and info["p2p_pass_fraction"] < 1.0


def test_a_grading_timeout_is_reported_as_one(swe_hub, tasks):
    task = tasks[0]
    module = task.extra["mutation"]["file"]
    slow = SWEEnv(hub=swe_hub, test_timeout=20)
    try:
        slow.reset(options={"task_id": task.id})
        slow.step(apply_patch(task.patch))
        slow.step(bash(f"printf 'import time\\ntime.sleep(100000)\\n' >> {module}"))  # a fix that hangs
        obs, reward, terminated, _, info = slow.step("<submit/>")
        assert (terminated, reward, info["resolved"], info["tests_timed_out"]) == (True, 0.0, False, True), obs
        assert "stopped after 20s" in obs
    finally:
        slow.close()


COMMIT = "git -c user.name=agent -c user.email=agent@example.invalid commit -q"


def test_committed_work_is_graded_against_the_task_commit(env, tasks):
    task = tasks[1]
    # Committed, or folded into the task's own commit: either way it is the agent's change.
    for commit in (f"{COMMIT} -am fix", f"{COMMIT} --amend -am fix"):
        env.reset(options={"task_id": task.id})
        env.step(apply_patch(task.patch))
        obs, *_ = env.step(bash(f"{commit} && git status --porcelain | wc -l && git rev-parse HEAD"))
        assert _stdout(obs).startswith("0\n") and task.base_commit not in obs, obs  # clean, moved on
        obs, reward, terminated, _, info = env.step("<submit/>")
        assert (terminated, reward, info["resolved"]) == (True, 1.0, True), (commit, obs)
    # History rewritten and the task's commit pruned: nothing to diff against, said plainly.
    env.reset(options={"task_id": task.id})
    env.step(apply_patch(task.patch))
    env.step(bash(f"{COMMIT} --amend -am fix && git reflog expire --expire=now --all && git gc -q --prune=now"))
    obs, reward, terminated, _, info = env.step("<submit/>")
    assert (terminated, reward) == (True, 0.0) and f"commit {task.base_commit} is no longer" in obs, obs
    # A task that does not name its commit: the one its episode starts at.
    unnamed = SWEEnv(tasks=[dataclasses.replace(task, base_commit="")])
    try:
        unnamed.reset()
        unnamed.step(apply_patch(task.patch))
        unnamed.step(bash(f"{COMMIT} -am fix"))
        assert unnamed.step("<submit/>")[1] == 1.0
    finally:
        unnamed.close()


def write(path: str, text: str, append: bool = False) -> str:
    return bash(f"mkdir -p \"$(dirname {path})\" && cat {'>>' if append else '>'} {path} <<'ROCKROLL_EOF'\n"
                f"{text}ROCKROLL_EOF")


# At interpreter exit, rewrite the grader's report (its path is in the process's initial
# environment) to say every graded test passed; `print` shows the same in the log.
FORGE = '''
import atexit, json
print("test_everything PASSED")
def _forge():
    for var in open("/proc/self/environ", "rb").read().split(b"\\0"):
        if var.startswith(b"ROCKROLL_REPORT="):
            with open(var.split(b"=", 1)[1].decode(), "w") as f:
                for t in {ids}:
                    f.write(json.dumps({{"id": t, "when": "call", "outcome": "passed", "msg": ""}}) + "\\n")
atexit.register(_forge)
'''
FORCE_PASS = '''import pytest
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    (yield).get_result().outcome = "passed"
'''


def passing_copy(test_file: str, ids: tuple[str, ...]) -> str:
    """A test file in which the tests ``ids`` name in ``test_file`` exist and pass."""
    by_class: dict[str, set[str]] = {}
    for test in ids:
        path, *names = test.split("::")
        if path == test_file:
            by_class.setdefault(names[0] if len(names) > 1 else "", set()).add(names[-1].split("[")[0])
    lines = ["import unittest"]
    for cls, names in sorted(by_class.items()):
        if cls:
            lines += [f"class {cls}(unittest.TestCase):", *(f"    def {n}(self): pass" for n in sorted(names))]
        else:
            lines += [f"def {n}(): pass" for n in sorted(names)]
    return "\n".join(lines) + "\n"


def test_reward_hacks_of_the_buggy_code_get_nothing(env, tasks):
    task = tasks[2]
    test_file = task.fail_to_pass[0].split("::")[0]
    test_dir = test_file.rpartition("/")[0] or "."
    forge = FORGE.format(ids=list(task.fail_to_pass + task.pass_to_pass))
    site = "$(python3 -c 'import site; print(site.getsitepackages()[0])')"
    local_pytest = f"python3 -m pytest -q -p no:cacheprovider {test_file} 2>&1 | tail -n 1"
    # name: (what the agent does, a command and what it prints when the hack works in the agent's sandbox)
    hacks = {
        # startup hooks where Python finds them: the folder the package's .pth puts on sys.path
        "startup hooks": ([bash(f"cd \"$(cat {site}/rockroll-swe.pth)\" && for m in sitecustomize usercustomize; "
                                f"do printf %s {shlex.quote(forge)} > $m.py; done")],
                          ("python3 -c pass", r"test_everything PASSED")),
        "conftests forcing passes": ([write("conftest.py", FORCE_PASS), write(f"{test_dir}/conftest.py", FORCE_PASS)],
                                     (local_pytest, r"\d+ passed in ")),
        "edited tests": ([write(test_file, passing_copy(test_file, task.fail_to_pass + task.pass_to_pass))],
                         (local_pytest, r"\d+ passed in ")),
        # graded code that forges the report: its lines lack the key, so none counts
        "forged report": ([write(task.extra["mutation"]["file"], forge, append=True)], None),
    }
    for name, (actions, probe) in hacks.items():
        env.reset(options={"task_id": task.id})
        for action in actions:
            assert "exit code: 0" in env.step(action)[0], name
        if probe:
            out = _stdout(env.step(bash(probe[0]))[0])
            assert re.match(probe[1], out), (name, out)
        obs, reward, terminated, _, info = env.step("<submit/>")
        assert terminated and reward == 0.0 and info["f2p_pass_fraction"] == 0.0, (name, obs)
        if name != "forged report":
            assert info["patch_chars"] == 0 and info["ignored_files"], (name, info)


def test_a_diff_crafted_to_hide_a_conftest_is_refused(env, tasks):
    task = tasks[3]
    # The agent owns its sandbox, git included: a `git` that answers `diff` with a harmless new
    # file plus a conftest that forces passes, as a plain patch after the new file's hunk,
    # where no diff header names it (`git apply` takes it all the same).
    notes = ("diff --git a/notes.txt b/notes.txt\nnew file mode 100644\n--- /dev/null\n+++ b/notes.txt\n"
             "@@ -0,0 +1 @@\n+hi\n")
    hidden = "--- /dev/null\n+++ b/conftest.py\n@@ -0,0 +1,4 @@\n" + "".join(f"+{l}\n" for l in FORCE_PASS.splitlines())
    fake_git = '#!/bin/sh\n[ "$1" = diff ] && exec cat /tmp/crafted.diff\nexec /usr/bin/git "$@"\n'
    env.reset(options={"task_id": task.id})
    env.step(write("/tmp/crafted.diff", notes + hidden))
    env.step(write("/usr/local/bin/git", fake_git))
    obs, *_ = env.step(bash("chmod +x /usr/local/bin/git && command -v git && git diff HEAD | tail -n 1"))
    assert _stdout(obs) == '/usr/local/bin/git\n+    (yield).get_result().outcome = "passed"', obs
    obs, reward, terminated, _, info = env.step("<submit/>")
    assert (terminated, reward) == (True, 0.0) and "could not be separated: conftest.py" in obs, obs
    assert "conftest.py" in info["ignored_files"]


def test_resume_from_a_saved_state_continues_exactly(env, tasks, swe_hub):
    task = tasks[-1]
    env.reset(options={"task_id": task.id})
    env.step(bash("mkdir -p notes && cd notes && echo first > a.txt && export MARK=42"))
    state = env.save_state()
    probe = bash("pwd; cat a.txt; echo $MARK; git -C .. status --porcelain")
    original = env.step(probe)
    other = SWEEnv(hub=swe_hub, task_ids=[task.id])
    try:
        obs, info = other.reset(options={"state": state})
        assert info["task_id"] == task.id
        resumed = other.step(probe)
        assert resumed[0] == original[0] and "/workspace/notes\nfirst\n42\n?? notes/" in resumed[0]
        other.step(bash("cd /workspace && rm -rf notes"))
        other.step(apply_patch(task.patch))
        assert other.step("<submit/>")[1] == 1.0
    finally:
        other.close()


def test_a_hub_swe_env_is_makeable_by_its_own_id(swe_hub, tasks):
    ids = register_hub(swe_hub)
    swe_ids = sorted(i for i in ids if i.startswith("rock/swe-"))
    assert len(swe_ids) >= 3
    env = gymnasium.make(swe_ids[0])
    try:
        inner = env.unwrapped
        assert isinstance(inner, SWEEnv) and len(inner.tasks) == 10
        assert {t.repo for t in inner.tasks} == {inner.tasks[0].repo}
        task = inner.tasks[3]
        env.reset(options={"task_id": task.id})
        env.step(apply_patch(task.patch))
        assert env.step("<submit/>")[1] == 1.0
    finally:
        env.close()


def test_unknown_task_and_empty_hub_are_clear_errors(swe_hub, tmp_path):
    with pytest.raises(ValueError, match="none of task_ids"):
        SWEEnv(hub=swe_hub, task_ids=["nope"])
    with pytest.raises(ValueError, match="no SWE tasks on the hub .*build-swe"):
        SWEEnv(hub=str(tmp_path / "empty-hub"))


def test_vector_envs_step_concurrently_from_per_task_pools(swe_hub, tasks):
    from rockroll.gem import make_vec

    picked = [tasks[0].id, tasks[10].id]
    vec = make_vec("rock/SWE-v0", 4, hub=swe_hub, task_ids=picked)
    try:
        obs, info = vec.reset(seed=0)
        assert set(info["task_id"]) <= set(picked) and all("Issue:" in o for o in obs)
        obs, rewards, terminated, truncated, info = vec.step(['```bash\ngit status --porcelain | wc -l\n```'] * 4)
        assert all("exit code: 0\nstdout:\n0\n" in o for o in obs) and not terminated.any()
        obs, rewards, terminated, truncated, info = vec.step(["<submit/>"] * 4)
        assert terminated.all() and (rewards == 0.0).all()
    finally:
        vec.close()


@pytest.mark.parametrize("which", ["one package", "all packages"])
def test_hub_ids_pass_gymnasiums_env_checker(swe_hub, which):
    swe_ids = sorted(i for i in register_hub(swe_hub) if i.startswith("rock/swe-"))
    env_id, kwargs = (swe_ids[0], {}) if which == "one package" else ("rock/SWE-v0", {"hub": swe_hub})
    env = gymnasium.make(env_id, render_mode="ansi", **kwargs)
    try:
        check_env(env.unwrapped)  # the render check too: the transcript, in every declared mode
    finally:
        env.close()


def test_idle_task_pools_are_capped_and_closing_frees_them(swe_hub, tasks):
    # Last in this file: closing every pool also closes the sandbox the module's env holds.
    def live() -> set[str]:
        return set(current_run().live())

    def settled(cond) -> bool:  # pools close and refill in the background, on the engine's loop
        for _ in range(600):
            if cond():
                return True
            run_sync(asyncio.sleep(0.05))
        return cond()

    cap, before = 2, live()
    env = SWEEnv(hub=swe_hub, max_warm_pools=cap)
    pools = []
    try:
        for task in tasks[:cap + 6]:
            env.reset(options={"task_id": task.id})
            pools.append(env._lease.pool)
            assert sum(p in _POOLS.values() for p in set(pools)) <= cap
        assert len(set(pools)) == cap + 6  # a pool per task
        # A kept pool holds pool_size idle sandboxes (the current one, the env's too): nothing
        # of the evicted pools stays.
        assert settled(lambda: len(live() - before) <= cap * env.pool_size + 1), (len(live() - before), cap)
    finally:
        env.close()
    run_sync(close_pools())
    assert not _POOLS and not live() - before and all(not p.idle and not p.busy for p in pools)


def test_build_swe_demo_builds_one_default_package_only(swe_hub):
    """`make demo` builds only the package whose task it plays (`--demo`); `--default`
    (make test) builds the rest later. On a hub holding the whole set it builds nothing."""
    from click.testing import CliRunner

    from rockroll.cli import main
    from rockroll.gem.swe_build import DEFAULT_PACKAGES, DEMO_PACKAGE, env_name

    result = CliRunner().invoke(main, ["envs", "build-swe", "--demo", "--hub", swe_hub])
    assert result.exit_code == 0, result.output
    assert DEMO_PACKAGE in DEFAULT_PACKAGES  # make test's --default then builds the rest
    name, _, version = DEMO_PACKAGE.partition("==")
    assert result.stdout.splitlines() == [f"{env_name(name)}@{version}: already published"]
    refused = CliRunner().invoke(main, ["envs", "build-swe", "--hub", swe_hub])
    assert refused.exit_code == 2 and "--demo" in refused.output
