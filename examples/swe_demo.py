"""The main job of `make demo`: one rock/SWE-v0 episode, played by a scripted agent.

`make demo` first publishes the demo's SWE tasks to your default hub (`rockroll envs
build-swe --demo`: one default package's sdist, bugs injected by AST mutation, kept
when they break some tests; `make test` adds the other two packages with `--default`). Then this script does what a user does:

    import gymnasium, rockroll
    env = gymnasium.make("rock/SWE-v0", render_mode="ansi")

and plays one episode with a scripted agent: it runs the test suite, looks at the diff
of nothing (the bug is committed), applies the task's reference fix (a scripted agent
knows it; a policy would have to find it), runs the tests again and submits. The
transcript (what the env showed, and each agent turn) and the reward are printed.

    python examples/swe_demo.py [TASK_ID]
"""

import json
import sys
import time

import gymnasium

import rockroll  # noqa: F401 - registers rock/SWE-v0 and the hub's envs


def bash(command: str) -> str:
    return json.dumps({"name": "bash", "arguments": {"command": command}})


def main() -> None:
    env = gymnasium.make("rock/SWE-v0", render_mode="ansi")
    swe = env.unwrapped
    task_id = sys.argv[1] if len(sys.argv) > 1 else swe.task_ids[0]
    task = swe._task_by_id(task_id)
    t0 = time.perf_counter()
    obs, info = env.reset(options={"task_id": task_id})
    reset_ms = (time.perf_counter() - t0) * 1000
    script = [
        bash("git log --oneline; python3 -m pytest -q -x 2>&1 | tail -n 4"),
        bash(f"git apply <<'FIX'\n{task.patch}FIX\ngit diff --stat"),
        bash("python3 -m pytest -q 2>&1 | tail -n 1"),
        "<submit/>",
    ]
    reward, info = 0.0, {}
    for action in script:
        obs, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            break
    print(env.render())
    print("\n" + "=" * 72)
    print(f"task {task_id} ({len(swe.tasks)} tasks from {len({t.repo for t in swe.tasks})} packages on the hub)")
    print(f"reset {reset_ms:.1f} ms; reward {reward}; FAIL_TO_PASS passing {info.get('f2p_pass_fraction')}, "
          f"PASS_TO_PASS passing {info.get('p2p_pass_fraction')}")
    env.close()
    if reward != 1.0:
        sys.exit("the scripted agent did not solve the task")


if __name__ == "__main__":
    main()
