"""When a build failed for the network: the sentence that says so and names the fix.

A build sandbox has no network unless the package lists what its setup reaches
(``network = [...]`` in ``rockenv.toml``; ``AgentSpec(network=...)`` writes it). A
``pip install`` step of a package that lists nothing fails with pip's own words ("Temporary
failure in name resolution", or with ``--retries 0`` only "(from versions: none)") and an
exit code, and the reader is left to guess that the build, not the index, is the cause.
These pure functions read a failed step's output, and what its network was, and say which
way out applies: list the index, add a host to the list, look at the machine's own network
(a build that shared it), or, where the machine cannot wire a build a network of its own,
``$ROCKROLL_BUILD_NETWORK=host``.
"""

from __future__ import annotations

import json
import re

BUILD_NETWORK_VAR = "ROCKROLL_BUILD_NETWORK"

# A name lookup or a connection that failed, in the words of the tools setup steps use.
_RESOLVE_OR_CONNECT = re.compile("|".join(re.escape(s) for s in (
    "Temporary failure in name resolution",  # glibc's EAI_AGAIN: no resolver reachable (pip, python, git)
    "Name or service not known",  # EAI_NONAME: the allow-list's resolver has no answer for the name
    "No address associated with hostname",
    "Could not resolve host",  # curl, git
    "Temporary failure resolving",  # apt
    "unable to resolve host address",  # wget
    "Network is unreachable",  # connect() with no route out: no network at all
    "No route to host",
    "Connection refused",  # the allow-list's gateway refusing an address no allowed name gave
    "Failed to establish a new connection",  # urllib3: pip, requests
)), re.I)
# pip when no index answered; with --retries 0 it says nothing else. Read as the network only
# where the step had none: with one, a misspelt requirement says the same.
_PIP_NOTHING_FOUND = re.compile(r"\(from versions: none\)")
# the installer as a command word (``pip``, ``-m pip``, ``/venv/bin/pip3``, ``apt-get``), not a
# name that holds it (``pipx``, ``apt-cache``, ``/opt/pip-cache``)
_ROLE_TOOLS = tuple((role, re.compile(rf"(?:^|[\s/;&|(]){tool}(?=\s)")) for role, tool in
                    (("@pip", "pip3?"), ("@apt", "apt(?:-get)?")))


def looks_like_network(output: str, *, had_network: bool) -> bool:
    """Whether a failed step's ``output`` shows a failed name lookup or connection."""
    return bool(_RESOLVE_OR_CONNECT.search(output) or (not had_network and _PIP_NOTHING_FOUND.search(output)))


def roles_for(step: str) -> list[str]:
    """The ``network`` roles (``envhub/indexes.py``) a step's installer needs: ``@pip`` for
    pip, ``@apt`` for apt; none for anything else."""
    return [role for role, tool in _ROLE_TOOLS if tool.search(step)]


def step_hint(step: str, output: str, *, listed: tuple[str, ...], network: bool | str,
              allowed: tuple[str, ...] = ()) -> str | None:
    """The sentence a failed setup step's error ends with when its output shows the network
    failed, else None. ``listed``: the package's ``network``; ``network``: the build
    sandbox's (``False``, ``True`` with the allow-list ``allowed``, or ``"host"``)."""
    if not looks_like_network(output, had_network=network is not False):
        return None
    if network is False:
        roles = roles_for(step)
        spec = ", ".join(map(json.dumps, roles))
        fix = (f"Add network = {_toml(roles)} to rockenv.toml (an AgentSpec: network=({spec},)): a role "
               "stands for the hosts this machine's installer uses" if roles else
               'List the hosts it reaches in network = [...] in rockenv.toml (an AgentSpec\'s network=), or a role: '
               '"@pip" or "@apt" for the hosts this machine\'s pip or apt uses')
        return ("The step ran without network: a build sandbox has none unless the package lists what its setup "
                f"reaches, and this one lists nothing. {fix}. ${BUILD_NETWORK_VAR}=host does not help here: it "
                "changes how a listed network is made, not whether there is one.")
    if network == "host":
        return (f"The step shared this machine's network (${BUILD_NETWORK_VAR}=host, no allow-list) and still "
                "could not reach a host: the cause is this machine's own network, proxy or index settings.")
    return (f"The step's network allows only what the package lists (network = {_toml(listed)}: "
            f"{', '.join(allowed) or 'no host'}); a name it looked up or an address it connected to is not "
            "among them. Add that host (or role) to network in rockenv.toml (an AgentSpec's network=).")


def start_hint(listed: tuple[str, ...]) -> str:
    """The sentence a build's error ends with when its sandbox could not get the network of
    its own that the package's ``network`` list asks for."""
    return (f"The package lists network = {_toml(listed)}, so its setup sandbox needs a network of its own, "
            "and this machine would not make one. Where nothing may be wired into this machine's network "
            f"namespace (a CI runner, a container without CAP_NET_ADMIN), set ${BUILD_NETWORK_VAR}=host: setup "
            "steps then share this process's network, with no allow-list (only for packages you trust).")


def _toml(names) -> str:
    """``names`` as the TOML array a reader copies into ``rockenv.toml``."""
    return f"[{', '.join(map(json.dumps, names))}]"
