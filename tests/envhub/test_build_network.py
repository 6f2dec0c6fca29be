"""A build that fails for the network says so and names the fix (issue #53): real builds in
real sandboxes, the setup steps' own output read by ``envhub/netcause.py``.

A build sandbox has no network unless the package lists what its setup reaches; the suite
never wires one into the machine's namespace (tests/conftest.py's guard), which is also what
a machine that cannot wire a build's network looks like. The allow-list's own refusals are
the lab's (tests/sandbox/test_network.py); here their wording is checked on the pure function."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rockroll.envhub import BuildError, BuildNetworkError, build
from rockroll.envhub.cache import LocalCache
from rockroll.envhub.netcause import looks_like_network, roles_for, step_hint
from rockroll.gem.agents import AGENT_PYLIB, OPENAI_CLIENT, AgentSpec, agent_package

ROCKROLL = str(Path(sys.executable).parent / "rockroll")
DOCS_STEP = f"python3 -m pip install --no-cache-dir --target {AGENT_PYLIB} '{OPENAI_CLIENT}'"  # docs/agents.md's


@pytest.mark.parametrize("step, pip_said", [
    (DOCS_STEP, "Temporary failure in name resolution"),  # pip's retries name the resolver
    (DOCS_STEP.replace("install", "install --retries 0"), "(from versions: none)"),  # and without them, only this
])
def test_the_docs_agent_without_network_fails_saying_why_and_the_fix(tmp_path, step, pip_said):
    """docs/agents.md's AgentSpec as it was before #53 (``install`` pip-installs the client, no
    ``network=``), built as the page builds it (``rockroll hub build``): pip's own words stay,
    and the last lines say the step had no network and what to write, in rockenv.toml's and
    AgentSpec's terms. Nothing is recorded as built."""
    spec = AgentSpec(name="nonet", command="python3 /opt/mover/mover.py {task}", install=(step,),
                     env={"PYTHONPATH": AGENT_PYLIB})
    folder = agent_package(spec, tmp_path / "nonet-pkg")
    proc = subprocess.run([ROCKROLL, "hub", "build", str(folder)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    error = proc.stderr[proc.stderr.index("error: "):]
    assert error.startswith(f"error: setup step 1 ({step!r}) failed (exit 1):") and pip_said in error, error
    last = error.strip().splitlines()[-1]
    assert last.startswith("The step ran without network: ") and "this one lists nothing" in last, last
    assert 'Add network = ["@pip"] to rockenv.toml (an AgentSpec: network=("@pip",))' in last, last
    assert "$ROCKROLL_BUILD_NETWORK=host does not help here" in last, last
    assert not LocalCache().build_file("agent-nonet", "1.0.0").exists()


def test_a_step_failing_for_another_reason_gets_no_network_sentence(tmp_path):
    """No false alarm: a step without network that fails on its own (a missing file) is a
    plain BuildError with its output, no word of the network."""
    folder = tmp_path / "plain"
    folder.mkdir()
    (folder / "rockenv.toml").write_text('name = "plain"\nversion = "1.0.0"\n'
                                         'setup = ["cat /opt/no-such-file"]\n')
    with pytest.raises(BuildError) as err:
        build(folder)
    assert type(err.value) is BuildError and "No such file or directory" in str(err.value)
    assert "network" not in str(err.value)


def test_a_build_whose_listed_network_cannot_be_made_names_the_variable(tmp_path, monkeypatch):
    """A package listing ``@pip`` on a machine that will not wire its build a network of its
    own (here the suite's guard; elsewhere a container without CAP_NET_ADMIN): the sandbox's
    refusal, then the operator's way out, ``$ROCKROLL_BUILD_NETWORK=host``."""
    monkeypatch.delenv("ROCKROLL_BUILD_NETWORK", raising=False)  # the user's default: the allow-list
    folder = tmp_path / "listed"
    folder.mkdir()
    (folder / "rockenv.toml").write_text('name = "listed"\nversion = "1.0.0"\nnetwork = ["@pip"]\nsetup = ["true"]\n')
    with pytest.raises(BuildNetworkError) as err:
        build(folder)
    text = str(err.value)
    assert text.startswith("building listed@1.0.0: sandbox network: refusing"), text
    assert text.splitlines()[-1].startswith('The package lists network = ["@pip"], so its setup sandbox needs a '
                                            "network of its own"), text
    assert "set $ROCKROLL_BUILD_NETWORK=host" in text and "no allow-list" in text


# ---- the sentence itself, for each kind of network a build sandbox has -------------------------------
def test_each_network_gets_its_own_fix():
    resolver = "ERROR: ... Failed to establish a new connection: [Errno -3] Temporary failure in name resolution"
    allow = step_hint("pip install x", "ERROR: ... [Errno -2] Name or service not known", listed=("@pip", "a.test"),
                      network=True, allowed=("index.test", "files.test", "a.test"))
    assert allow.startswith('The step\'s network allows only what the package lists (network = ["@pip", "a.test"]: '
                            "index.test, files.test, a.test)") and "Add that host (or role)" in allow
    host = step_hint("pip install x", resolver, listed=("@pip",), network="host")
    assert "$ROCKROLL_BUILD_NETWORK=host, no allow-list" in host and "this machine's own network" in host
    apt = step_hint("apt-get update -qq", "W: Temporary failure resolving 'mirror.test'", listed=(), network=False)
    assert 'network = ["@apt"]' in apt and 'network=("@apt",)' in apt
    both = step_hint("apt-get install -y python3-venv && pip3 install x", resolver, listed=(), network=False)
    assert 'network = ["@pip", "@apt"]' in both
    other = step_hint("curl -fsS https://a.test/x", "curl: (6) Could not resolve host: a.test", listed=(), network=False)
    assert "List the hosts it reaches in network = [...]" in other and '"@pip" or "@apt"' in other


def test_only_network_failures_are_read_as_such():
    assert step_hint("make", "make: *** No rule to make target 'all'.  Stop.", listed=(), network=False) is None
    # pip's "nothing found" is the network only where there was none: with one, it is a misspelt name
    nothing = "ERROR: Could not find a version that satisfies the requirement opnai (from versions: none)"
    assert looks_like_network(nothing, had_network=False) and not looks_like_network(nothing, had_network=True)
    for said in ("OSError: [Errno 101] Network is unreachable", "wget: unable to resolve host address 'a.test'",
                 "fatal: unable to access 'https://a.test/r.git/': Could not resolve host: a.test",
                 "connect to 10.0.0.1 port 80 failed: No route to host", "[Errno 111] Connection refused"):
        assert looks_like_network(said, had_network=True), said
    assert roles_for("python3 -m pip install x") == ["@pip"] and roles_for("/opt/v/bin/pip install x") == ["@pip"]
    assert roles_for("DEBIAN_FRONTEND=noninteractive apt install -y x") == ["@apt"]
    assert roles_for("pipx run x; apt-cache policy; mkdir -p /opt/pip-cache") == []
