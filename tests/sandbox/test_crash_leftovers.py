"""kill -9 in the middle of snapshot, fork and restore: nothing torn, and nothing left once
``rockroll sandbox gc`` or the next run's first sandbox has run (issue #21). Each case runs in a process of its own with
a state home of its own; the store's packing and unpacking are slowed (a slow disk) so the
kill lands while temp files exist, and the test checks that it did."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rockroll.sandbox import SandboxSpec, open_sandbox
from rockroll.sandbox.storage import temps

FILES = 120  # of 20 KB each: a layer of 120 members, packed or unpacked at 30 ms a member
SLOW = """
import time
import rockroll.sandbox.storage.layers as layers
_pack, _add = layers._pack_entry, layers._Extractor.add
layers._pack_entry = lambda *a, **k: (time.sleep(0.03), _pack(*a, **k))[1]
layers._Extractor.add = lambda *a, **k: (time.sleep(0.03), _add(*a, **k))[1]
"""
FILL = f"for i in $(seq {FILES}); do head -c 20000 /dev/urandom > /workspace/f$i; done"
CASES = {
    "snapshot": f"sb = open_sandbox(SandboxSpec())\nsb.run({FILL!r})\nprint('go', flush=True)\nsb.snapshot()",
    "fork": f"sb = open_sandbox(SandboxSpec())\nsb.run({FILL!r})\nprint('go', flush=True)\nsb.fork(2)",
    "restore": "sb = open_sandbox(SandboxSpec())\nprint('go', flush=True)\nsb.restore(Path(sys.argv[1]))",
}


def store_dirs(home: Path) -> list[Path]:
    return [home / "snapshots" / "sha256", home / "layers" / "sha256", home / "layers"]


def temp_entries(home: Path) -> list[str]:
    return sorted(p.name for d in store_dirs(home) if d.is_dir() for p in d.iterdir() if p.name.startswith("."))


@pytest.fixture(scope="module")
def tarball(tmp_path_factory):
    """A snapshot of FILES files, as a tarball outside any store (restore unpacks it)."""
    with open_sandbox(SandboxSpec()) as sb:
        sb.run(FILL)
        snap = sb.snapshot()
    dest = tmp_path_factory.mktemp("snap") / "snap.tar.zst"
    dest.write_bytes(Path(snap.path).read_bytes())
    return dest


@pytest.mark.parametrize("op, collector", [(op, "gc") for op in CASES] + [("snapshot", "next start")])
def test_kill_9_mid_operation_leaves_nothing_after_gc(op, collector, tmp_path, tarball):
    home = tmp_path / "home"
    env = {**os.environ, "ROCKROLL_HOME": str(home)}
    script = ("import sys\nfrom pathlib import Path\nfrom rockroll.sandbox import SandboxSpec, open_sandbox\n"
              + SLOW + CASES[op])
    proc = subprocess.Popen([sys.executable, "-c", script, str(tarball)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline() == "go\n", proc.stderr.read()
        wanted = {"snapshot": ".pack-", "fork": ".pack-", "restore": ".unpack-"}[op]
        deadline = time.time() + 60
        while time.time() < deadline and not any(n.startswith(wanted) for n in temp_entries(home)):
            time.sleep(0.01)
    finally:
        proc.kill()
        proc.wait()
    left = temp_entries(home)
    assert any(n.startswith(wanted) for n in left), left  # the kill landed mid-way
    # nothing torn: every final tarball is whole (its bytes hash to its name)
    for final in (home / "snapshots" / "sha256").glob("[0-9a-f]*.tar.zst"):
        assert hashlib.sha256(final.read_bytes()).hexdigest() == final.name[:64]
    if collector == "next start":  # the first sandbox of the next run sweeps too
        subprocess.run([sys.executable, "-c", "from rockroll.sandbox import open_sandbox\nopen_sandbox().close()"],
                       env=env, check=True, timeout=120)
        assert temp_entries(home) == []
        return
    gc = subprocess.run([sys.executable, "-m", "rockroll.cli", "sandbox", "gc"], capture_output=True, text=True,
                        env=env, timeout=120)
    assert gc.returncode == 0, gc.stderr
    removed = int(re.search(r"removed (\d+) temp file", gc.stdout).group(1))
    assert removed == len(left) and temp_entries(home) == [], (gc.stdout, temp_entries(home))
    assert "reaped 1 run(s)" in gc.stdout  # the killed process's run too
    assert not (home / "runs").exists() or list((home / "runs").iterdir()) == []


def test_sweep_removes_only_what_dead_writers_left(tmp_path):
    """A temp of a live writer stays (this process's, whatever its age); a dead writer's goes
    at once; a recycled pid (same pid, another start time) is a dead writer; an old-style
    temp goes once it is an hour old; final names are never touched."""
    dead = subprocess.run([sys.executable, "-c", "from rockroll.sandbox import lifecycle; print(lifecycle.tag())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    names = {
        "live": temps.temp_name("pack", ".tar.zst"),
        "dead": f".pack-{dead}-abc.tar.zst",
        "recycled": f".unpack-{os.getpid()}-1-abc",  # our pid, but not our start time
        "legacy-old": ".tmp-0123abcd.tar.zst",
        "legacy-new": ".stage-xyz",
        "final": "ab" * 32 + ".tar.zst",
        "record": "ab" * 32 + ".bytes",
    }
    for key, name in names.items():
        (tmp_path / name).mkdir() if key == "recycled" else (tmp_path / name).write_bytes(b"x" * 10)
    (tmp_path / names["recycled"] / "inner").write_bytes(b"y" * 5)
    hour_ago = time.time() - temps.LEGACY_GRACE_S - 1
    os.utime(tmp_path / names["legacy-old"], (hour_ago, hour_ago))
    os.utime(tmp_path / names["live"], (hour_ago, hour_ago))  # old, but its writer runs
    dry = temps.sweep([tmp_path, tmp_path / "missing"], dry_run=True)
    assert sorted(p.name for p in dry.removed) == sorted([names["dead"], names["recycled"], names["legacy-old"]])
    assert len(list(tmp_path.iterdir())) == len(names)  # a dry run deletes nothing
    swept = temps.sweep([tmp_path])
    assert swept.freed_bytes == 10 + 5 + 10
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [names["live"], names["legacy-new"], names["final"], names["record"]])
