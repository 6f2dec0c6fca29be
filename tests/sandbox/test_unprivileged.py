"""The local backend as an unprivileged user: user namespaces instead of root.

Runs a copy of the package as uid 65534 (nobody) with the system Python (``_nobody.py``).
"""

import os
import shutil
import subprocess
import textwrap

import pytest

from _nobody import AS_NOBODY, SYSTEM_PY, nobody_env, nobody_package, system_python_matches, world_tmp  # noqa: F401

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to an unprivileged user"),
    pytest.mark.skipif(not shutil.which("setpriv"), reason="needs setpriv (util-linux)"),
    pytest.mark.skipif(not system_python_matches(), reason="system python differs from the test python"),
]


def test_sandbox_runs_in_a_user_namespace_as_nobody(world_tmp):
    tmp_path = world_tmp
    nobody_package(tmp_path)
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
        # network=True without root (usernet.py): the suite's guard holds on this path too
        from rockroll.sandbox import SandboxStartError
        try:
            open_sandbox(SandboxSpec(network=True)).close()
            print('opened')
        except SandboxStartError as e:
            print('refused' if 'ROCKROLL_SANDBOX_NETWORK_GUARD' in str(e) else repr(e))
    """)
    env = nobody_env(tmp_path, ROCKROLL_SANDBOX_NETWORK_GUARD=os.environ["ROCKROLL_SANDBOX_NETWORK_GUARD"])
    out = subprocess.run([*AS_NOBODY, SYSTEM_PY, "-c", script],
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

