"""A real ``rockroll serve`` on 127.0.0.1 in a subprocess, for the service and SDK tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from rockroll.sandbox.home import state_home


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``rockroll serve --port <free>`` with a known token; ``stop()`` sends SIGTERM."""

    def __init__(self, *args: str, token: str = "test-token-123"):
        self.port, self.token = free_port(), token
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="rockroll-serve-", suffix=".log", delete=False)
        env = {**os.environ, "ROCKROLL_TOKEN": token}
        self.proc = subprocess.Popen([sys.executable, "-m", "rockroll.cli", "serve", "--port", str(self.port), *args],
                                     env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                health = httpx.get(self.url + "/healthz", timeout=2).json()
                break
            except httpx.HTTPError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"server did not start:\n{self.logs()}")
                time.sleep(0.1)
        self.run_id = health["run_id"]
        self.run_dir = state_home() / "runs" / self.run_id
        self.http = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=60)

    def logs(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def create(self, **spec) -> str:
        r = self.http.post("/v1/sandboxes", json={"memory_mb": 128, **spec})
        assert r.status_code == 201, r.text
        return r.json()["id"]

    def guests(self, sandbox_id: str) -> dict:
        return json.loads((self.run_dir / sandbox_id / "guest.json").read_text())

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        self.http.close()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        finally:
            self.log.close()


def server_fixtures(max_sandboxes: int):
    """The ``server`` (one a module, ``max_sandboxes`` at once) and ``sid`` (a sandbox of it,
    pids 128, deleted after the test) fixtures a test module takes by assigning them."""
    import pytest

    @pytest.fixture(scope="module")
    def server():
        srv = Server("--max-sandboxes", str(max_sandboxes))
        yield srv
        srv.stop()

    @pytest.fixture
    def sid(server):
        sandbox_id = server.create(pids=128)
        yield sandbox_id
        server.http.delete(f"/v1/sandboxes/{sandbox_id}")

    return server, sid


@contextlib.contextmanager
def sdk_service(*args: str):
    """A ``Server`` the remote SDK points at (``remote.configure``) while the block runs. Its
    environment holds no model-service admin token, whatever earlier tests of this process
    left in ours (an agent env's shared model service sets it), so a test can check that the
    driver's token is the one the service used."""
    from rockroll.sandbox.runtime import remote
    from rockroll.sandbox.protocol.tokens import TOKEN_ENV

    saved = os.environ.pop(TOKEN_ENV, None)
    try:
        srv = Server(*args)
    finally:
        if saved is not None:
            os.environ[TOKEN_ENV] = saved
    remote.configure(srv.url, srv.token)
    try:
        yield srv
    finally:
        remote.configure(None)
        srv.stop()


async def rock_and_swerex_share_a_sandbox(srv: Server, sb, tmp_path: Path) -> None:
    """ROCK's SDK (``sb``, a started ``rock`` Sandbox of ``srv``) uploads a file; SWE-ReX's
    runtime, at the same service, reads it in a session and writes another it reads back:
    both unmodified clients on one sandbox."""
    from rock.actions import UploadRequest
    from swerex.runtime.abstract import BashAction, CreateBashSessionRequest, ReadFileRequest
    from swerex.runtime.remote import RemoteRuntime

    (tmp_path / "f.txt").write_text("from the host")
    assert (await sb.upload(UploadRequest(source_path=str(tmp_path / "f.txt"),
                                          target_path="/workspace/f.txt"))).success
    rt = RemoteRuntime(host=f"{srv.url}/swerex/{sb.sandbox_id}", auth_token=srv.token, timeout=30)
    await rt.create_session(CreateBashSessionRequest())
    obs = await rt.run_in_session(BashAction(command="cd /workspace && cat f.txt && echo x > g.txt"))
    assert obs.output == "from the host"
    assert (await rt.read_file(ReadFileRequest(path="/workspace/g.txt"))).content == "x\n"
