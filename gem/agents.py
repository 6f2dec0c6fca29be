"""The agents ``rock/Agent-v0`` can run: unmodified agent programs that talk to an
OpenAI-compatible endpoint (``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``, which every sandbox
with a model endpoint has; see docs/modelservice.md).

An ``AgentSpec`` says how to put an agent into an env image (``install``: setup steps run
at build time, with network, like a hub package's ``setup``) and how to start it on a task
(``command``). Add an agent by adding an entry to ``AGENTS``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

__all__ = ["AGENTS", "AGENT_DIR", "AGENT_PYLIB", "AgentSpec", "agent_package", "agent_spec", "script_step"]

#: Where agents' own files and Python libraries go in an image.
AGENT_DIR = "/opt/rockroll/agents"
AGENT_PYLIB = "/opt/rockroll/pylib"
#: The openai client the tool agent is installed with (the version the tests run).
OPENAI_CLIENT = "openai==3.57.0"


@dataclass(frozen=True)
class AgentSpec:
    name: str
    command: str                 # run in the sandbox's workdir; {task} is replaced by the path of a file holding the task's instruction text
    install: tuple[str, ...] = ()  # setup steps (with network) that put the agent into an env image at build time
    env: dict[str, str] = field(default_factory=dict)  # extra environment for the agent's session


def script_step(name: str) -> str:
    """A setup step writing the bundled agent script ``gem/data/agents/<name>`` to
    ``AGENT_DIR`` (a step carries its file: install steps need nothing from the host)."""
    text = (resources.files(__package__) / "data" / "agents" / name).read_text()
    marker = "ROCKROLL_AGENT_EOF"
    if marker in text:  # pragma: no cover - a bundled script never holds the marker
        raise ValueError(f"{name} contains {marker}")
    return f"mkdir -p {AGENT_DIR} && cat > {AGENT_DIR}/{name} <<'{marker}'\n{text}{marker}"


AGENTS: dict[str, AgentSpec] = {
    "openai-tool-agent": AgentSpec(
        name="openai-tool-agent",
        command=f"python3 {AGENT_DIR}/openai_tool_agent.py {{task}}",
        install=(script_step("openai_tool_agent.py"),
                 f"python3 -m pip install --no-cache-dir --target {AGENT_PYLIB} '{OPENAI_CLIENT}'"),
        env={"PYTHONPATH": AGENT_PYLIB},
    ),
}


def agent_spec(agent: str | AgentSpec) -> AgentSpec:
    """``agent`` itself, or the ``AGENTS`` entry it names (``ValueError`` naming the choices)."""
    if isinstance(agent, AgentSpec):
        return agent
    try:
        return AGENTS[agent]
    except (KeyError, TypeError):
        raise ValueError(f"agent must be one of {sorted(AGENTS)} or an AgentSpec, not {agent!r}") from None


def agent_package(agent: str | AgentSpec, folder: str | os.PathLike, *, name: str | None = None,
                  version: str = "1.0.0", base: str = "host", files: dict[str, str] | None = None) -> Path:
    """Write an env package (``folder/rockenv.toml``) whose image holds ``agent``: its
    ``install`` steps are the package's setup (run at build time, with network), ``files``
    (package-relative source -> path in the image) are copied in first. ``rockroll hub
    build|publish`` it; ``gymnasium.make`` of the published id (or ``rock/Agent-v0`` with
    ``image="hub:<name>@<version>"``) then runs episodes from warm sandboxes of that image."""
    spec = agent_spec(agent)
    name = name or f"agent-{spec.name}"
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lines = [f"name = {json.dumps(name)}", f"version = {json.dumps(version)}", f"base = {json.dumps(base)}",
             f"setup = [{', '.join(json.dumps(step) for step in spec.install)}]", "",
             "[files]", *(f"{json.dumps(src)} = {json.dumps(dst)}" for src, dst in (files or {}).items()), "",
             "[env]", 'entry_point = "rockroll.gem.agent_env:AgentEnv"',
             # An agent of the registry is named; another one must be passed to make() again.
             f"kwargs = {{ agent = {json.dumps(spec.name if spec.name in AGENTS else 'openai-tool-agent')} }}", ""]
    (folder / "rockenv.toml").write_text("\n".join(lines))
    return folder
