"""Terminals through ``rockroll serve`` (issue #35): the WebSocket route and its token
rules, the remote SDK's terminals, a client killed -9, and SWE-ReX's interactive commands
with the unmodified ``swe-rex`` client (a ``read -p`` prompt, a Python REPL, pdb)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest
from swerex import exceptions as rex
from swerex.runtime.abstract import BashAction, BashInterruptAction, CreateBashSessionRequest, WriteFileRequest
from swerex.runtime.remote import RemoteRuntime
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from _server import server_fixtures
from rockroll.sandbox import AsyncSandbox, SandboxSpec
from rockroll.sandbox.errors import ExpectTimeout, SandboxNotFound, TerminalError
from rockroll.sandbox.protocol.wire import AuthError
from rockroll.sandbox.runtime.remote import RemoteSandbox

logging.getLogger("rex-runtime").setLevel(logging.CRITICAL)
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"


server, sid = server_fixtures(16)


def _ws_url(server, sid, query="") -> str:
    return f"ws://127.0.0.1:{server.port}/v1/sandboxes/{sid}/terminal{query}"


async def test_a_wrong_token_is_refused_before_the_upgrade(server, sid):
    for headers, protocols in (({"Authorization": "Bearer wrong"}, None), ({}, None),
                               ({}, ["rockroll.terminal", "bearer.wrong"])):
        with pytest.raises(InvalidStatus) as e:
            await connect(_ws_url(server, sid), additional_headers=headers, subprotocols=protocols)
        assert e.value.response.status_code == 403
    with pytest.raises(AuthError):
        await RemoteSandbox(SandboxSpec(), sid, _endpoint(server, "wrong")).open_terminal()
    # a browser's way: the token as a subprotocol
    async with connect(_ws_url(server, sid, "?cmd=sh&cmd=-c&cmd=echo%20hi"),
                       subprotocols=["rockroll.terminal", f"bearer.{server.token}"]) as ws:
        assert ws.subprotocol == "rockroll.terminal"
        assert json.loads(await ws.recv()) == {"opened": True}
        out = b""
        while not isinstance(msg := await ws.recv(), str):
            out += msg
        assert b"hi" in out and json.loads(msg) == {"exit": 0}


def _endpoint(server, token=None):
    from rockroll.sandbox.runtime.remote import Endpoint
    return Endpoint(server.url, token or server.token)


async def test_remote_sdk_terminal(server, sid):
    box = RemoteSandbox(SandboxSpec(), sid, _endpoint(server))
    async with await box.open_terminal(rows=20, cols=70, env={"RR_T": "remote"}) as t:
        await t.write("PS1='P$ '; stty size; echo $RR_T-$((1+1))\n")
        await t.expect(r"remote-2\r\n")
        await t.resize(33, 99)
        await t.write("stty size\n")
        await t.expect("33 99")
        await t.write("sleep 1000\n")
        while "sleep" not in (await box.run("ps -eo comm=")).stdout:
            await asyncio.sleep(0.05)
        await t.signal(2)
        await t.write("echo rc=$?\n")
        await t.expect("rc=130")
        await t.write("exit 5\n")
        assert await t.wait(timeout=30) == 5
        with pytest.raises(TerminalError):
            await t.write("x")
    with pytest.raises(SandboxNotFound):
        await RemoteSandbox(SandboxSpec(), "sb-nope", _endpoint(server)).open_terminal()
    async with await box.open_terminal(["sleep", "1000"], idle_timeout=0.5) as t:  # idleness ends it
        assert await t.wait(timeout=30) is None
    async with await box.open_terminal(["sleep", "1000"], idle_timeout=None) as t:  # None: never
        with pytest.raises(ExpectTimeout):
            await t.wait(timeout=2)


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


async def test_a_yes_flood_to_a_client_that_does_not_read_leaves_the_services_memory_flat(server, sid):
    """The service relays output only as fast as the socket takes it: a client that
    stops reading stops `yes` (the guest's window), not the service's memory growth."""
    box = RemoteSandbox(SandboxSpec(), sid, _endpoint(server))
    async with await box.open_terminal(["yes"]) as t:
        await t.expect("y\r\n")  # flowing
        await asyncio.sleep(2.0)  # buffers fill: ours, the sockets', the service's, the window
        before = _rss_kb(server.proc.pid)
        await asyncio.sleep(4.0)
        after = _rss_kb(server.proc.pid)
        assert after - before < 4 << 10, (before, after)  # KiB: 4 s of yes unthrottled grew it 9 MiB here
        await t.expect("y\r\ny\r\n")  # and it still flows once read


def _pids_in_sandbox(server, sid, word) -> list[str]:
    r = server.http.post(f"/v1/sandboxes/{sid}/run", json={"cmd": f"pgrep -f '{word}' || true"})
    return r.json()["stdout"].split()


def test_a_websocket_client_killed_9_leaves_no_process(server, sid, tmp_path):
    marker = "sleep 76543"
    script = tmp_path / "client.py"
    script.write_text(textwrap.dedent(f"""
        import asyncio
        from rockroll.sandbox import SandboxSpec
        from rockroll.sandbox.runtime.remote import Endpoint, RemoteSandbox
        async def main():
            box = RemoteSandbox(SandboxSpec(), {sid!r}, Endpoint({server.url!r}, {server.token!r}))
            t = await box.open_terminal({marker!r})
            print("open", flush=True)
            await asyncio.sleep(1000)
        asyncio.run(main())
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "open"
        deadline = time.monotonic() + 30
        while not _pids_in_sandbox(server, sid, marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _pids_in_sandbox(server, sid, marker)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 30
    while _pids_in_sandbox(server, sid, marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _pids_in_sandbox(server, sid, marker)


# --- SWE-ReX's interactive commands, with its unmodified client ---------------------------
def runtime(server, sid) -> RemoteRuntime:
    return RemoteRuntime(host=f"{server.url}/swerex/{sid}", auth_token=server.token, timeout=60)


async def test_swerex_read_prompt(server, sid):
    rt = runtime(server, sid)
    await rt.create_session(CreateBashSessionRequest())
    await rt.run_in_session(BashAction(command="cd /tmp; export RR_GREETING=hello"))
    obs = await rt.run_in_session(BashAction(command="read -p 'your name? ' n; echo $RR_GREETING-$n-$(pwd)",
                                             is_interactive_command=True, expect=[r"name\? "], timeout=30))
    assert obs.expect_string == r"name\? "
    obs = await rt.run_in_session(BashAction(command="rock", is_interactive_quit=True, timeout=30))
    assert "hello-rock-/tmp" in obs.output and obs.expect_string == "SHELLPS1PREFIX", obs  # the session's cwd, exports
    assert not (await rt.run_in_session(BashAction(command="ls -a /tmp"))).output.count(".rr-interactive")
    obs = await rt.run_in_session(BashAction(command="echo plain"))  # the session is still there
    assert obs.output.strip() == "plain"


async def test_swerex_python_repl_and_timeout_and_interrupt(server, sid):
    rt = runtime(server, sid)
    await rt.create_session(CreateBashSessionRequest())
    obs = await rt.run_in_session(BashAction(command="python3", is_interactive_command=True, expect=[">>> "],
                                             timeout=30))
    assert obs.expect_string == ">>> "
    obs = await rt.run_in_session(BashAction(command="x = 6 * 7; print('answer', x)", is_interactive_command=True,
                                             expect=[">>> "], timeout=30))
    assert obs.output == "answer 42", obs
    with pytest.raises(rex.CommandTimeoutError):
        await rt.run_in_session(BashAction(command="import time; time.sleep(1000)", is_interactive_command=True,
                                           expect=[">>> "], timeout=1))
    obs = await rt.run_in_session(BashInterruptAction(expect=[">>> "], timeout=10))
    assert "KeyboardInterrupt" in obs.output and obs.expect_string == ">>> ", obs
    obs = await rt.run_in_session(BashAction(command="exit()", is_interactive_quit=True, timeout=30))
    assert obs.expect_string == "SHELLPS1PREFIX"


async def test_swerex_pdb_steps_through_a_failing_test(server, sid):
    rt = runtime(server, sid)
    await rt.write_file(WriteFileRequest(path="/workspace/test_calc.py", content=textwrap.dedent("""
        def add(a, b):
            total = a - b
            return total

        def test_add():
            assert add(2, 3) == 5

        if __name__ == "__main__":
            test_add()
    """)))
    await rt.create_session(CreateBashSessionRequest())
    await rt.run_in_session(BashAction(command="cd /workspace"))
    obs = await rt.run_in_session(BashAction(command="python3 -m pdb test_calc.py", is_interactive_command=True,
                                             expect=[r"\(Pdb\) "], timeout=30))
    assert "test_calc.py" in obs.output
    for cmd in ("break add", "continue", "next", "p total"):
        obs = await rt.run_in_session(BashAction(command=cmd, is_interactive_command=True, expect=[r"\(Pdb\) "],
                                                 timeout=30))
    assert obs.output.strip().splitlines()[-1] == "-1", obs  # the bug, seen by stepping: 2 - 3
    obs = await rt.run_in_session(BashAction(command="q", is_interactive_quit=True, timeout=30))
    assert obs.expect_string == "SHELLPS1PREFIX"


# --- the dashboard's terminal in a real headless Chromium, driven over DevTools -------------
class _Browser:
    """Chromium headless on a page, driven through the DevTools protocol (a WebSocket on
    127.0.0.1): typing, evaluating, resizing the window."""

    def __init__(self, url: str, profile: str):
        from websockets.sync.client import connect as sync_connect

        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        if chromium is None:
            if os.environ.get("CI") == "true":
                pytest.fail("CI must run the browser test: chromium is not installed")
            pytest.skip("chromium is not installed (apt-get install chromium)")
        self.proc = subprocess.Popen(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-quic",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
             "--window-size=1000,700", url], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.stack = contextlib.ExitStack()
        port_file = Path(profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.is_file() and port_file.read_text().strip()):
            assert time.monotonic() < deadline and self.proc.poll() is None, "chromium did not start"
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        while True:
            pages = [t for t in httpx.get(f"http://127.0.0.1:{port}/json/list").json()
                     if t["type"] == "page" and "/terminal" in t["url"]]
            if pages:
                break
            assert time.monotonic() < deadline, "no page"
            time.sleep(0.1)
        self.ws = self.stack.enter_context(sync_connect(pages[0]["webSocketDebuggerUrl"], max_size=None))
        self.next_id = 0

    def cdp(self, method: str, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == self.next_id:
                assert "error" not in msg, msg
                return msg["result"]

    def eval(self, expr: str):
        return self.cdp("Runtime.evaluate", expression=expr, returnByValue=True)["result"].get("value")

    def wait_for(self, expr: str, what: str, timeout: float = 60):
        deadline = time.monotonic() + timeout
        while not (value := self.eval(expr)):
            assert time.monotonic() < deadline, f"{what}: {self.eval(SCREEN)!r} status={self.eval(STATUS)!r}"
            time.sleep(0.1)
        return value

    def type_line(self, text: str):
        self.cdp("Input.insertText", text=text)
        for kind in ("keyDown", "keyUp"):
            self.cdp("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter", windowsVirtualKeyCode=13,
                     **({"text": "\r"} if kind == "keyDown" else {}))

    def close(self):
        self.stack.close()
        self.proc.kill()
        self.proc.wait()


SCREEN = ("(() => { const b = window.rrTerminal.buffer.active, out = [];"
          " for (let i = 0; i < b.length; i++) out.push(b.getLine(i).translateToString(true));"
          " return out.join('\\n'); })()")
STATUS = "document.getElementById('status').textContent"


def _ttys_in(server, sid) -> int:
    """Processes of the sandbox whose stdin is a terminal (the browser's shell)."""
    cmd = "for f in /proc/[0-9]*/fd/0; do readlink $f; done 2>/dev/null | grep -c /dev/pts/ || true"
    return int(server.http.post(f"/v1/sandboxes/{sid}/run", json={"cmd": cmd}).json()["stdout"])


def test_dashboard_terminal_in_headless_chromium(server, sid, tmp_path):
    """Open a sandbox's terminal from the dashboard's link, type a command and see its
    output, resize the window (the shell sees the new size), close (its shell ends)."""
    dashboard = httpx.get(server.url + "/").text
    assert "/terminal#token=" in dashboard  # the dashboard links each live sandbox here
    for asset in ("xterm.js", "addon-fit.js", "xterm.css", "LICENSE"):
        assert httpx.get(f"{server.url}/static/xterm/{asset}").status_code == 200  # vendored: no CDN
    browser = _Browser(f"{server.url}/terminal#token={server.token}&sandbox={sid}", str(tmp_path / "profile"))
    try:
        browser.wait_for(f"{STATUS} === 'open'", "the terminal never opened")
        browser.wait_for(f"{SCREEN}.includes('#')", "no prompt")
        browser.type_line("echo typed-$((6*7))")
        browser.wait_for(f"{SCREEN}.includes('typed-42')", "the command's output")
        assert _ttys_in(server, sid) >= 1
        before = browser.eval("[window.rrTerminal.rows, window.rrTerminal.cols]")
        browser.cdp("Emulation.setDeviceMetricsOverride", width=620, height=380, deviceScaleFactor=1, mobile=False)
        browser.wait_for(f"window.rrTerminal.cols !== {before[1]}", "xterm did not fit the new size")
        rows, cols = browser.eval("[window.rrTerminal.rows, window.rrTerminal.cols]")
        browser.type_line("stty size")
        browser.wait_for(f"{SCREEN}.includes('{rows} {cols}')", "the shell did not see the new size")
        shot = browser.cdp("Page.captureScreenshot", format="png")["data"]
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "terminal.png").write_bytes(base64.b64decode(shot))
        browser.eval("document.getElementById('close').click()")
        browser.wait_for(f"{STATUS} === 'closed'", "the page did not close")
    finally:
        browser.close()
    deadline = time.monotonic() + 30
    while _ttys_in(server, sid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _ttys_in(server, sid) == 0  # closing the page's socket ended its shell
