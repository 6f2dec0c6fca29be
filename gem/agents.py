"""The agents ``rock/Agent-v0`` can run: unmodified agent programs that talk to an
OpenAI-compatible endpoint (``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``, which every sandbox
with a model endpoint has; see docs/modelservice.md).

An ``AgentSpec`` says how to put an agent into an env image (``install``: setup steps run
at build time, with network, like a hub package's ``setup``) and how to start it on a task
(``command``). Add an agent by adding an entry to ``AGENTS``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources

__all__ = ["AGENTS", "AGENT_DIR", "AGENT_PYLIB", "AgentSpec", "agent_spec", "script_step"]

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
