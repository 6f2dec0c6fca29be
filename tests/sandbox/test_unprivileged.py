"""The local backend as an unprivileged user: user namespaces instead of root.

Runs a copy of the package as uid 65534 (nobody) with the system Python, because the
project's interpreter and checkout may sit in folders nobody cannot read.
"""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import zstandard

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PY = "/usr/bin/python3"


def _system_python_matches() -> bool:
    if not os.path.exists(SYSTEM_PY):
        return False
    out = subprocess.run([SYSTEM_PY, "-c", "import sys; print(sys.version_info[:2])"],
                         capture_output=True, text=True)
    return out.stdout.strip() == str(tuple(sys.version_info[:2]))


pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to an unprivileged user"),
    pytest.mark.skipif(not shutil.which("setpriv"), reason="needs setpriv (util-linux)"),
    pytest.mark.skipif(not _system_python_matches(), reason="system python differs from the test python"),
]


@pytest.fixture
def world_tmp():
    """A temp dir nobody can reach (pytest's tmp_path sits under a 0700 folder)."""
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="rockroll-unpriv-", dir="/tmp"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_sandbox_runs_in_a_user_namespace_as_nobody(world_tmp):
    tmp_path = world_tmp
    pkg = tmp_path / "pkg"
    (pkg / "rockroll").mkdir(parents=True)
    (pkg / "rockroll" / "__init__.py").write_text("")
    shutil.copytree(ROOT / "sandbox", pkg / "rockroll" / "sandbox",
                    ignore=shutil.ignore_patterns("__pycache__"))
    zdir = Path(zstandard.__file__).parent
    shutil.copytree(zdir, pkg / zdir.name)
    home = tmp_path / "home"
    home.mkdir()
    for p in (tmp_path, pkg, home):
        os.chmod(p, 0o777)
    subprocess.run(["chmod", "-R", "a+rX", str(pkg)], check=True)
    script = textwrap.dedent("""
        import os
        from rockroll.sandbox import open_sandbox, SandboxSpec
        assert os.geteuid() == 65534
        with open_sandbox(SandboxSpec()) as sb:
            r = sb.run('id -u; cat /proc/self/uid_map; echo hi > /workspace/x; rm /etc/hosts; ps -e | wc -l')
            print(r.stdout, end='')
            snap = sb.snapshot()
            sb.reset()
            assert sb.run('cat /etc/hosts').exit_code == 0
            sb.restore(snap)
            print(sb.run('cat /workspace/x; test -e /etc/hosts || echo gone').stdout, end='')
        # disk_mb without root: a tmpfs layer (no loop devices in a user namespace)
        with open_sandbox(SandboxSpec(disk_mb=16)) as sb:
            r = sb.run('head -c 64M /dev/zero > /workspace/big')
            print('full' if 'No space left on device' in r.stderr else 'not-full', r.exit_code != 0)
            print(sb.run('df -kP / | tail -1').stdout.split()[1])
            print(sb.run('rm /workspace/big; echo again > /workspace/y; cat /workspace/y').stdout, end='')
            snap = sb.snapshot()
            sb.restore(snap)
            print(sb.run('cat /workspace/y').stdout, end='')
        # network=True needs root (a veth and rules on the host): refused, never the host's network
        from rockroll.sandbox import IsolationUnavailable
        try:
            open_sandbox(SandboxSpec(network=True)).close()
            print('opened')
        except IsolationUnavailable as e:
            print('refused' if 'needs root' in str(e) else repr(e))
    """)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "PYTHONPATH": str(pkg),
           "ROCKROLL_HOME": str(home / "state")}
    out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", SYSTEM_PY, "-c", script],
                         capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    assert lines[0] == "0"  # root inside ...
    assert lines[1:4] == ["0", "65534", "1"]  # ... mapped to nobody outside
    assert int(lines[4]) < 10  # only the sandbox's own processes are visible
    assert lines[5:7] == ["hi", "gone"]
    assert lines[7:9] == ["full", "True"]  # ENOSPC at the limit ...
    assert int(lines[9]) == 16 * 1024  # ... which is the layer's size ...
    assert lines[10:12] == ["again", "again"]  # ... freed by rm; snapshots read the layer
    assert lines[12:] == ["refused"]

