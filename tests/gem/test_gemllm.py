"""GEM interop both ways, with the real gem-llm package (pinned in the test extra):
gem-llm's envs (a game, a reasoning-gym env, its tool wrapper) through rockroll's one factory,
its python tool in a rockroll sandbox (attacked), and rockroll's envs under ``gem.make``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import gem
import numpy as np
import pytest
from gem.tools.tool_env_wrapper import ToolEnvWrapper
from gymnasium.error import NameNotFound

import rockroll  # noqa: F401 - registers the rock/ ids (and, gem-llm being imported, the rock: ones)
from rockroll.gem.factory import make_env
from rockroll.gem.gemllm import GemLLMEnv, GemLLMUnavailable
from rockroll.gem.gemllm_plugin import RockEnv
from rockroll.gem.gemllm_tool import SandboxPythonTool
from rockroll.gem.vector import make_vec
from rockroll.trainer.config import EnvConfig
from rockroll.trainer.envs import make_env as trainer_make_env
from rockroll.trainer.models import _env_texts

ROOT = Path(__file__).resolve().parents[2]
GUESS = "gem:game:GuessTheNumber-v0-easy"


def boxed(x) -> str:
    return "\\boxed{" + str(x) + "}"


def play_binary_search(env, lo: int = 1, hi: int = 10) -> tuple[list[str], float, dict]:
    """Guess the number by bisection from gem-llm's hints; the observations, last reward and info."""
    seen = []
    while True:
        guess = (lo + hi) // 2
        obs, reward, term, trunc, info = env.step(f"My guess: {boxed(guess)}")
        seen.append(obs)
        if term or trunc:
            return seen, reward, info
        if "higher" in obs:
            lo = guess + 1
        else:
            hi = guess - 1


# ------------------------------------------------------------------------------ the source checkout
def test_the_suite_imports_gem_llm_not_the_checkouts_gem_folder():
    assert hasattr(gem, "make") and "site-packages" in gem.__file__
    assert Path(gem.__file__).resolve().parent != ROOT / "gem"


def test_from_the_checkout_root_rockroll_imports_gem_llm_past_the_folder_and_names_a_shadowing():
    """`python -c` in the checkout's root puts the root first on sys.path, where gem/ is a
    package named gem: rockroll still gets gem-llm (and so does every later `import gem`);
    a user's own `import gem` there gets the folder, and rockroll then says so."""
    use = "from rockroll.gem.gemllm_load import load_gem_llm\nprint(type(load_gem_llm().make('game:GuessTheNumber-v0-easy')).__name__)"
    run = lambda code, *flags: subprocess.run([sys.executable, *flags, "-c", code], cwd=ROOT,  # noqa: E731
                                              capture_output=True, text=True, timeout=120)
    r = run(use + "\nimport gem\nprint(gem.__file__)")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines()[0] == "GuessTheNumberEnv" and "site-packages" in r.stdout.splitlines()[1]
    shadowed = run("import gem\n" + use)
    assert shadowed.returncode != 0
    assert "GemLLMUnavailable" in shadowed.stderr and str(ROOT / "gem") in shadowed.stderr
    assert "python -P" in shadowed.stderr
    safe = run("import gem\n" + use, "-P")
    assert safe.returncode == 0, safe.stderr[-2000:]
    assert safe.stdout.strip() == "GuessTheNumberEnv"


# --------------------------------------------------------------------------- gem-llm envs in rockroll
def test_a_gem_llm_game_plays_through_the_adapter_with_its_kwargs_overridable():
    env = make_env(GUESS)
    assert isinstance(env, GemLLMEnv)
    obs, info = env.reset(seed=0)
    assert "between 1 and 10" in obs and "within 4 turns" in obs and info["suffix"] == "Enter your next guess."
    observations, reward, info = play_binary_search(env)
    assert reward == 1.0 and info["success"] is True  # bisection finds 1..10 within 4 turns
    assert "Congratulations" in observations[-1] and info["turn"] == len(observations)
    # the registered kwargs are defaults: max_number overrides gem-llm's 10
    small = make_env(GUESS, max_number=3)
    assert "between 1 and 3" in small.reset(seed=0)[0]


def test_the_guess_the_number_expert_bisects_what_the_hints_leave():
    """``expert_action`` (the SFT data's expert) guesses the middle of the range gem-llm's hints
    have left: on 1..10 it names the bisection's guesses and wins every number within 4 turns;
    a game without an expert says so."""
    env = make_env(GUESS)
    for task in range(24):
        env.reset(options={"task_id": task})
        lo, hi, target = 1, 10, env.env.game_number
        while True:
            guess = (lo + hi) // 2
            assert env.expert_action() == boxed(guess)
            obs, reward, term, trunc, info = env.step(env.expert_action())
            if term or trunc:
                break
            lo, hi = (guess + 1, hi) if guess < target else (lo, guess - 1)
        assert reward == 1.0 and info["success"] and info["turn"] <= 4, task
        with pytest.raises(ValueError, match="episode is over"):
            env.expert_action()
    other = make_env("gem:game:Minesweeper-v0-easy")
    other.reset(seed=0)
    with pytest.raises(TypeError, match="no expert"):
        other.expert_action()


def test_seeds_and_task_ids_pick_the_episode_and_a_bad_answer_is_graded_by_gem_llm():
    def hints(env, **reset):
        env.reset(**reset)
        return [env.step(boxed(g))[0] for g in (1, 10)]

    a, b = make_env(GUESS), make_env(GUESS)
    assert hints(a, seed=5) == hints(b, seed=5)  # same seed, same hidden number
    # a task id alone fixes the episode, whatever the seed (a GRPO group plays one task) ...
    assert hints(a, seed=1, options={"task_id": 7}) == hints(b, seed=2, options={"task_id": 7})
    # ... and different task ids give different numbers
    targets = set()
    for task in range(12):
        a.reset(options={"task_id": task})
        targets.add(a.env.game_number)
    assert len(targets) > 3
    a.reset(seed=0)
    obs, reward, term, trunc, info = a.step("I think it is five")  # no \boxed{}: gem-llm's format error
    assert "did not provide a valid guess" in obs and reward == -0.1 and term and not info["success"]
    env = make_env(GUESS, format_penalty=-0.5)
    env.reset(seed=0)
    assert env.step(42)[1] == -0.5  # not even text: rockroll's format penalty, gem-llm never sees it
    with pytest.raises(NotImplementedError, match="does not support save_state"):
        env.save_state()  # gem-llm envs cannot resume a saved episode


def test_a_reasoning_gym_env_runs_offline_and_grades_boxed_answers(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    env = make_env("gem:rg:simple_equations")
    obs, _ = env.reset(seed=3)
    answer = env.env.data["answer"]  # reasoning-gym's own answer for the question it generated
    assert "=" in obs and answer
    obs, reward, term, trunc, info = env.step(f"So {boxed(answer)}")
    assert (reward, term, trunc, info["success"]) == (1.0, True, False, True)
    env.reset(seed=3)
    assert env.env.data["answer"] == answer  # same seed, same question
    wrong = str(int(answer) + 1) if answer.lstrip("-").isdigit() else answer + "1"
    assert env.step(boxed(wrong))[1:4] == (0.0, True, False)


def test_gem_llms_python_tool_wrapper_steps_through_the_adapter():
    env = make_env("gem:rg:simple_equations", wrappers="python_tool")  # gem-llm's WRAPPER_FACTORY entry
    assert isinstance(env.env, ToolEnvWrapper)
    obs, info = env.reset(seed=3)
    assert "<python>" in obs and info["tool_use_counter"] == 0
    answer = env.env.env.data["answer"]
    obs, reward, term, trunc, info = env.step("<python>print(6 * 7)</python>")
    assert obs == "Code execution result: 42\n\n" and not term and info["tool_use_counter"] == 1
    assert reward == pytest.approx(0.3)  # gem-llm's python_tool: 0.05 for the use, 0.25 for its success
    obs, reward, term, trunc, info = env.step(boxed(answer))
    assert (reward, term, info["success"]) == (1.0, True, True)


def test_a_bad_id_names_the_registry_and_unavailable_families_say_why(monkeypatch):
    with pytest.raises(NameNotFound, match=r"gem-llm's registry.*close: game:GuessTheNumber-v0-easy"):
        make_env("gem:game:GuessTheNumbr-v0-easy")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # never the network, whatever is installed
    with pytest.raises(GemLLMUnavailable, match="axon-rl/GSM-8k.*Hugging Face Hub"):
        make_env("gem:math:GSM8K")
    monkeypatch.delenv("SEARCH_URL", raising=False)
    with pytest.raises(GemLLMUnavailable, match="search server.*SEARCH_URL"):
        make_env("gem:rg:simple_equations", wrappers="search_tool")
    with pytest.raises(ValueError, match="unknown wrapper 'sandbox_concat'"):
        make_env(GUESS, wrappers="sandbox_concat")


def test_the_trainer_factory_takes_gem_ids_and_gem_llm_entry_points():
    """The issue's two failures: an entry point of a gem-llm class (its reset takes no
    options) and the tokenizer builder making envs its own way."""
    entry = "gem.envs.game_env.guess_the_number:GuessTheNumberEnv"
    env = trainer_make_env(EnvConfig(id=entry, kwargs={"max_number": 4}), format_penalty=-0.2)
    assert isinstance(env, GemLLMEnv) and env.format_penalty == -0.2
    obs, _ = env.reset(seed=1, options={"task_id": 3})  # the trainer's call
    assert "between 1 and 4" in obs
    texts = _env_texts([EnvConfig(id=entry), EnvConfig(id=GUESS, task_ids=[0, 1])], episodes=2)
    assert sum("Guess The Number" in t for t in texts) == 4
    assert any("did not provide a valid guess" in t for t in texts)


def test_rockrolls_vector_env_steps_gem_llm_envs():
    vec = make_vec(GUESS, 3)
    obs, infos = vec.reset(seed=0)
    assert len(obs) == 3 and all("Guess The Number" in o for o in obs)
    hidden = [env.env.game_number for env in vec.envs]
    obs, rewards, terms, truncs, infos = vec.step([boxed(h) for h in hidden])  # each guesses right
    assert rewards.tolist() == [1.0] * 3 and terms.all() and infos["success"].all()
    obs, rewards, terms, truncs, _ = vec.step(["x"] * 3)  # NEXT_STEP autoreset: fresh episodes
    assert all("Guess The Number" in o for o in obs) and not terms.any() and rewards.tolist() == [0.0] * 3
    vec.close()


def test_rockroll_train_and_evaluation_on_a_gem_llm_game(tmp_path):
    sys.path.insert(0, str(ROOT / "tests" / "trainer"))
    from _tiny import run_config

    from rockroll.trainer.controller import train

    guesses = [boxed(n) for n in range(1, 11)]  # each one token (tokenizer.add_tokens), the only replies
    cfg = run_config(tmp_path, steps=2, envs=[{"id": GUESS, "task_ids": [0, 1]}],
                     tokenizer__build_dir=str(tmp_path / "tok"), tokenizer__add_tokens=guesses,
                     generation__allowed_tokens=guesses, rollout__max_turns=4, eval__every=2, eval__episodes=4)
    out = train(cfg)
    assert [h["step"] for h in out["history"]] == [0, 1]
    assert all(h["rollout/samples"] == 6 and h["rollout/format_errors"] == 0 for h in out["history"])
    run = tmp_path / "run"
    sample = json.loads((run / "transcripts" / "step_000000.jsonl").read_text().splitlines()[0])
    assert "Guess The Number" in sample["transcript"][0][1]
    replies = [text for role, text in sample["transcript"] if role == "agent"]
    assert replies and all(r in guesses for r in replies)  # gem-llm read every one as a guess
    assert all(text.startswith(("At turn", "Congratulations", "You have reached"))
               for role, text in sample["transcript"][1:] if role == "env")
    evals = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 2] and all(e["eval/episodes"] == 4 for e in evals)


def test_ray_env_workers_train_on_a_gem_llm_game(tmp_path):
    """Ray puts the driver's working folder on its workers' sys.path: started in the checkout's
    root, a worker's `import gem` would find the gem/ folder (this run failed so once). The
    run is a process of its own started there, as a user starts it (its ray.init also sets
    RAY_AUTH_MODE in its environment, which must not leak into later tests' clusters)."""
    import dataclasses

    sys.path.insert(0, str(ROOT / "tests" / "trainer"))
    from _tiny import run_config

    guesses = [boxed(n) for n in range(1, 11)]
    cfg = run_config(tmp_path, steps=1, envs=[{"id": GUESS, "task_ids": [0, 1]}],
                     tokenizer__build_dir=str(tmp_path / "tok"), tokenizer__add_tokens=guesses,
                     generation__allowed_tokens=guesses, rollout__max_turns=4,
                     ray={"enabled": True, "num_env_workers": 2}, logging__tensorboard=False)
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(dataclasses.asdict(cfg)))
    code = ("import json, sys\nfrom rockroll.trainer.config import load_config\n"
            "from rockroll.trainer.controller import train\nfrom rockroll.trainer.roles.ray import init_local_ray\n"
            "init_local_ray(num_cpus=2)\nout = train(load_config(json.load(open(sys.argv[1]))))\n"
            "print(json.dumps([[h['step'], h['rollout/samples'], h['rollout/groups_done']] for h in out['history']]))")
    r = subprocess.run([sys.executable, "-c", code, str(path)], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [[0, 6, 2]]


# ----------------------------------------------------------------------- the sandboxed python tool
@pytest.fixture
def tool():
    tool = SandboxPythonTool(timeout=5)
    yield tool
    tool.close()


def _run(tool, code: str) -> str:
    is_valid, has_error, obs, _ = tool.execute_action(f"<python>{code}</python>")
    assert is_valid
    return obs


def test_sandboxed_tool_in_gem_llms_own_wrapper_solves_a_task():
    tool = SandboxPythonTool(timeout=5)
    env = ToolEnvWrapper(gem.make("rg:simple_equations"), tools=[tool], tool_success_reward=0.5)
    env.reset(seed=3)
    answer = env.env.data["answer"]
    obs, reward, term, _, info = env.step(f"```python\nprint(sqrt(49), {answer!r})\n```")  # BASE_IMPORTS retry
    assert obs == f"Code execution result: 7.0 {answer}\n\n" and reward == 0.5 and not term
    assert info["tool_type"] == "python_code"
    assert env.step(boxed(answer))[1] == 1.0
    tool.close()


def test_sandboxed_tool_through_rockrolls_adapter_and_state_does_not_carry_over(tmp_path):
    env = make_env("gem:rg:simple_equations", wrappers="sandbox_python_tool")
    env.reset(seed=1)
    tool = env.env.tools[0]
    assert isinstance(tool, SandboxPythonTool)
    obs = env.step("<python>import subprocess\nopen('left', 'w').write('x')\n"
                   "subprocess.Popen(['sleep', '4242'])\nprint('planted')</python>")[0]
    assert "planted" in obs
    env.reset(seed=2)
    obs = env.step("<python>import os\nprint(os.path.exists('left'), "
                   "any('4242' in open(f'/proc/{p}/cmdline').read() for p in os.listdir('/proc') if p.isdigit()))"
                   "</python>")[0]
    assert obs == "Code execution result: False False\n\n"  # neither the file nor the process is there
    sandbox = tool.sandbox
    env.close()
    assert tool.sandbox is None and not sandbox.alive


def test_sandboxed_tool_has_no_network(tool):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    try:
        obs = _run(tool, f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
                         "    print('CONNECTED')\nexcept OSError as e:\n    print('refused', type(e).__name__)")
        assert "refused" in obs and "CONNECTED" not in obs
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()  # the host's listener has no connection queued: none reached it
    finally:
        listener.close()
    # and only a loopback of its own: no interface reaches out
    assert "['lo']" in _run(tool, "import socket\nprint([n for _, n in socket.if_nameindex()])")


def test_sandboxed_tool_cannot_read_host_secrets(tool):
    secrets = [Path("/root/.rockroll-gemllm-secret"), ROOT / ".rockroll-gemllm-secret"]
    for p in secrets:
        p.write_text("TOPSECRET-GEMLLM")
    try:
        obs = _run(tool, "import glob\nfor p in " + repr([str(p) for p in secrets]) + ":\n"
                         "    try:\n        print(open(p).read())\n    except OSError as e:\n"
                         "        print(type(e).__name__)\nprint(glob.glob('/root/*'), glob.glob('/work/*'))")
    finally:
        for p in secrets:
            p.unlink()
    assert "TOPSECRET" not in obs
    assert obs.count("FileNotFoundError") == 2 and "[] []" in obs


def test_sandboxed_tool_contains_a_fork_bomb_and_the_pids_limit_held(tool):
    # gem-llm's own tool blocks the word "os.fork" in the code; getattr walks around that
    # filter, the sandbox's pids cgroup does not
    obs = _run(tool, "import os, time\nfork = getattr(os, 'fo' + 'rk')\nn = 0\ntry:\n"
                     "    while True:\n        if fork() == 0:\n            time.sleep(60)\n            os._exit(0)\n"
                     "        n += 1\nexcept OSError as e:\n    print('refused after', n, type(e).__name__)")
    assert "refused after" in obs and "BlockingIOError" in obs
    group = tool.sandbox.aio._deploy.cgroup
    read = lambda name: Path(group.dirs["pids"], name).read_text().split()  # noqa: E731
    assert read("pids.max") == ["64"]
    assert 32 < int(read("pids.peak")[0]) <= 64  # the kernel never let it hold more than 64
    assert int(read("pids.events")[1]) > 0  # and refused its forks at that limit
    assert int(read("pids.current")[0]) < 10  # the reset after the call killed the sleeping children
    assert _run(tool, "print('still', 'works')") == "Code execution result: still works\n\n"
    assert os.system("true") == 0  # and the host forks fine


def test_sandboxed_tool_times_out_like_gem_llms(tool):
    tool.timeout = 1
    is_valid, has_error, obs, _ = tool.execute_action("<python>while True:\n    pass</python>")
    assert is_valid and has_error and obs == "Code execution result: Execution timed out after 1 seconds.\n"


# ------------------------------------------------------------------------- rockroll envs under gem-llm
def test_gem_make_runs_rockroll_envs():
    env = gem.make("rock:FrozenLake-v0", max_actions_per_turn=1)
    assert isinstance(env, RockEnv) and env.env_id == "rock:FrozenLake-v0"
    obs, info = env.reset(seed=2)  # a map where Right, Down keep the player on the ice
    assert "FrozenLake" in obs
    obs, reward, term, trunc, info = env.step("Right")
    assert info["turn"] == 1 and info["moves"] == ["Right"]
    saved = env.get_state()
    child = env.spawn(same_state=True)  # gem-llm's spawn: same episode, continued alike
    assert child.step("Down")[:4] == env.step("Down")[:4]
    env.set_state(saved)
    assert env.step("Down")[0] == child.env.save_state()["transcript"][-1][1]
    assert "rock:SWE-v0" in gem.envs.registration.ENV_REGISTRY  # every built-in id
    env.close()


def test_gem_llms_vector_env_and_wrappers_over_a_rockroll_env():
    from gem.wrappers.wrapper_factory import get_wrapper_fns

    vec = gem.make_vec(["rock:FrozenLake-v0"] * 3, wrappers=get_wrapper_fns("concat,episode_tracking"))
    obs, infos = vec.reset()
    assert len(obs) == 3 and len(set(obs)) > 1  # make_vec's per-env seeds: different maps
    obs, rewards, terms, truncs, infos = vec.step(["Right"] * 3)
    assert all(o.count("FrozenLake.") == 1 and "Right" not in o.split("FrozenLake.")[0] for o in obs)
    for i, info in enumerate(infos):  # gem-llm's SAME_STEP autoreset: an ended env is reset at once
        assert info["step_counter"] == (0 if terms[i] or truncs[i] else 1)
    assert isinstance(rewards, np.ndarray) and rewards.shape == (3,)
    for env in vec.envs:
        env.unwrapped.close()


def test_a_sandbox_backed_rockroll_env_under_gem_make_with_the_sandboxed_tool():
    env = ToolEnvWrapper(gem.make("rock:Terminal-v0"), tools=[SandboxPythonTool(timeout=5)])
    try:
        obs, info = env.reset(seed=0)
        assert "<python>" in obs and not info.get("infra_error")
        obs, _, term, _, info = env.step("<python>print(2 ** 10)</python>")  # the tool's sandbox
        assert obs == "Code execution result: 1024\n\n" and info["use_tool"]
        obs, _, term, _, info = env.step("```bash\necho from-the-terminal-env\n```")  # the env's sandbox
        assert "from-the-terminal-env" in obs and info["turn"] == 1 and not info.get("infra_error")
    finally:
        env.tools[0].close()
        env.env.close()


@pytest.mark.parametrize("first, second", [("gem", "rockroll"), ("rockroll", "gem")])
def test_rock_ids_are_registered_whichever_is_imported_first(first, second, tmp_path):
    code = (f"import sys, {first}\nprint(sorted({{'gem', 'rockroll.gem'}} & set(sys.modules)))\nimport {second}\n"
            "env = gem.make('rock:Math-v0'); print(type(env).__name__, env.reset(seed=0)[0][:9])")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    imported, made = r.stdout.splitlines()[-2:]
    assert made == "RockEnv Solve thi" or made.startswith("RockEnv ")
    # import rockroll alone imports neither gem-llm nor its own env code
    assert imported == ("['gem']" if first == "gem" else "[]")


def test_rockroll_envs_lists_gem_llm_ids_with_why_some_cannot_run(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([str(Path(sys.executable).parent / "rockroll"), "envs", "--gem-llm", "--json"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {row["id"]: row for row in json.loads(r.stdout)}
    assert "rock/FrozenLake-v0" in rows  # rockroll's own ids still come first
    assert rows[GUESS]["source"] == "gem-llm 0.1.0" and rows[GUESS]["description"] == ""
    assert rows["gem:rg:simple_equations"]["description"] == ""
    assert "cannot run here" in rows["gem:math:GSM8K"]["description"]
    assert "axon-rl/GSM-8k" in rows["gem:math:GSM8K"]["description"]

