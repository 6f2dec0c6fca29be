"""rockroll for gem-llm users: rockroll's envs under ``gem.make``, and gem-llm's python tool
run in a rockroll sandbox. Importing this module imports gem-llm.

- :class:`RockEnv` is a gem-llm ``Env`` driving any rockroll env; :func:`register_rock_envs`
  puts every ``rock/<Name>`` gymnasium id (built-in and hub envs) into gem-llm's registry as
  ``rock:<Name>``, so ``gem.make("rock:FrozenLake-v0")``, ``gem.make_vec`` and gem-llm's
  wrappers work on them. ``import rockroll`` arranges the registration
  (:func:`rockroll.gem.gemllm.install_registration`); hub envs registered later need another
  :func:`register_rock_envs` call.
- :class:`SandboxPythonTool` is gem-llm's ``PythonCodeTool`` (same parsing, instructions,
  observations and ``BASE_IMPORTS`` retry) whose code runs in a rockroll sandbox: no network,
  no host files, cgroup limits on processes, memory and CPU, and the sandbox reset after
  every call (gem-llm's tool starts every call from a fresh process and folder too, so no
  state carries between calls, nor between episodes). It plugs into gem-llm's own
  ``ToolEnvWrapper``.
"""

from __future__ import annotations

import functools
from typing import Any

from .gemllm import load_gem_llm

load_gem_llm()

from gem.core import Env  # noqa: E402  (after the shadowing check)
from gem.tools.python_code_tool import PythonCodeTool  # noqa: E402
from gem.utils.constants import BASE_IMPORTS  # noqa: E402

from rockroll.sandbox import Sandbox, SandboxError, SandboxSpec, open_sandbox  # noqa: E402

from .factory import make_env  # noqa: E402

__all__ = ["RockEnv", "SandboxPythonTool", "register_rock_envs"]

# gem-llm's imports, each skipped where the sandbox's python lacks the module (the host image's
# python3 has no numpy): the names that can be imported still are
_BASE_IMPORTS = "\n".join(f"try:\n    {line}\nexcept ImportError:\n    pass"
                           for line in BASE_IMPORTS.splitlines() if line.strip())


class RockEnv(Env):
    """A rockroll env as a gem-llm ``Env``: ``reset(seed)`` / ``step(action)`` as gem-llm calls them.

    ``seed`` (what ``gem.make_vec`` passes each env) seeds the first reset that gets none, so
    the envs of a vector env play different episodes; later resets continue the env's RNG.
    ``get_state``/``set_state`` are rockroll's ``save_state`` / ``reset(options={"state": ...})``.
    """

    def __init__(self, rock_id: str, seed: int | None = None, **kwargs: Any):
        super().__init__()
        self.rock_id, self.kwargs = rock_id, dict(kwargs)
        self.env = make_env(rock_id, **kwargs)
        self._first_seed = seed

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        if seed is None:
            seed, self._first_seed = self._first_seed, None
        return self.env.reset(seed=seed)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return self.env.step(action)

    def sample_random_action(self) -> str:
        return self.env.action_space.sample()

    def get_state(self) -> dict[str, Any]:
        return self.env.save_state()

    def set_state(self, state: dict[str, Any]) -> None:
        self.env.reset(options={"state": state})

    def spawn(self, same_state: bool = False, **kwargs: Any) -> "RockEnv":
        child = RockEnv(self.rock_id, **{**self.kwargs, **kwargs})
        if same_state:
            child.set_state(self.get_state())
        return child

    def close(self) -> None:
        self.env.close()


def register_rock_envs() -> list[str]:
    """Every ``rock/<Name>`` gymnasium id not yet in gem-llm's registry, as ``rock:<Name>``; the ids added."""
    import gymnasium
    from gem.envs.registration import ENV_REGISTRY, register

    added = []
    for rock_id in sorted(gymnasium.registry):
        if rock_id.startswith("rock/") and "rock:" + rock_id[5:] not in ENV_REGISTRY:
            register("rock:" + rock_id[5:], functools.partial(RockEnv, rock_id))
            added.append("rock:" + rock_id[5:])
    return added


class SandboxPythonTool(PythonCodeTool):
    """gem-llm's ``PythonCodeTool`` with the code run in a rockroll sandbox (module docstring).

    ``spec``: the sandbox (default: the host image's ``python3``, no network, 64 processes,
    512 MiB, one CPU). The sandbox opens at the first call and lives until :meth:`close`.
    """

    tool_type = "python_code"

    def __init__(self, timeout: int = 5, keep_error_last_line: bool = False, spec: SandboxSpec | None = None):
        super().__init__(timeout=timeout, sandbox_type="rockroll", keep_error_last_line=keep_error_last_line)
        self.spec = spec or SandboxSpec(cpus=1.0, memory_mb=512, pids=64, network=False,
                                        timeout_s=max(30.0, 2 * timeout))
        self.sandbox: Sandbox | None = None

    def execute_action(self, action: str) -> tuple[bool, bool, str, str]:
        """gem-llm's contract: ``(is_valid, has_error, observation, parsed_action)``."""
        code, parsed_action, is_valid = self._parse_action(action)
        if not is_valid:
            return False, True, "", parsed_action
        success, stdout, stderr = self.run_python(code)
        if stderr and self.keep_error_last_line:
            stderr = stderr.split("\n")[-1]
        result = f"{stdout}\n{stderr}" if stderr else stdout
        return True, not success, "Code execution result: " + result.lstrip(" \n") + "\n", parsed_action

    def run_python(self, code: str) -> tuple[bool, str, str]:
        """``(success, stdout, stderr)`` of ``code``; like gem-llm's, a run failing on a name that
        is not defined is retried with gem-llm's ``BASE_IMPORTS`` in front."""
        success, stdout, stderr = self._run(code)
        if not success and "is not defined" in stderr:
            success, stdout, stderr = self._run(_BASE_IMPORTS + "\n" + code)
        return success, stdout, stderr

    def _run(self, code: str) -> tuple[bool, str, str]:
        try:
            if self.sandbox is None:
                self.sandbox = open_sandbox(self.spec)
            try:
                self.sandbox.write_file("/workspace/main.py", code)
                r = self.sandbox.run("python3 main.py", timeout=self.timeout, cwd="/workspace")
            finally:
                self.sandbox.reset()  # kills what the code left running, drops its files
        except SandboxError as e:  # the sandbox failed, not the code: the next call gets a new one
            self.close()
            return False, "", f"Sandbox error: {type(e).__name__}: {e}"
        if r.timed_out:
            return False, r.stdout, f"\nExecution timed out after {self.timeout} seconds."
        return r.exit_code == 0, r.stdout, r.stderr.strip()

    def close(self) -> None:
        if self.sandbox is not None:
            sandbox, self.sandbox = self.sandbox, None
            sandbox.close()
