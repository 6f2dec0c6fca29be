"""The agents ``rock/Agent-v0`` can run: unmodified agent programs that talk to an
OpenAI-compatible endpoint (``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``, which every sandbox
with a model endpoint has; see docs/modelservice.md).

An ``AgentSpec`` says how to put an agent into an env image (``install``: setup steps run
at build time, like a hub package's ``setup``, with the network ``network`` lists: none
unless it names the index, e.g. ``("@pip",)``) and how to start it on a task
(``command``, in the sandbox's workdir, with ``{task}`` replaced by the path of a file
holding the task's instruction). Add an agent by adding an entry to ``AGENTS``.
``rockroll envs build-swe --agent NAME`` builds SWE envs with an agent installed
(:func:`rockroll.gem.swe_build.build_agent_variant`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

__all__ = ["AGENTS", "AGENT_DIR", "AGENT_PYLIB", "AgentSpec", "MINI_SWE_AGENT_VERSION", "agent_package", "agent_spec",
           "script_step"]

#: Where agents' own files and Python libraries go in an image.
AGENT_DIR = "/opt/rockroll/agents"
AGENT_PYLIB = "/opt/rockroll/pylib"
#: The openai client the tool agent is installed with (the version the tests run).
OPENAI_CLIENT = "openai==3.57.0"
#: The package index install steps reach: the one this machine's pip uses, read at build time
#: (``envhub/indexes.py``; ``rockroll hub build`` opens nothing else).
PIP_INDEX = ("@pip",)


@dataclass(frozen=True)
class AgentSpec:
    name: str
    command: str                 # run in the sandbox's workdir; {task} is replaced by the path of a file holding the task's instruction text
    install: tuple[str, ...] = ()  # setup steps that put the agent into an env image at build time
    env: dict[str, str] = field(default_factory=dict)  # extra environment for the agent's session
    # What install steps may reach (the build's egress allow-list: hosts, or "@pip"/"@apt", the hosts
    # this machine's pip/apt use). Empty: no network, as a hub package's setup without network = [...];
    # not implied by a pip step, so an image never reaches further than its spec says (docs/agents.md).
    network: tuple[str, ...] = ()


def script_step(name: str) -> str:
    """A setup step writing the bundled agent script ``gem/data/agents/<name>`` to
    ``AGENT_DIR`` (a step carries its file: install steps need nothing from the host)."""
    text = (resources.files(__package__) / "data" / "agents" / name).read_text()
    marker = "ROCKROLL_AGENT_EOF"
    if marker in text:  # pragma: no cover - a bundled script never holds the marker
        raise ValueError(f"{name} contains {marker}")
    return f"mkdir -p {AGENT_DIR} && cat > {AGENT_DIR}/{name} <<'{marker}'\n{text}{marker}"


#: mini-swe-agent (github.com/SWE-agent/mini-swe-agent), installed from PyPI, unmodified.
#: litellm is pinned too: it is what talks to the endpoint (and a release of it was compromised).
MINI_SWE_AGENT_VERSION = "2.4.6"
_MINI_PINS = f"mini-swe-agent=={MINI_SWE_AGENT_VERSION} litellm==1.110.2"
_MINI_VENV = "/opt/mini-swe-agent"

def _openai_agent(name: str, script: str, args: str) -> AgentSpec:
    """One of our scripts on the official client: the script written, the client pip-installed."""
    return AgentSpec(name=name, command=f"python3 {AGENT_DIR}/{script} {args}",
                     install=(script_step(script),
                              f"python3 -m pip install --no-cache-dir --target {AGENT_PYLIB} '{OPENAI_CLIENT}'"),
                     env={"PYTHONPATH": AGENT_PYLIB}, network=PIP_INDEX)


AGENTS: dict[str, AgentSpec] = {
    "openai-tool-agent": _openai_agent("openai-tool-agent", "openai_tool_agent.py", "{task}"),
    # Plays the program ``./play`` that its task set puts in the workdir (``corridor``).
    "openai-chat-agent": _openai_agent("openai-chat-agent", "openai_chat_agent.py", "{task} ./play"),
    "mini-swe-agent": AgentSpec(
        name="mini-swe-agent",
        # Its own CLI, unattended: the text-based config (a THOUGHT, then one
        # ```mswea_bash_command block per reply: any chat model can follow it, no tool-call
        # support needed), yolo (no confirmations), exit when it submits, no cost limit
        # (the model service is free; the step limit bounds an episode). stdin is
        # /dev/null: nothing may wait for a human. litellm's "openai/" provider reads
        # OPENAI_BASE_URL and OPENAI_API_KEY, which the sandbox provides.
        command=(f"{_MINI_VENV}/bin/mini --yolo --exit-immediately --model-class litellm_textbased "
                 "-c mini_textbased.yaml -c agent.step_limit=50 -c environment.timeout=120 --cost-limit 0 "
                 '--task "$(cat {task})" --output /tmp/mini-swe-agent/trajectory.json </dev/null'),
        install=(
            # Debian's python3 has no pip: python3-venv brings ensurepip's wheel.
            "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
            "python3-venv >/dev/null",
            f"python3 -m venv {_MINI_VENV} && {_MINI_VENV}/bin/pip install -q --no-cache-dir "
            f"--disable-pip-version-check {_MINI_PINS}",
            "rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt /var/log/dpkg.log "
            "/var/log/alternatives.log /root/.cache /root/.config",
            f"MSWEA_CONFIGURED=true MSWEA_GLOBAL_CONFIG_DIR=/tmp/mini-swe-agent {_MINI_VENV}/bin/mini --help >/dev/null "
            "&& rm -rf /tmp/mini-swe-agent",
        ),
        env={
            "MSWEA_MODEL_NAME": "openai/rockroll",      # litellm's OpenAI-compatible provider
            "MSWEA_CONFIGURED": "true",                 # skip the first-run setup prompt
            "MSWEA_GLOBAL_CONFIG_DIR": "/tmp/mini-swe-agent",
            "MSWEA_COST_TRACKING": "ignore_errors",     # a model litellm has no price for
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",     # no fetch of litellm's price map: no network
        },
        network=(*PIP_INDEX, "@apt"),  # pip, and apt for python3-venv
    ),
}


def agent_spec(agent: str | AgentSpec | dict) -> AgentSpec:
    """``agent`` itself, the ``AGENTS`` entry it names, or an ``AgentSpec`` from a mapping of
    its fields (a training config's YAML); ``ValueError`` naming what is wrong."""
    if isinstance(agent, AgentSpec):
        return agent
    if isinstance(agent, dict):
        try:
            return AgentSpec(**{**agent, "install": tuple(agent.get("install", ())),
                                "network": tuple(agent.get("network", ())),
                                "env": dict(agent.get("env", {}))})
        except TypeError as e:
            raise ValueError(f"agent: an AgentSpec needs name and command (and may have install, network, env): "
                             f"{e}") from None
    try:
        return AGENTS[agent]
    except (KeyError, TypeError):
        raise ValueError(f"agent must be one of {sorted(AGENTS)} or an AgentSpec, not {agent!r}") from None


def _agent_toml(spec: AgentSpec) -> str:
    """``spec`` as the TOML value ``gymnasium.make`` passes back as ``agent=``: the registry's
    name for an agent of ``AGENTS``, else an inline table of every field (JSON strings are
    TOML basic strings), so the published env runs exactly the agent its image holds."""
    if AGENTS.get(spec.name) == spec:
        return json.dumps(spec.name)
    env = ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in spec.env.items())
    return (f"{{ name = {json.dumps(spec.name)}, command = {json.dumps(spec.command)}, "
            f"install = [{', '.join(json.dumps(step) for step in spec.install)}], "
            f"network = [{', '.join(json.dumps(h) for h in spec.network)}], env = {{ {env} }} }}")


def agent_package(agent: str | AgentSpec, folder: str | os.PathLike, *, name: str | None = None,
                  version: str = "1.0.0", base: str = "host", files: dict[str, str] | None = None) -> Path:
    """Write an env package (``folder/rockenv.toml``) whose image holds ``agent``: its
    ``install`` steps are the package's setup (run at build time, with the network its
    ``network`` lists: none without one), ``files``
    (package-relative source -> path in the image) are copied in first. ``rockroll hub
    build|publish`` it; ``gymnasium.make`` of the published id (or ``rock/Agent-v0`` with
    ``image="hub:<name>@<version>"``) then runs episodes from warm sandboxes of that image."""
    spec = agent_spec(agent)
    name = name or f"agent-{spec.name}"
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lines = [f"name = {json.dumps(name)}", f"version = {json.dumps(version)}", f"base = {json.dumps(base)}",
             f"setup = [{', '.join(json.dumps(step) for step in spec.install)}]",
             f"network = [{', '.join(json.dumps(h) for h in spec.network)}]", "",
             "[files]", *(f"{json.dumps(src)} = {json.dumps(dst)}" for src, dst in (files or {}).items()), "",
             "[env]", 'entry_point = "rockroll.gem.agent_env:AgentEnv"',
             f"kwargs = {{ agent = {_agent_toml(spec)} }}", ""]
    (folder / "rockenv.toml").write_text("\n".join(lines))
    return folder
