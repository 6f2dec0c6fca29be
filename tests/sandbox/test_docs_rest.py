"""The REST quickstart of docs/sandbox.md runs as written against a real ``rockroll serve``
(issue #18): its one bash block is read from the doc and run with ``bash -euo pipefail``,
so every curl it shows must answer 2xx (``-f``) unless it prints the status itself, and
every ``# -> ...`` comment must match what the commands printed, in order."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from rockroll.sandbox.storage.layers import digest_file

from _server import Server

DOC = Path(__file__).resolve().parents[2] / "docs" / "sandbox.md"


def quickstart() -> str:
    section = DOC.read_text().split("### REST quickstart (curl)\n", 1)[1].split("\n### ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the quickstart is one bash block"
    return blocks[0]


def expectations(script: str) -> list[list[str]]:
    """Each ``# -> ...`` comment as the pieces between its ``...`` (`` / `` is a line break)."""
    found = re.findall(r"#\s*->\s*(.+)$", script, re.M)
    return [[p.strip().replace(" / ", "\n") for p in e.split("...") if p.strip()] for e in found]


def assert_printed_in_order(output: str, expected: list[list[str]]) -> None:
    at = 0
    for pieces in expected:
        for piece in pieces:
            found = output.find(piece, at)
            assert found >= 0, f"{piece!r} not printed (after offset {at}):\n{output}"
            at = found + len(piece)


def test_the_rest_quickstart_runs_as_written(tmp_path, monkeypatch):
    script = quickstart()
    assert script.count("curl ") >= 14 and len(expectations(script)) >= 6
    monkeypatch.setenv("ROCKROLL_HOME", str(tmp_path / "home"))
    server = Server()
    try:
        env = {**os.environ, "ROCKROLL_URL": server.url, "ROCKROLL_TOKEN": server.token}
        out = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, f"stdout:\n{out.stdout}\nstderr:\n{out.stderr}"
        assert_printed_in_order(out.stdout, expectations(script))
        # what the commands did, read back from the service and the disk
        assert (tmp_path / "back.py").read_bytes() == (tmp_path / "hello.py").read_bytes() == b'print("hello")\n'
        snapshots = server.http.get("/v1/snapshots").json()
        assert [s["digest"] for s in snapshots] == [digest_file(tmp_path / "snapshot.tar.zst")]
        assert server.http.get("/v1/sandboxes").json() == []  # deleted
    finally:
        server.stop()
