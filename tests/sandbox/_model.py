"""A sandbox's model endpoint, checked the same way on every backend that has one.

``WhoAmI`` answers each call with the caller the service resolved from the key (so the
answer proves attribution); ``probe(sb, svc)`` makes a call from inside the sandbox and
gathers what a test asserts: the answer, the key, whether anything else on the network
answers, and whether the host's secrets reached the sandbox's processes.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from rockroll.sandbox.modelservice.modes import Answer, Choice

# stdlib only: the host image has python3 but no openai client
CALL = r"""python3 - <<'PY'
import json, os, urllib.request
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", method="POST",
                             data=json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode(),
                             headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                                      "Content-Type": "application/json"})
print(json.loads(urllib.request.urlopen(req, timeout=30).read())["choices"][0]["message"]["content"])
PY
"""

# the service's real address, from inside: must be unreachable (only the agent's 8080 is there)
DIRECT = r"""python3 - <<'PY'
import socket
try:
    socket.create_connection(("127.0.0.1", {port}), 3)
    print("CONNECTED")
except OSError as e:
    print("refused", type(e).__name__)
PY
"""

INTERFACES = "python3 -c \"print(*[l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]])\""

# every environment of every process the sandbox can see, one variable a line
ENVIRONS = "for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; echo; done 2>/dev/null; env"


class WhoAmI:
    """A generator answering ``<sandbox id>#<call index>``: who the key says called."""

    async def generate(self, call) -> Answer:
        return Answer([Choice(text=f"{call.caller.sandbox_id}#{call.index}")])


def assert_served(sb, svc) -> str:
    """A call from inside ``sb`` is answered by ``svc`` and attributed to ``sb``; nothing
    else is reachable; no process of the sandbox holds the admin token or anything of the
    host's environment (``PYTEST_CURRENT_TEST`` is in every process this test starts).
    Returns the sandbox's key."""
    first = sb.run(CALL)
    assert first.exit_code == 0 and first.stdout == f"{sb.id}#0\n", first
    key = sb.run("printf %s $OPENAI_API_KEY").stdout
    assert key.startswith("rr-") and svc.caller(key).sandbox_id == sb.id
    port = int(svc.url.rsplit(":", 1)[1])
    assert sb.run(DIRECT.format(port=port)).stdout.startswith("refused"), "the service's own port is reachable"
    assert sb.run(INTERFACES).stdout.split() == ["lo"]
    environ = sb.run(ENVIRONS).stdout
    assert "OPENAI_API_KEY=" + key in environ  # the probe reads what it should
    assert svc.token not in environ and "PYTEST_CURRENT_TEST" not in environ
    return key


def host_call(svc, key: str) -> int:
    """The status of a chat call with ``key`` made from the host, straight to the service."""
    req = urllib.request.Request(svc.url + "/v1/chat/completions", method="POST",
                                 data=json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}
                                                 ).encode(),
                                 headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code
