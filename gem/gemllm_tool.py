"""gem-llm's ``PythonCodeTool`` with the model's code run in a rockroll sandbox, for gem-llm's
own ``ToolEnvWrapper`` (isolation in one import). Importing this module imports gem-llm.

Same parsing, instructions, observations and ``BASE_IMPORTS`` retry as gem-llm's tool; the code
runs in a sandbox: no network, no host files, cgroup limits on processes, memory and CPU, and
the sandbox reset after every call (gem-llm's tool starts every call from a fresh process and
folder too, so no state carries between calls, nor between episodes).
"""

from __future__ import annotations

from .gemllm_load import load_gem_llm

load_gem_llm()

from gem.tools.python_code_tool import PythonCodeTool  # noqa: E402  (after the shadowing check)
from gem.utils.constants import BASE_IMPORTS  # noqa: E402

from rockroll.sandbox import Sandbox, SandboxError, SandboxSpec, open_sandbox  # noqa: E402

__all__ = ["SandboxPythonTool"]

# gem-llm's imports, each skipped where the sandbox's python lacks the module (the host image's
# python3 has no numpy): the names that can be imported still are
_BASE_IMPORTS = "\n".join(f"try:\n    {line}\nexcept ImportError:\n    pass"
                           for line in BASE_IMPORTS.splitlines() if line.strip())


class SandboxPythonTool(PythonCodeTool):
    """gem-llm's ``PythonCodeTool`` with the code run in a rockroll sandbox (see the module docstring).

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
