"""Agent programs that run unmodified inside a sandbox, their model calls answered by the
model service (``rockroll.sandbox.modelservice``) through the sandbox's
``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``.

An ``AgentSpec`` says how to put an agent into an env image (``install``: setup steps run
at build time, with network) and how to run it on one task (``command``, in the sandbox's
workdir, with ``{task}`` replaced by the path of a file holding the task's instruction).
``rockroll envs build-swe --agent NAME`` builds SWE envs with an agent installed
(:func:`rockroll.gem.swe_build.build_agent_variant`). See docs/modelservice.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["AGENTS", "AgentSpec", "MINI_SWE_AGENT_VERSION"]


@dataclass(frozen=True)
class AgentSpec:
    name: str
    command: str                 # run in the sandbox's workdir; {task} is replaced by the path of a file holding the task's instruction text
    install: tuple[str, ...] = ()  # setup steps (with network) that put the agent into an env image at build time
    env: dict[str, str] = field(default_factory=dict)  # extra environment for the agent's session


#: mini-swe-agent (github.com/SWE-agent/mini-swe-agent), installed from PyPI, unmodified.
#: litellm is pinned too: it is what talks to the endpoint (and a release of it was compromised).
MINI_SWE_AGENT_VERSION = "2.4.6"
_MINI_PINS = f"mini-swe-agent=={MINI_SWE_AGENT_VERSION} litellm==1.110.2"
_MINI_VENV = "/opt/mini-swe-agent"

AGENTS: dict[str, AgentSpec] = {
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
    ),
}
