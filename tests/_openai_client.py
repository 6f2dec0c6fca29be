"""What the model-service tests run in sandboxes: the real ``openai`` client without
network (its pure-Python distributions, and the two compiled ones, pydantic_core and jiter,
built for this same CPython 3.11 ABI as the host image's ``/usr/bin/python3``, copied out of
this venv, to be uploaded into a sandbox and put on its ``PYTHONPATH``), and the attack
that checks the network stayed closed."""

import importlib.metadata
import shutil
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def client_distributions():
    """The openai distribution and what it requires (markers evaluated for this Python)."""
    seen = {}

    def visit(name):
        key = canonicalize_name(name)
        if key in seen:
            return
        seen[key] = dist = importlib.metadata.distribution(name)
        for r in dist.requires or []:
            req = Requirement(r)
            if not req.marker or req.marker.evaluate({"extra": ""}):
                visit(req.name)

    visit("openai")
    return seen.values()


def copy_client(dest: Path) -> Path:
    """The client's files under ``dest`` (a folder to upload as a ``PYTHONPATH`` entry)."""
    for dist in client_distributions():
        for f in dist.files or []:
            if f.parts[0] == "..":  # scripts in bin/: not needed
                continue
            target = dest.joinpath(*f.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f.locate(), target)
    return dest


def snapshot_with_agent(spec, agent, pylib: Path) -> str:
    """The digest of a snapshot of a ``spec`` sandbox with ``agent`` installed without
    network: the client copied to its ``AGENT_PYLIB`` and byte-compiled there by the
    sandbox's python (as ``pip install`` does: else every agent process would compile the
    client's modules again, seconds of CPU each), its script step (first install step) run."""
    from rockroll.gem.agents import AGENT_PYLIB
    from rockroll.sandbox import open_sandbox

    with open_sandbox(spec) as sb:
        sb.upload(str(copy_client(pylib)), AGENT_PYLIB)
        step = sb.run(f"python3 -m compileall -q {AGENT_PYLIB} >/dev/null && {agent.install[0]}")
        assert step.exit_code == 0, step.stderr
        return sb.snapshot().digest


# ``python3 -c ATTACK host:port ...``: one word per target, CONNECTED or the errno's name.
ATTACK = """
import errno, socket, sys
def attempt(host, port):
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((host, port))
        return "CONNECTED"
    except OSError as e:
        return errno.errorcode.get(e.errno, type(e).__name__)
    finally:
        s.close()
print(*[attempt(h, int(p)) for h, p in (a.rsplit(":", 1) for a in sys.argv[1:])])
"""
